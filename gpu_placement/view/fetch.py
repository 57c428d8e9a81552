"""One-shot reads of a live cluster for `explain` and `nodes`: the kubeconfig kubectl would use, the
objects the view needs, and one pod by name. No watch: a command reads once and exits."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any
from urllib.parse import quote

import urllib3
from kubernetes import config as kube_config
from kubernetes.client import ApiClient

from gpu_placement.facts.dra import DRA_BY_KIND
from gpu_placement.kube import api as kube
from gpu_placement.kube.discovery import discover

__all__ = ["ClusterAccess", "FetchError", "connect", "fetch_labelled", "fetch_objects", "get_object"]

_LISTS = (("Namespace", "/api/v1/namespaces"), ("Node", "/api/v1/nodes"), ("Pod", "/api/v1/pods"))


class FetchError(Exception):
    """The cluster could not be read; the message says which call and why (`status`: the HTTP status
    the API server answered, None when it did not answer)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class ClusterAccess:
    def __init__(self, api: ApiClient, context: str, namespace: str) -> None:
        self.api = api
        self.context = context  # for messages: which cluster was asked
        self.namespace = namespace  # the context's namespace, as kubectl uses it when -n is not given
        self.unseen: list[str] = []  # what a 403 kept from view, one sentence each (a namespace-scoped user)
        self.namespaces_seen = True  # False: namespaces could not be listed; one missing from the view may exist


# Where a pod's service account namespace is (kubectl's in-cluster namespace); a test points it elsewhere.
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"


def connect(kubeconfig: str | None, context: str | None) -> ClusterAccess:
    """The kubeconfig kubectl would use: `--kubeconfig`, else the first file of `$KUBECONFIG`, else
    `~/.kube/config`; its current context unless `--context` names another. In a pod (KUBERNETES_SERVICE_HOST
    set) without --kubeconfig or a kubeconfig file, the pod's service account, as kubectl falls back to it."""
    from_env = next((p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p), None)
    path = kubeconfig or from_env or str(Path("~/.kube/config").expanduser())
    if not Path(path).expanduser().is_file():
        in_pod = bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
        if in_pod and not kubeconfig and not context:
            return ClusterAccess(kube.load_api_client(None), "in-cluster", _pod_namespace())
        raise kube.KubeConfigError(_no_kubeconfig(path, kubeconfig, from_env, in_pod))
    api = kube.load_api_client(path, context)
    try:
        contexts, current = kube_config.list_kube_config_contexts(config_file=str(Path(path).expanduser()))
    except Exception:  # already loaded once above: a second read failing is not worth more than a default
        contexts, current = [], None
    chosen = next((c for c in contexts if c.get("name") == context), None) if context else current
    chosen = chosen or {}
    namespace = (chosen.get("context") or {}).get("namespace") or "default"
    return ClusterAccess(api, str(chosen.get("name") or context or "?"), namespace)


def _no_kubeconfig(path: str, flag: str | None, from_env: str | None, in_pod: bool) -> str:
    """What to do when the kubeconfig kubectl would read is not there; the service account only in a pod."""
    if flag:
        return (f"kubeconfig {path} (--kubeconfig) does not exist or is not a file: pass --kubeconfig PATH to a "
                "readable kubeconfig" + (", or leave it out to use the pod's service account" if in_pod else ""))
    if from_env:
        return (f"kubeconfig {path} (from $KUBECONFIG) does not exist or is not a file: set KUBECONFIG, or pass "
                "--kubeconfig PATH, to a readable kubeconfig" + (
                    ", or leave out --context to use the pod's service account" if in_pod else ""))
    return (f"no kubeconfig: {path} does not exist and KUBECONFIG is not set: pass --kubeconfig PATH or set "
            "KUBECONFIG (kubectl reads the same)" + (", or leave out --context to use the pod's service account"
                                                     if in_pod else ""))


def _pod_namespace() -> str:
    try:
        return Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip() or "default"
    except OSError:
        return "default"


def _unreachable(access: ClusterAccess, exc: BaseException) -> str | None:
    """`cannot reach https://HOST:PORT (context x): connection refused` when the API server could not be
    connected to at all (refused, timed out, a name that does not resolve); None for other failures."""
    reason = getattr(exc, "reason", None) or exc  # urllib3's MaxRetryError carries the connection error
    if not isinstance(reason, urllib3.exceptions.NewConnectionError | urllib3.exceptions.ConnectTimeoutError):
        return None
    text = " ".join(str(reason).split())
    found = re.search(r"\[Errno -?\d+\] ([^'\")]+)", text)
    why = found.group(1).strip().rstrip(".").lower() if found else (
        "timed out" if isinstance(reason, urllib3.exceptions.ConnectTimeoutError) else text[:200])
    return f"cannot reach {access.api.configuration.host} (context {access.context}): {why}"


def fetch_objects(access: ClusterAccess, namespace: str | None = None, page_size: int = 500) -> list[dict[str, Any]]:
    """Every namespace, node and pod (and the DRA objects where resource.k8s.io is served), each with its
    `kind` set (list items carry none), paged as kubectl pages them. A user who may not list something
    cluster-wide (403: a developer bound to one namespace) gets what they may read instead: their own
    namespace and its pods (`namespace`, else the context's); each thing left out is a sentence in
    `access.unseen`, which explain prints, so the answer says what it could not see."""
    objects: list[dict[str, Any]] = []
    lists = list(_LISTS)
    own = namespace or access.namespace
    try:
        dra = discover(access.api)
    except kube.ApiForbidden as exc:
        dra = None
        access.unseen.append(f"resource.k8s.io discovery ({exc.message}): DRA devices and claims are left out")
    except kube.ApiError as exc:
        raise FetchError(f"discovery of resource.k8s.io (context {access.context}): {exc}") from None
    except urllib3.exceptions.HTTPError as exc:
        raise FetchError(_unreachable(access, exc) or f"discovery of resource.k8s.io (context {access.context}): "
                                                     f"{exc}") from None
    if dra is not None and dra.served:  # DRA: the devices per node and the claims, as the service's view reads them
        lists += [(kind, dra.path(plural)) for kind, plural in DRA_BY_KIND.items()]
    for kind, path in lists:
        try:
            objects += _list_all(access, kind, path, page_size)
        except FetchError as exc:
            if exc.status != 403:
                raise
            objects += _what_may_be_read(access, kind, own, str(exc), page_size)
    return objects


def _list_all(access: ClusterAccess, kind: str, path: str, page_size: int) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    token = ""
    while True:
        query: list[tuple[str, str | int | bool]] = [("limit", page_size)]
        if token:
            query.append(("continue", token))
        page = _get(access, path, query)
        for item in page.get("items") or ():
            item["kind"] = kind
            objects.append(item)
        token = (page.get("metadata") or {}).get("continue") or ""
        if not token:
            return objects


def _what_may_be_read(access: ClusterAccess, kind: str, namespace: str, refused: str,
                      page_size: int) -> list[dict[str, Any]]:
    """A cluster-wide list was forbidden: the namespace-scoped read that a RoleBinding can grant, and a
    sentence in `access.unseen` saying what is missing and what it changes in the answer."""
    why = refused.split("403 Forbidden: ", 1)[-1]  # the API server's own sentence, without our GET prefix
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}"
    if kind == "Namespace":
        access.namespaces_seen = False
        try:  # a RoleBinding granting get on namespaces covers the namespace itself (RBAC's rule for them)
            own = _get(access, path, [])
        except FetchError:
            access.unseen.append(f"namespaces ({why}), not even {namespace}: its gpu-placement.io/* policy and "
                                 "opt-in label are unknown, so the webhook's answer assumes none")
            return []
        access.unseen.append(f"namespaces other than {namespace} ({why})")
        return [{**own, "kind": "Namespace"}]
    if kind == "Pod":
        try:
            pods = _list_all(access, "Pod", f"{path}/pods", page_size)
        except FetchError as exc:
            access.unseen.append(f"pods ({exc}): the GPUs in use on each node are unknown, so every node looks free")
            return []
        access.unseen.append(f"pods outside namespace {namespace} ({why}): their GPUs are not counted as used, so "
                             "nodes may look freer than they are")
        return pods
    if kind == "Node":
        access.unseen.append(f"nodes ({why}): no node can be judged; ask the platform team for the "
                             "gpu-placement-explain ClusterRole (docs/explain.md, Permissions)")
        return []
    access.unseen.append(f"{kind} objects ({why}): left out of the answer")
    return []


def get_object(access: ClusterAccess, path: str, missing: str) -> dict[str, Any]:
    """One GET; FetchError with `missing` (status 404) when there is no such object."""
    return _get(access, path, [], missing=missing or None)


def fetch_labelled(access: ClusterAccess, path: str, selector: str, kind: str) -> list[dict[str, Any]]:
    """One list of the objects at `path` (e.g. /api/v1/configmaps) carrying these labels, `kind` set on each."""
    items = _get(access, path, [("labelSelector", selector)]).get("items") or []
    return [{**item, "kind": kind} for item in items if isinstance(item, dict)]


def _get(access: ClusterAccess, path: str, query: list[tuple[str, str | int | bool]],
         missing: str | None = None) -> dict[str, Any]:
    try:
        return dict(kube.get(access.api, path, query=query, timeout=kube.COMMAND_TIMEOUT))
    except urllib3.exceptions.HTTPError as exc:
        raise FetchError(_unreachable(access, exc) or f"GET {path} (context {access.context}): the API server did "
                         f"not answer: {' '.join(str(exc).split())[:200]}") from None
    except kube.ApiError as error:
        if missing and isinstance(error, kube.ApiNotFound):
            raise FetchError(missing, 404) from None
        raise FetchError(f"GET {path} (context {access.context}): {error}", error.status) from None
