"""Where `/bind` sends a binding: the API server, or (snapshot mode) the snapshot's own record."""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Protocol
from urllib.parse import quote

import aiohttp
import orjson
from kubernetes.client import ApiClient

from gpu_placement.facts.pods import pod_key
from gpu_placement.kube import api as kube
from gpu_placement.kube.aio import AsyncApi
from gpu_placement.observe import metrics
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.snapshot import SnapshotSource

__all__ = ["ApiBinder", "BindError", "Binder", "SnapshotBinder"]


class BindError(Exception):
    """The binding was refused; the message says by whom and why, for the extender's `Error`.

    `ambiguous`: the request went out and no answer came back (read timeout, connection cut), so the
    Binding may exist. The reservation is then kept until the watch shows the pod bound, deleted or
    the reservation expires: releasing it could let the next pod take memory this one holds."""

    def __init__(self, message: str, ambiguous: bool = False) -> None:
        super().__init__(message)
        self.ambiguous = ambiguous


class Binder(Protocol):
    """Called on the event loop that serves /bind; `aclose` when that loop's app shuts down."""

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None: ...

    async def aclose(self) -> None: ...


class SnapshotBinder:
    """Records the binding and shows the pod bound in the view, as the API server's watch would.

    A pod the snapshot does not hold (created after it was taken) is recorded too; its reservation
    then holds its GPUs until `reservationTTLSeconds`, since no watch will show it bound."""

    def __init__(self, view: ClusterView, source: SnapshotSource | None = None) -> None:
        self.view = view
        self.source = source

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
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

    async def aclose(self) -> None:
        pass


class ApiBinder:
    """Creates the pod's Binding through the API server, as kube-scheduler's own DefaultBinder does:
    `POST /api/v1/namespaces/{ns}/pods/{name}/binding`, with the pod's UID as a precondition so a pod
    deleted and recreated under the same name is not bound in its place.

    From the event loop, over a pool of at most `connections` kept-alive connections
    (gpu_placement/kube/aio.py): kube-scheduler binds asynchronously, so a burst of pods is a burst
    of binds, and each costs a coroutine, not a thread and a TLS handshake.

    The default timeout (`BIND_TIMEOUT`) keeps a failing bind inside kube-scheduler's 5 s extender
    `httpTimeout`, so the scheduler gets our sentence rather than its own timeout."""

    def __init__(self, api_client: ApiClient, timeout: tuple[float, float] = kube.BIND_TIMEOUT,
                 connections: int = 32) -> None:
        self.api = AsyncApi(api_client, connections)
        self.timeout = kube.Timeout(*timeout)

    async def bind(self, namespace: str, name: str, uid: str, node: str) -> None:
        meta: dict[str, str] = {"name": name, "namespace": namespace}
        if uid:
            meta["uid"] = uid
        body = orjson.dumps({"apiVersion": "v1", "kind": "Binding", "metadata": meta,
                             "target": {"apiVersion": "v1", "kind": "Node", "name": node}})
        path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}/binding"
        start = time.perf_counter()
        try:
            answer = await self.api.post(path, body, self.timeout)
            metrics.BIND_POST_SECONDS.observe(time.perf_counter() - start)
        except aiohttp.ConnectionTimeoutError:
            raise BindError(f"binding {namespace}/{name} to {node} failed: API server did not answer within "
                            f"{self.timeout.connect:g} s (connect timed out)") from None
        except aiohttp.ClientConnectorError as exc:  # refused, unreachable, TLS: nothing was sent
            raise BindError(f"binding {namespace}/{name} to {node} failed: API server did not answer within "
                            f"{self.timeout.connect:g} s ({_why(exc)})") from None
        except (TimeoutError, aiohttp.ClientError) as exc:  # sent: the Binding may exist
            raise BindError(f"binding {namespace}/{name} to {node} failed: API server did not answer within "
                            f"{self.timeout.read:g} s ({_why(exc)})", ambiguous=True) from None
        if 200 <= answer.status < 300:
            return
        error = kube.error_from(answer.status, answer.reason, answer.body, answer.retry_after)
        raise BindError(_bind_refusal(error, namespace, name, node))

    async def aclose(self) -> None:
        await self.api.aclose()


def _bind_refusal(error: kube.ApiError, namespace: str, name: str, node: str) -> str:
    if isinstance(error, kube.ApiNotFound):
        return f"pod {namespace}/{name} no longer exists (API server: {error.message})"
    if isinstance(error, kube.ApiConflict):
        return f"pod {namespace}/{name} cannot be bound to {node}: already bound, or replaced (UID changed): " \
               f"API server says: {error.message}"
    if isinstance(error, kube.ApiForbidden):
        return f"binding {namespace}/{name} to {node} is forbidden: grant the service account RBAC `create` on " \
               f"`pods/binding` (API group \"\"): API server says: {error.message}"
    status = f"HTTP {error.status} {error.reason}" if error.reason else f"HTTP {error.status}"
    return f"binding {namespace}/{name} to {node} refused: {status}: {error.message}"


def _why(exc: Exception) -> str:
    if isinstance(exc, aiohttp.ClientConnectorError) and exc.os_error.errno:
        text = os.strerror(exc.os_error.errno)  # "Connection refused", not "Connect call failed (...)"
    elif isinstance(exc, TimeoutError):
        text = "read timed out"
    else:
        text = str(exc) or type(exc).__name__
    return " ".join(text.split())[:200]
