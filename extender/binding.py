"""Where `/bind` sends a binding: the API server, or (snapshot mode) the snapshot's own record."""

from __future__ import annotations

from dataclasses import replace
from typing import Protocol
from urllib.parse import quote

import urllib3
from kubernetes.client import ApiClient

from gpu_placement import kube
from gpu_placement.pods import pod_key
from gpu_placement.snapshot import SnapshotSource
from gpu_placement.view import ClusterView

__all__ = ["ApiBinder", "BindError", "Binder", "SnapshotBinder"]


class BindError(Exception):
    """The binding was refused; the message says by whom and why, for the extender's `Error`."""


class Binder(Protocol):
    def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...


class SnapshotBinder:
    """Records the binding and shows the pod bound in the view, as the API server's watch would.

    A pod the snapshot does not hold (created after it was taken) is recorded too; its reservation
    then holds its GPUs until `reservationTTLSeconds`, since no watch will show it bound."""

    def __init__(self, view: ClusterView, source: SnapshotSource | None = None) -> None:
        self.view = view
        self.source = source

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        with self.view.lock:
            pod = self.view.pods.get(pod_key(namespace, name))
            if pod is not None and uid and pod.uid and uid != pod.uid:
                raise BindError(f"pod {namespace}/{name} has UID {pod.uid}, not {uid}: it was replaced")
            if pod is not None and pod.node and pod.node != node:
                raise BindError(f"pod {namespace}/{name} is already assigned to node {pod.node}")
            if self.source is not None:
                self.source.record_binding(namespace, name, node)
            if pod is None:
                return
            self.view.upsert_pod(replace(pod, node=node))


class ApiBinder:
    """Creates the pod's Binding through the API server, as kube-scheduler's own DefaultBinder does:
    `POST /api/v1/namespaces/{ns}/pods/{name}/binding`, with the pod's UID as a precondition so a pod
    deleted and recreated under the same name is not bound in its place.

    The default timeout keeps a failing bind inside kube-scheduler's 5 s extender `httpTimeout`, so
    the scheduler gets our sentence rather than its own timeout."""

    def __init__(self, api_client: ApiClient, timeout: tuple[float, float] = (2.0, 2.5)) -> None:
        self.api = api_client
        self.timeout = timeout

    def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        meta: dict[str, str] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/binding"
        try:
            response = kube.request(self.api, "POST", path, body=body, timeout=self.timeout)
            if 200 <= response.status < 300:
                response.read()
                response.release_conn()
                return
            error = kube.api_error(response)
        except (urllib3.exceptions.ConnectTimeoutError, urllib3.exceptions.NewConnectionError) as exc:
            raise BindError(f"binding {namespace}/{name} to {node} failed: API server did not answer within "
                            f"{self.timeout[0]:g} s ({_why(exc)})") from None
        except urllib3.exceptions.HTTPError as exc:
            within = self.timeout[1] if isinstance(exc, urllib3.exceptions.ReadTimeoutError) else self.timeout[0]
            raise BindError(f"binding {namespace}/{name} to {node} failed: API server did not answer within "
                            f"{within:g} s ({_why(exc)})") from None
        raise BindError(_bind_refusal(error, namespace, name, node))


def _bind_refusal(error: kube.ApiError, namespace: str, name: str, node: str) -> str:
    if error.status == 404:
        return f"pod {namespace}/{name} no longer exists (API server: {error.message})"
    if error.status == 409:
        return f"pod {namespace}/{name} cannot be bound to {node}: already bound, or replaced (UID changed): " \
               f"API server says: {error.message}"
    if error.status == 403:
        return f"binding {namespace}/{name} to {node} is forbidden: grant the service account RBAC `create` on " \
               f"`pods/binding` (API group \"\"): API server says: {error.message}"
    status = f"HTTP {error.status} {error.reason}" if error.reason else f"HTTP {error.status}"
    return f"binding {namespace}/{name} to {node} refused: {status}: {error.message}"


def _why(exc: Exception) -> str:
    reason = getattr(exc, "reason", None)
    return " ".join(str(reason if isinstance(reason, BaseException) else exc).split())[:200]
