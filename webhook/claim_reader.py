"""ResourceClaims and ResourceClaimTemplates the view has not seen yet, read from the API server.

`kubectl apply` of a ResourceClaimTemplate and the pod that names it, in one go: the API server has the
template before the pod's admission call, but its watch event may reach us after it. /mutate routes a
pod by the device classes its claims ask for (a GPU class: the gpu-placement scheduler, the extender's
node rules); with the template unknown the pod would keep its own scheduler, its GPUs guarded only by
DeviceTaintRules. So on a miss the webhook GETs what the pod names (short timeouts, since the API
server's call to us is waiting; at most `_PER_POD` objects a pod), keeps each answer `fresh_seconds`
(a failure `retry_seconds`), and the view's own record wins as soon as it has one. Concurrent misses
share one GET; the GETs run in worker threads, never on the event loop. Only pod CREATEs whose claims
the view lacks get here: the hot path costs a dict lookup per claim.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import quote

import orjson
import urllib3

from gpu_placement.facts.dra import Claim, claim_from_json, template_from_json
from gpu_placement.kube.api import REVIEW_TIMEOUT, ApiError, Timeout, get
from gpu_placement.observe.metrics import API_OUTCOMES, CLAIM_READS, api_outcome
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.dra import PodClaims

__all__ = ["ClaimReader"]

log = logging.getLogger("gpu_placement.webhook.claims")

_KINDS = {"resourceClaimName": ("ResourceClaim", "resourceclaims", claim_from_json),
          "resourceClaimTemplateName": ("ResourceClaimTemplate", "resourceclaimtemplates", template_from_json)}
_PER_POD = 8  # claims read for one pod at most: a pod with more unknown ones is told so, not read for
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", re.ASCII)
_DNS_SUBDOMAIN = re.compile(r"(?=.{1,253}$)[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII)

Ref = tuple[str, str, str]  # (field: resourceClaimName or resourceClaimTemplateName, namespace, name)


@dataclass(slots=True, frozen=True)
class _Read:
    record: Claim | None
    error: str  # why it could not be read; "" when record is set
    at: float


class ClaimReader:
    def __init__(self, view: ClusterView, api: Any, version: str, timeout: Timeout = REVIEW_TIMEOUT,
                 fresh_seconds: float = 30.0, retry_seconds: float = 1.0, limit: int = 10_000) -> None:
        """`version`: the resource.k8s.io version the API server serves claims and templates at."""
        self.view, self.api, self.version, self.timeout = view, api, version, timeout
        self.fresh_seconds, self.retry_seconds, self.limit = fresh_seconds, retry_seconds, limit
        self.reads = 0  # GETs made: for tests and the log
        self._read: dict[Ref, _Read] = {}
        self._inflight: dict[Ref, asyncio.Future[None]] = {}
        for outcome in API_OUTCOMES:
            CLAIM_READS.labels(outcome)

    def wanted(self, namespace: str, spec: Mapping[str, Any]) -> list[Ref]:
        """The claims and templates a pod names that the view lacks and no recent GET answered: read
        them before deciding. Empty in the common case (the view has them)."""
        if not self.view.dra.active or not _DNS_LABEL.fullmatch(namespace):
            return []
        wanted: list[Ref] = []
        for ref in _refs(namespace, spec):
            if self._known(ref) or not _DNS_SUBDOMAIN.fullmatch(ref[2]):
                continue
            got = self._read.get(ref)
            if got is None or time.monotonic() - got.at >= (self.retry_seconds if got.error else self.fresh_seconds):
                wanted.append(ref)
        return wanted[:_PER_POD]

    async def read(self, refs: list[Ref]) -> None:
        waits = []
        for ref in refs:
            pending = self._inflight.get(ref)
            if pending is None:
                pending = asyncio.ensure_future(asyncio.to_thread(self._get, ref))
                self._inflight[ref] = pending
                pending.add_done_callback(partial(self._done, ref))
            waits.append(asyncio.shield(pending))
        await asyncio.gather(*waits)

    def pod_claims(self, namespace: str, spec: Mapping[str, Any]) -> PodClaims:
        """DraState.pod_claims, with what the view lacks taken from the GETs; `missing` then says what
        is still unknown, and why."""
        dra = self.view.dra
        classes: set[str] = set()
        missing = None
        for ref in _refs(namespace, spec):
            found = self._record(ref)
            if isinstance(found, str):
                missing = missing or found
                continue
            classes.update(c for c in found.classes if c in dra.gpu_classes)
        return PodClaims(tuple(sorted(classes)), missing)

    def _known(self, ref: Ref) -> bool:
        table = self.view.dra.claims if ref[0] == "resourceClaimName" else self.view.dra.templates
        return f"{ref[1]}/{ref[2]}" in table

    def _record(self, ref: Ref) -> Claim | str:
        """The view's record, else a recent GET's; else a sentence: what is unknown, and why."""
        field, namespace, name = ref
        table = self.view.dra.claims if field == "resourceClaimName" else self.view.dra.templates
        record = table.get(f"{namespace}/{name}")
        if record is not None:
            return record
        what = f"{_KINDS[field][0]} {namespace}/{name}"
        got = self._read.get(ref)
        if got is None:
            return f"{what}, which is not in gpu-placement's view yet and was not read from the API server"
        if got.record is None:
            return f"{what}, which is not in gpu-placement's view yet and could not be read from the API server " \
                   f"({got.error})"
        return got.record

    def _done(self, ref: Ref, _: asyncio.Future[None]) -> None:
        self._inflight.pop(ref, None)

    def _get(self, ref: Ref) -> None:
        field, namespace, name = ref
        kind, plural, parse = _KINDS[field]
        self.reads += 1
        path = f"/apis/resource.k8s.io/{self.version}/namespaces/{quote(namespace, safe='')}/{plural}/" \
               f"{quote(name, safe='')}"
        try:
            obj = get(self.api, path, timeout=self.timeout)
            result = _Read(parse(obj), "", time.monotonic())
            CLAIM_READS.labels("ok").inc()
        except (ApiError, OSError, urllib3.exceptions.HTTPError, orjson.JSONDecodeError) as exc:
            result = _Read(None, _reason(exc, self.timeout), time.monotonic())
            CLAIM_READS.labels("refused" if isinstance(exc, orjson.JSONDecodeError) else api_outcome(exc)).inc()
            log.warning("%s %s/%s named by a pod is not in the view yet and could not be read: %s", kind, namespace,
                        name, result.error)
        if len(self._read) >= self.limit:
            self._read.clear()
        self._read[ref] = result


def _refs(namespace: str, spec: Mapping[str, Any]) -> list[Ref]:
    refs: list[Ref] = []
    for entry in spec.get("resourceClaims") or ():
        if not isinstance(entry, Mapping):
            continue
        for field in _KINDS:
            name = entry.get(field)
            if isinstance(name, str) and name:
                refs.append((field, namespace, name))
                break
    return refs


def _reason(exc: Exception, timeout: Timeout) -> str:
    if isinstance(exc, ApiError):
        return f"the API server answered {exc}"
    if isinstance(exc, urllib3.exceptions.NewConnectionError):  # a ConnectTimeoutError too: tested first
        return "the API server could not be reached (connection refused)"
    if isinstance(exc, urllib3.exceptions.TimeoutError):
        return f"the API server did not answer within {sum(timeout):g} s"
    return f"the API server could not be reached ({type(exc).__name__})"
