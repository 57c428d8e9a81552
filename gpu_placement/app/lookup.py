"""`KIND/NAME` on the command line: one object of the cluster (or of a snapshot), found as kubectl finds
it. `pod/x`, `deploy/x`, `sts/x`, `job/x`, `cronjob/x` and the other built-in kinds by their names and
short names; anything else (`pytorchjob/x`, `rayclusters.ray.io/x`) through API discovery, the way
kubectl's RESTMapper resolves a resource it does not know: the groups the API server lists
(`GET /apis`), then each group's preferred version's resources, matched by plural, singular, kind or
short name, `.group` narrowing the search.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from gpu_placement.base.errors import UsageError

__all__ = ["Kind", "find_in_cluster", "find_in_objects", "resolve_builtin"]


@dataclass(slots=True, frozen=True)
class Kind:
    kind: str
    plural: str
    group_version: str  # "v1", "apps/v1"
    namespaced: bool = True

    def path(self, namespace: str, name: str) -> str:
        root = "/api/v1" if self.group_version == "v1" else f"/apis/{self.group_version}"
        scope = f"/namespaces/{quote(namespace, safe='')}" if self.namespaced else ""
        return f"{root}{scope}/{self.plural}/{quote(name, safe='')}"


_BUILTIN = (
    (Kind("Pod", "pods", "v1"), ("po", "pod")),
    (Kind("Deployment", "deployments", "apps/v1"), ("deploy", "deployment")),
    (Kind("StatefulSet", "statefulsets", "apps/v1"), ("sts", "statefulset")),
    (Kind("DaemonSet", "daemonsets", "apps/v1"), ("ds", "daemonset")),
    (Kind("ReplicaSet", "replicasets", "apps/v1"), ("rs", "replicaset")),
    (Kind("Job", "jobs", "batch/v1"), ("job",)),
    (Kind("CronJob", "cronjobs", "batch/v1"), ("cj", "cronjob")),
    (Kind("ReplicationController", "replicationcontrollers", "v1"), ("rc", "replicationcontroller")),
    (Kind("PodTemplate", "podtemplates", "v1"), ("podtemplate",)),
)


def resolve_builtin(word: str) -> Kind | None:
    lowered = word.lower()
    for kind, names in _BUILTIN:
        if lowered in (kind.plural, kind.kind.lower(), *names) or lowered == f"{kind.plural}.{_group(kind)}":
            return kind
    return None


def _group(kind: Kind) -> str:
    return kind.group_version.rpartition("/")[0] or "core"


def find_in_objects(objects: list[dict[str, Any]], word: str, name: str, namespace: str,
                    where: str) -> dict[str, Any]:
    """The object `word/name` among a snapshot's objects (by kind, any spelling kubectl takes)."""
    builtin = resolve_builtin(word)
    wanted = word.lower().split(".", 1)[0]
    for obj in objects:
        meta = obj.get("metadata") or {}
        kind = str(obj.get("kind") or "")
        matches = kind == builtin.kind if builtin else wanted in (kind.lower(), kind.lower() + "s")
        if matches and meta.get("name") == name and (meta.get("namespace") or "default") in (namespace, ""):
            return obj
    kinds = sorted({str(o.get("kind")) for o in objects if o.get("kind")})
    raise UsageError(f"{word}/{name} is not in {where} (namespace {namespace}; it holds "
                     f"{', '.join(kinds) or 'nothing'})")


def find_in_cluster(access: Any, word: str, name: str, namespace: str) -> dict[str, Any]:
    """GET the object; its `kind` set. Raises UsageError for a kind the API server does not serve."""
    from gpu_placement.view.fetch import FetchError, get_object

    kind = resolve_builtin(word) or _discovered(access, word)
    try:
        obj = get_object(access, kind.path(namespace, name),
                         f"{kind.kind.lower()} {namespace}/{name} not found (context {access.context})")
    except FetchError as exc:
        if exc.status == 404:
            raise UsageError(str(exc)) from None
        raise
    obj.setdefault("kind", kind.kind)
    return obj


def _discovered(access: Any, word: str) -> Kind:
    from gpu_placement.view.fetch import FetchError, get_object

    resource, _, group_wanted = word.lower().partition(".")
    try:
        groups = get_object(access, "/apis", "").get("groups") or []
    except FetchError as exc:
        raise UsageError(f"{word}: not a built-in kind, and API discovery failed: {exc}") from None
    for group in groups:
        name = str(group.get("name") or "")
        if group_wanted and name != group_wanted:
            continue
        version = str((group.get("preferredVersion") or {}).get("groupVersion") or "")
        if not version:
            continue
        try:
            listed = get_object(access, f"/apis/{version}", "").get("resources") or []
        except FetchError:
            continue  # a broken aggregated API (metrics-server down) must not hide the others
        for entry in listed:
            if "/" in str(entry.get("name")):
                continue
            names = {str(entry.get("name")), str(entry.get("singularName")), str(entry.get("kind")).lower(),
                     *(str(s) for s in entry.get("shortNames") or ())}
            if resource in names:
                return Kind(str(entry.get("kind")), str(entry["name"]), version, bool(entry.get("namespaced")))
    raise UsageError(f"{word}: no file by that name, and no kind the API server serves is called {resource}; "
                     "write KIND/NAME (pod/x, deploy/x, job/x, pytorchjob/x, ...) or a path to a file")
