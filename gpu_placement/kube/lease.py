"""A `coordination.k8s.io/v1` Lease as a leader lock: whoever holds it (and keeps renewing) writes.

Used by the certificate manager (`<secret>-lock`), the ResourceQuota mirror and the DRA taint
controller, each with its own Lease, so they elect independently: each runs whatever the others do.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client import ApiClient

from gpu_placement.base.timestamps import parse_datetime
from gpu_placement.kube.api import OBJECT_TIMEOUT, ApiConflict, ApiError, drain, get, get_or_none, request, write

__all__ = ["Lease"]



class Lease:
    def __init__(self, api: ApiClient, namespace: str, name: str, identity: str, duration_seconds: int,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.api, self.namespace, self.name, self.identity = api, namespace, name, identity
        self.duration_seconds = duration_seconds
        self.clock = clock
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases"

    def acquire(self) -> bool:
        """Take or renew the Lease; True while we hold it. Raises ApiError when the API server refuses
        us; only a 409 (AlreadyExists to the create, Conflict to the update) is another replica winning
        a race, which is False. A Lease in a namespace that does not exist is NamespaceLifecycle's 404
        `namespaces "X" not found` (k8s.io/apiserver pkg/admission/plugin/namespace/lifecycle), and RBAC's
        is a 403: both raise, with the Lease named, so the loop says why it never leads."""
        try:
            return self._acquire()
        except ApiError as exc:  # the same error, the Lease named in its message
            raise ApiError.of(exc.status, exc.reason, f"Lease {self.namespace}/{self.name}: {exc.message}",
                              exc.retry_after, exc.causes) from None

    def _acquire(self) -> bool:
        now = self.clock()
        stamp = now.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        spec = {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration_seconds, "renewTime": stamp}
        lease = get_or_none(self.api, f"{self._path}/{self.name}", timeout=OBJECT_TIMEOUT)
        if lease is None:
            body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": self.name, "namespace": self.namespace},
                    "spec": {**spec, "acquireTime": stamp}}
            return write(self.api, "POST", self._path, body=body, timeout=OBJECT_TIMEOUT, settled=ApiConflict)
        held = lease.get("spec") or {}
        renewed = parse_datetime(held.get("renewTime"))
        expired = renewed is None or now - renewed > timedelta(seconds=held.get("leaseDurationSeconds") or 0)
        if held.get("holderIdentity") not in (None, "", self.identity) and not expired:
            return False
        lease["spec"] = {**held, **spec}
        if held.get("holderIdentity") != self.identity:
            lease["spec"]["acquireTime"] = stamp
        return write(self.api, "PUT", f"{self._path}/{self.name}", body=lease, timeout=OBJECT_TIMEOUT,
                     settled=ApiConflict)

    def release(self) -> None:
        """Give the Lease up (on a clean stop), so another replica takes it at its next try instead of
        after `duration_seconds`: what client-go's ReleaseOnCancel does. Best effort."""
        try:
            lease: dict[str, Any] = get(self.api, f"{self._path}/{self.name}", timeout=OBJECT_TIMEOUT)
        except ApiError:
            return
        spec = lease.get("spec") or {}
        if spec.get("holderIdentity") != self.identity:
            return
        lease["spec"] = {**spec, "holderIdentity": "", "leaseDurationSeconds": 1}
        drain(request(self.api, "PUT", f"{self._path}/{self.name}", body=lease, timeout=OBJECT_TIMEOUT))

