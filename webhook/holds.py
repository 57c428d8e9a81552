"""Settling quota holds that are overdue: a list of the namespace's pods, made after the hold's time
was up, says whether the pod came (keep holding until the view shows it) or will not (drop it).

A thread, off the request path: it wakes every `interval` seconds, and lists only namespaces that
have an overdue hold, each at most every `recheck` seconds (a stalled watch leaves holds overdue
until it is restarted), and at most `lists_per_second` namespaces a second in all (a burst of
`burst`): holds come from /validate, which anyone who reaches the webhook port can call, so forged
reviews across every quota namespace must not turn into a stream of lists. The list asks for metadata
only (PartialObjectMetadataList): names and uids are all it needs. A list that fails settles nothing:
the holds stay, and the namespace stays full rather than open.
"""

from __future__ import annotations

import logging
from typing import Any
from urllib.parse import quote

import orjson
import urllib3
from kubernetes.client import ApiClient

from gpu_placement.facts.pods import pod_key
from gpu_placement.kube.api import LIST_TIMEOUT, ApiError, api_error, request
from gpu_placement.kube.leader import Worker, counted
from gpu_placement.observe.metrics import API_OUTCOMES, QUOTA_HOLD_LISTS
from webhook.quota import Reservations

__all__ = ["HoldChecker"]

log = logging.getLogger("gpu_placement.webhook.holds")

_ACCEPT = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"


class HoldChecker(Worker):
    what = "quota holds"
    crashed = "settling %s failed"
    log = log

    def __init__(self, reservations: Reservations, api: ApiClient, interval: float = 1.0,
                 recheck: float = 5.0, page_size: int = 500, lists_per_second: float = 5.0, burst: int = 10) -> None:
        super().__init__()
        self.reservations = reservations
        self.view = reservations.view
        self.api = api
        self.interval, self.recheck, self.page_size = interval, recheck, page_size
        self.lists_per_second, self.burst = lists_per_second, burst
        self._tokens, self._filled = float(burst), reservations.view.clock()
        self.lists = 0  # for tests and the log
        self.dropped = 0
        self._next: dict[str, float] = {}  # namespace -> earliest next list
        self._last_error: str | None = None
        for outcome in API_OUTCOMES:
            QUOTA_HOLD_LISTS.labels(outcome)

    def step(self) -> None:
        self.check()

    def _pause(self) -> None:
        self._stop.wait(self.interval)

    def check(self) -> int:
        """One pass; returns how many holds were dropped."""
        now = self.view.clock()
        with self.view.lock:
            namespaces = [ns for ns in self.reservations.overdue(now) if self._next.get(ns, 0.0) <= now]
        for ns in list(self._next):
            if self._next[ns] <= now:
                del self._next[ns]
        dropped = 0
        for ns in namespaces:
            if not self._take():
                break  # the rest on a later pass, oldest-listed first as they come
            started = self.view.clock()
            try:
                with counted(QUOTA_HOLD_LISTS):
                    present = self._pods(ns)
            except (ApiError, OSError, urllib3.exceptions.HTTPError) as exc:
                if str(exc) != self._last_error:
                    log.warning("cannot list the pods of namespace %s to settle its quota holds (%s); they stay "
                                "held until a list succeeds", ns, exc)
                self._last_error = str(exc)
                continue
            self._last_error = None
            self.lists += 1
            with self.view.lock:
                gone = self.reservations.settle(ns, started, present)
            if gone:
                log.info("namespace %s: %d quota hold(s) dropped: admitted, but not created (refused after "
                         "this webhook)", ns, gone)
            dropped += gone
            self._next[ns] = started + self.recheck
        self.dropped += dropped
        return dropped

    def _take(self) -> bool:
        """One list from the budget (a token bucket refilled at `lists_per_second`)."""
        now = self.view.clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._filled) * self.lists_per_second)
        self._filled = now
        if self._tokens < 1.0:
            return False
        self._tokens -= 1.0
        return True

    def _pods(self, namespace: str) -> dict[str, str]:
        """key -> uid of every pod in the namespace, from a consistent list (all pages)."""
        present: dict[str, str] = {}
        token = ""
        while True:
            query: list[tuple[str, str | int | bool]] = [("limit", self.page_size)]
            if token:
                query.append(("continue", token))
            response = request(self.api, "GET", f"/api/v1/namespaces/{quote(namespace, safe='')}/pods", query=query,
                               timeout=LIST_TIMEOUT, accept=_ACCEPT)
            if response.status >= 300:
                raise api_error(response)
            page: dict[str, Any] = orjson.loads(response.read())
            response.release_conn()
            for item in page.get("items") or ():
                meta = item.get("metadata") or {}
                present[pod_key(namespace, str(meta.get("name") or ""))] = str(meta.get("uid") or "")
            token = (page.get("metadata") or {}).get("continue") or ""
            if not token:
                return present
