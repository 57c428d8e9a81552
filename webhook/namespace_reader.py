"""A namespace the view has not seen yet, read from the API server.

`kubectl apply` of a Namespace and a Deployment in one go: the API server created the namespace
first, but its watch event may reach us after the pod's admission call. Then the pod would get no
policy at all (unshaped, outside its pools and quota). So on a miss the webhook GETs the namespace
(short timeouts: the API server's call to us is waiting), keeps it `fresh_seconds`, and the view's own
record wins as soon as it has one. Concurrent misses for one namespace share one GET; a failed GET is
tried again after `retry_seconds`. The GET runs in a worker thread, never on the event loop.

The webhook port is reachable from every pod, so the namespace of a review may be anything a caller
writes (webhook/review.py refuses what is not a namespace name). The API server itself never sends a
review naming a namespace that does not exist: its NamespaceLifecycle admission plugin refuses the
create first (apiserver v0.37.2, pkg/admission/plugin/namespace/lifecycle/admission.go, `Admit`:
lister, then a live GET, then NotFound). So a 404 is kept `missing_seconds` (a forged name is not
asked about again and again), and GETs of names the view lacks are limited to `reads_per_second`
(a burst of `burst`): past it a pod is refused retriably (503) without a GET, and the refusal says why.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

import orjson
import urllib3

from gpu_placement.facts.namespaces import NamespaceRecord, namespace_from_json
from gpu_placement.kube.api import REVIEW_TIMEOUT, ApiError, ApiNotFound, Timeout, get
from gpu_placement.observe.metrics import API_OUTCOMES, NAMESPACE_READS, api_outcome
from gpu_placement.view.cluster import ClusterView

__all__ = ["NamespaceReader"]

log = logging.getLogger("gpu_placement.webhook.namespaces")


@dataclass(slots=True, frozen=True)
class _Read:
    record: NamespaceRecord | None
    error: str  # why it could not be read; "" when record is set
    at: float
    missing: bool = False  # the API server answered 404: kept longer than other failures


class NamespaceReader:
    def __init__(self, view: ClusterView, api: Any, timeout: Timeout = REVIEW_TIMEOUT,
                 fresh_seconds: float = 30.0, retry_seconds: float = 1.0, limit: int = 10_000,
                 missing_seconds: float = 10.0, reads_per_second: float = 10.0, burst: int = 20) -> None:
        self.view, self.api, self.timeout = view, api, timeout
        self.fresh_seconds, self.retry_seconds, self.limit = fresh_seconds, retry_seconds, limit
        self.missing_seconds, self.reads_per_second, self.burst = missing_seconds, reads_per_second, burst
        self.reads = 0  # GETs made: for tests and the log
        self._read: dict[str, _Read] = {}
        self._inflight: dict[str, asyncio.Future[None]] = {}
        self._tokens, self._filled = float(burst), time.monotonic()  # the token bucket of GETs
        self._limited = 0  # reads refused for the rate: logged at the first and every 1,000th
        for outcome in (*API_OUTCOMES, "limited"):
            NAMESPACE_READS.labels(outcome)

    def wanted(self, namespace: str) -> bool:
        """Should a GET be made before deciding about a pod in this namespace? One dict lookup when the
        view has it."""
        if not namespace or namespace in self.view.namespaces:
            return False
        got = self._read.get(namespace)
        return got is None or time.monotonic() - got.at >= self._kept(got)

    def _kept(self, got: _Read) -> float:
        return self.fresh_seconds if not got.error else self.missing_seconds if got.missing else self.retry_seconds

    async def read(self, namespace: str) -> None:
        pending = self._inflight.get(namespace)
        if pending is None:
            if not self._take_token():
                self._refuse(namespace)
                return
            pending = asyncio.ensure_future(asyncio.to_thread(self._get, namespace))
            self._inflight[namespace] = pending
            pending.add_done_callback(lambda _: self._inflight.pop(namespace, None))
        await asyncio.shield(pending)

    def record(self, namespace: str) -> tuple[NamespaceRecord | None, str | None]:
        """(the namespace's record, None) from the view or a recent GET; (None, why) when the view does
        not have it and the GET failed or was not made."""
        record = self.view.namespaces.get(namespace)
        if record is not None:
            return record, None
        got = self._read.get(namespace)
        if got is None:
            return None, "it was not read from the API server"
        if got.record is None:
            return None, got.error
        return got.record, None

    def _take_token(self) -> bool:
        """One GET's worth from the bucket (on the event loop: no lock needed)."""
        now = time.monotonic()
        self._tokens = min(float(self.burst), self._tokens + (now - self._filled) * self.reads_per_second)
        self._filled = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True

    def _refuse(self, namespace: str) -> None:
        """Past the rate of reads: no GET; the pod is refused retriably with this reason."""
        self._store(namespace, _Read(None, f"not asked: reviews named namespaces it lacks faster than it reads them "
                                           f"({self.burst} at once, then {self.reads_per_second:g} a second), which "
                                           "only reviews the API server did not send do", time.monotonic()))
        NAMESPACE_READS.labels("limited").inc()
        self._limited += 1
        if self._limited == 1 or self._limited % 1000 == 0:
            log.warning("namespace %s is not in the view and was not read: %d reviews named namespaces the view lacks "
                        "faster than %g a second (not what the API server sends: check who posts to the webhook)",
                        namespace, self._limited, self.reads_per_second)

    def _store(self, namespace: str, result: _Read) -> None:
        if len(self._read) >= self.limit:
            self._read.clear()
        self._read[namespace] = result

    def _get(self, namespace: str) -> None:
        self.reads += 1
        try:
            obj = get(self.api, f"/api/v1/namespaces/{quote(namespace, safe='')}", timeout=self.timeout)
            result = _Read(namespace_from_json(obj), "", time.monotonic())
            NAMESPACE_READS.labels("ok").inc()
        except (ApiError, OSError, urllib3.exceptions.HTTPError, orjson.JSONDecodeError) as exc:
            missing = isinstance(exc, ApiNotFound)
            result = _Read(None, _reason(exc, self.timeout), time.monotonic(), missing)
            NAMESPACE_READS.labels("refused" if isinstance(exc, orjson.JSONDecodeError) else api_outcome(exc)).inc()
            log.warning("namespace %s is not in the view yet and could not be read: %s", namespace, result.error)
        self._store(namespace, result)


def _reason(exc: Exception, timeout: Timeout) -> str:
    if isinstance(exc, ApiError):
        return f"the API server answered {exc}"
    if isinstance(exc, urllib3.exceptions.TimeoutError):
        return f"the API server did not answer within {sum(timeout):g} s"
    return f"the API server could not be reached ({type(exc).__name__})"
