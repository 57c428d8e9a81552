"""The ResourceClaimTemplates of `dra` namespaces, kept by the service so that admission writes nothing.

For every namespace whose GPUs are claimed through DRA (gpu-placement.io/allocation: dra, or the
configuration's `dra.allocation`), one template per sharing level a pod there may be given
(gpu_placement/decide/claims.py `levels_for`: the namespace's level, `shared`, and the MIG profiles the
cluster's devices publish within it), labelled `app.kubernetes.io/managed-by: gpu-placement` and
owned by the Namespace (deleted with it). A template's spec is immutable and its name carries the
spec's digest, so a changed policy creates new templates and deletes the old ones; a namespace moved
back to `device-plugin` loses them. An old template stays while a pod of the namespace that is not done
names it and its claim from it is not made yet (`ClusterView.template_waiters`: kube-controller-manager
makes claims from the template when it can, after a quota refusal too), and goes once none waits: the
mirror takes the namespace again on its pods' events. Templates without our label are never touched.

It runs inside the quota mirror's loop (gpu_placement/controllers/quota_mirror.py): the same Lease, the same namespace
events, the same periodic full pass (which also picks up MIG profiles published since). Each template is
its own unit of work: a refused create or delete is logged, kept in `failures` (the mirror retries its
namespace on the next turn and counts it in gpu_placement_quota_mirror_failing_objects), and the
others go on. A namespace being deleted gets nothing new (NamespaceLifecycle's 403 is settled).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import orjson
from kubernetes.client import ApiClient

from gpu_placement.base.config import Config
from gpu_placement.decide.claims import MANAGED_BY, Template, wanted_templates
from gpu_placement.facts.policy import NamespacePolicy
from gpu_placement.kube.api import OBJECT_TIMEOUT, ApiConflict, ApiError, ApiNotFound, api_error, request, write
from gpu_placement.kube.leader import Failures, namespace_terminating
from gpu_placement.view.cluster import ClusterView

__all__ = ["TemplateKeeper"]

log = logging.getLogger("gpu_placement.dra_templates")

_SELECTOR = f"{MANAGED_BY[0]}={MANAGED_BY[1]}"


class TemplateKeeper:
    """Creates and deletes our templates in one namespace at a time; the quota mirror calls it."""

    def __init__(self, api: ApiClient, view: ClusterView, config: Config, version: str) -> None:
        self.api, self.view, self.config, self.version = api, view, config, version
        self.writes = 0
        self.failures = Failures("dra templates", log)  # by namespace/name (namespace/* for its list)
        self.kept: dict[str, int] = {}  # namespace/name of old templates kept -> pods waiting on them
        self.kept_namespaces: frozenset[str] = frozenset()  # read by the mirror's pod listener (view lock)

    def reconcile(self, name: str, policy: NamespacePolicy | None, uid: str,
                  current: dict[str, dict[str, Any]] | None = None) -> None:
        """Make namespace `name`'s templates what its policy asks (None, or not `dra`: none). `current`:
        ours there, as listed (None: list them, unless the view shows none to delete)."""
        if policy is not None and not policy.shapes_ok:
            return  # its annotations do not parse: leave what is there (/validate refuses its GPU pods)
        wanted: dict[str, Template] = {}
        if policy is not None and policy.mode(self.config) == "dra":
            with self.view.lock:
                profiles, shares = self.view.dra.mig_profiles(), self.view.dra.shares_memory()
            wanted = {t.name: t for t in wanted_templates(policy, profiles, self.config, shares)}
        tried: set[str] = set()
        if current is None:
            if not wanted and not self._any_in_view(name):
                self.leave(name)
                return  # the common namespace event: nothing of ours there, nothing wanted
            tried.add(f"{name}/*")
            with self.failures.unit(f"{name}/*"):
                current = self._list(name)
            if current is None:
                return  # the list was refused: kept in failures, tried again next turn
        for template in wanted.values():
            if template.name not in current:
                tried.add(f"{name}/{template.name}")
                with self.failures.unit(f"{name}/{template.name}"):
                    self._create(template, uid)
        kept = set()
        for stale, obj in current.items():
            if stale in wanted:
                continue
            if self._waited_on(name, stale):
                kept.add(f"{name}/{stale}")
                continue
            tried.add(f"{name}/{stale}")
            with self.failures.unit(f"{name}/{stale}"):
                self._delete(name, stale, obj)
        self.failures.forget(key for key in list(self.failures.errors)
                             if key.startswith(f"{name}/") and key not in tried)  # wanted no more, or written
        self._keep(name, kept)

    def resync(self, policies: Mapping[str, tuple[NamespacePolicy | None, str]],
               between: Callable[[], None] = lambda: None) -> None:
        """Every namespace in `policies` (name -> its policy and uid) and every one holding a template of
        ours, with one list call; `between` runs before each namespace (the Lease's renewal)."""
        owned: dict[str, dict[str, dict[str, Any]]] = {}
        for item in self._list(None).values():
            meta = item.get("metadata") or {}
            owned.setdefault(str(meta.get("namespace")), {})[str(meta.get("name"))] = item
        names = set(policies) | set(owned)
        self.failures.forget(key for key in list(self.failures.errors) if key.split("/", 1)[0] not in names)
        for name in sorted(names):
            between()
            policy, uid = policies.get(name, (None, ""))
            if policy is None and name in self.view.namespaces:
                continue  # its annotations do not parse, or it is being deleted: leave what is there
            self.reconcile(name, policy, uid, owned.get(name, {}))

    def leave(self, name: str) -> None:
        """Nothing is to be written in namespace `name` now (being deleted, or nothing of ours there)."""
        self.failures.forget(key for key in list(self.failures.errors) if key.startswith(f"{name}/"))
        self._keep(name, set())

    def _waited_on(self, namespace: str, template: str) -> bool:
        """Whether a pod not done still waits for a claim from this template (and, if so, say it once)."""
        with self.view.lock:
            waiters = sorted(self.view.template_waiters.get(f"{namespace}/{template}", ()))
        key = f"{namespace}/{template}"
        if waiters and self.kept.get(key) != len(waiters):
            log.info("dra templates: kept ResourceClaimTemplate %s, no longer the namespace's policy, while %d pod(s) "
                     "wait for their claims from it (%s); deleted once none does", key, len(waiters),
                     ", ".join(waiters[:3]) + (", ..." if len(waiters) > 3 else ""))
            self.kept[key] = len(waiters)
        return bool(waiters)

    def _keep(self, namespace: str, kept: set[str]) -> None:
        for key in [k for k in self.kept if k.startswith(f"{namespace}/") and k not in kept]:
            del self.kept[key]
        self.kept_namespaces = frozenset(k.split("/", 1)[0] for k in self.kept)

    def _any_in_view(self, namespace: str) -> bool:
        prefix = namespace + "/"
        with self.view.lock:
            return any(key.startswith(prefix) and t.digest for key, t in self.view.dra.templates.items())

    # -- HTTP ----------------------------------------------------------------------------------
    def _path(self, namespace: str | None, name: str | None = None) -> str:
        where = f"namespaces/{namespace}/" if namespace else ""
        return f"/apis/resource.k8s.io/{self.version}/{where}resourceclaimtemplates" + (f"/{name}" if name else "")

    def _list(self, namespace: str | None) -> dict[str, dict[str, Any]]:
        """Ours in `namespace` by name (None: in every namespace, by namespace/name)."""
        response = request(self.api, "GET", self._path(namespace), query=[("labelSelector", _SELECTOR)],
                           timeout=OBJECT_TIMEOUT)
        if response.status >= 300:
            raise api_error(response)
        items = orjson.loads(response.read()).get("items") or []
        key = "{namespace}/{name}" if namespace is None else "{name}"
        return {key.format(namespace=(item.get("metadata") or {}).get("namespace"),
                           name=(item.get("metadata") or {}).get("name")): item for item in items}

    def _create(self, template: Template, uid: str) -> None:
        body = template.body(self.config.dra.driver, self.version)
        if uid:
            body["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "Namespace",
                                                    "name": template.namespace, "uid": uid}]
        try:  # 409: made by a pass whose answer we did not see, what was wanted
            if not write(self.api, "POST", self._path(template.namespace), body=body, timeout=OBJECT_TIMEOUT,
                         settled=ApiConflict):
                return
        except ApiError as exc:
            if not namespace_terminating(exc):
                raise
            log.info("dra templates: namespace %s is being deleted, so no ResourceClaimTemplate is written there",
                     template.namespace)
            return
        self.writes += 1
        log.info("dra templates: created ResourceClaimTemplate %s/%s (%s)", template.namespace, template.name,
                 template.level.text)

    def _delete(self, namespace: str, name: str, obj: Mapping[str, Any]) -> None:
        meta = obj.get("metadata") or {}
        options = {"kind": "DeleteOptions", "apiVersion": "v1", "preconditions": {"uid": meta.get("uid")}}
        if not write(self.api, "DELETE", self._path(namespace, name), body=options, timeout=OBJECT_TIMEOUT,
                     settled=ApiNotFound):
            return
        self.writes += 1
        log.info("dra templates: deleted ResourceClaimTemplate %s/%s (no longer the namespace's policy)",
                 namespace, name)
