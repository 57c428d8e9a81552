"""List+watch of namespaces, nodes and pods into the cluster view (docs/live.md).

One daemon thread per kind runs the reflector loop client-go runs, written out because the
`kubernetes` client's own `Watch` helper cannot be used (KeyError on ERROR events, a frozen
resourceVersion, no reconnect with `timeout_seconds`, 410s retried from the same version):

    list (paged: limit/continue) -> ingest.relist: nothing changes until the last page is in
    watch from the list's resourceVersion (allowWatchBookmarks, timeoutSeconds)
      stream ended by the server, or cut      -> watch again from the last version seen
      410 Gone (ERROR event or HTTP status)   -> list again
      no answer, 5xx, 429                     -> back off (capped, jittered, Retry-After), then
                                                 resume; the view keeps serving what it has

The client only configures, authenticates and makes the HTTP call; bytes are parsed with orjson
and go straight into `Ingest`, so no generated model and no raw dict outlives its event.
"""

from __future__ import annotations

import gc
import logging
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import orjson
import urllib3
from kubernetes.client import ApiClient

from gpu_placement.facts.resourcequotas import MIRROR_NAME
from gpu_placement.kube.api import ApiError, ApiForbidden, ApiGone, Timeout, WatchSettings, api_error, request
from gpu_placement.observe import metrics
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import KINDS, Ingest

__all__ = ["LiveSource"]

log = logging.getLogger("gpu_placement.live")

_PATHS = {"namespaces": "/api/v1/namespaces", "nodes": "/api/v1/nodes", "pods": "/api/v1/pods",
          "poddisruptionbudgets": "/apis/policy/v1/poddisruptionbudgets", "resourcequotas": "/api/v1/resourcequotas"}
# The webhook may read only the ResourceQuota the quota mirror owns (its RBAC names it): a list or watch
# by that name is authorized as a request for it.
_SELECTORS = {"resourcequotas": f"metadata.name={MIRROR_NAME}"}
_CHANGES = frozenset({"ADDED", "MODIFIED", "DELETED"})
_EVENT_TYPES = ("ADDED", "MODIFIED", "DELETED", "BOOKMARK")
_READ_SIZE = 65536  # for a stream that is not chunked: read what has arrived, up to this much
_STEADY_SECONDS = 1.0  # a watch open this long counts as progress, even with nothing to say
_CONNECTION_PREFIX = re.compile(r"^<?\w*Connection(Pool)?\(host=[^)]*\)>?: ")


class _Stopped(Exception):
    """`stop()` was called: unwind the thread."""


@dataclass(slots=True)
class _Restart(Exception):
    """Why a list or watch ended, and what to do next."""

    cause: str  # the WATCH_RESTARTS label: gone, cut, stalled, closed, unavailable, throttled, refused, error
    message: str
    relist: bool = False  # the version is gone: list again
    failed: bool = False  # the API server did not serve us: back off, report SOURCE_UP 0
    retry_after: float | None = None


@dataclass(slots=True)
class _Kind:
    """One kind's reflector state; touched only by its own thread (and read by `readiness`)."""

    kind: str
    path: str
    selector: str | None = None  # fieldSelector of its list and watch
    version: str | None = None  # resume point; None: list first
    healthy: bool = False  # the API server answered our last request for this kind
    progressed: bool = False  # something arrived since the last restart
    failures: int = 0  # consecutive restarts without progress: the backoff exponent
    failing_since: float | None = None
    error: str | None = None
    counters: dict[str, Any] = field(default_factory=dict)  # event type -> WATCH_EVENTS child


class LiveSource:
    """Feeds `view` from the API server behind `api_client`. `start()` once, `stop()` once."""

    def __init__(self, view: ClusterView, ingest: Ingest, api_client: ApiClient,
                 settings: WatchSettings | None = None, kinds: tuple[str, ...] = KINDS,
                 paths: Mapping[str, str] | None = None, selectors: Mapping[str, str] | None = None) -> None:
        """`paths`, `selectors`: where kinds beyond the core three are served (the DRA kinds, found by
        discovery), and a fieldSelector per kind."""
        self.view = view
        self.ingest = ingest
        self.api = api_client
        self.settings = settings or WatchSettings()
        self.kinds = kinds
        every = {**_PATHS, **(paths or {})}
        chosen = {**_SELECTORS, **(selectors or {})}
        self._states = {kind: _Kind(kind, every[kind], chosen.get(kind), counters={
            t: metrics.WATCH_EVENTS.labels(kind, t) for t in _EVENT_TYPES}) for kind in kinds}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._open: dict[str, urllib3.BaseHTTPResponse] = {}
        self._open_lock = threading.Lock()
        self._freeze_lock = threading.Lock()
        self._frozen = False
        self._random = random.Random()

    # -- lifecycle -----------------------------------------------------------------------------
    def start(self) -> None:
        if self._threads:
            raise RuntimeError("LiveSource.start() called twice")
        metrics.SOURCE_UP.set(0)  # nothing heard yet
        for kind in self.kinds:
            thread = threading.Thread(target=self._run, args=(self._states[kind],), name=f"watch-{kind}", daemon=True)
            self._threads.append(thread)
            thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ends every thread: a blocked stream read is woken by shutting its socket down. A request
        still waiting for the server's first byte ends at its own timeout (the threads are daemons)."""
        self._stop.set()
        with self._open_lock:
            for response in self._open.values():
                _shutdown(response)
        deadline = time.monotonic() + timeout
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
            if thread.is_alive():
                log.warning("%s did not stop within %.1f s: a request is still waiting for the API server",
                            thread.name, timeout)

    # -- state ---------------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        return all(kind in self.view.listed for kind in self.kinds)

    def readiness(self) -> tuple[bool, str]:
        """For /readyz: true once every kind's first full list is in, and from then on (a dead API
        server leaves the last view serving; SOURCE_UP and the cache age say so)."""
        missing = [kind for kind in self.kinds if kind not in self.view.listed]
        if not missing:
            return True, ""
        reason = f"waiting for the first full list of {', '.join(missing)}"
        error = self.last_error
        return False, f"{reason} ({error})" if error else reason

    @property
    def last_error(self) -> str | None:
        """The most recent failure of a kind that has not recovered yet; None while all are served."""
        errors = [(state.failing_since or 0.0, state.error) for state in self._states.values() if state.error]
        return max(errors)[1] if errors else None

    @property
    def resource_versions(self) -> dict[str, str | None]:
        """Where each kind would resume from (None: it lists next)."""
        return {kind: state.version for kind, state in self._states.items()}

    # -- the loop ------------------------------------------------------------------------------
    def _run(self, state: _Kind) -> None:
        while not self._stop.is_set():
            try:
                if state.version is None:
                    self._list(state)
                self._watch(state)
            except _Stopped:
                return
            except _Restart as restart:
                if self._stop.is_set():
                    return
                self._stop.wait(self._restarted(state, restart))
            except Exception as exc:  # a bug, not the network: keep the view, say so, try again later
                if self._stop.is_set():
                    return
                log.exception("%s watch failed unexpectedly; retrying", state.kind)
                self._stop.wait(self._restarted(state, _Restart("error", f"{type(exc).__name__}: {exc}",
                                                                failed=True, relist=True)))

    def _restarted(self, state: _Kind, restart: _Restart) -> float:
        """Count and log the restart once, mark the kind's health, and return how long to wait."""
        metrics.WATCH_RESTARTS.labels(state.kind, restart.cause).inc()
        if restart.relist:
            state.version = None
        if state.progressed and not restart.failed:
            state.failures = 0
        else:
            state.failures = 1 if state.progressed else state.failures + 1
        state.progressed = False
        delay = 0.0 if state.failures == 0 else self.settings.backoff(state.failures, self._random.random())
        if restart.retry_after is not None:
            delay = max(delay, min(restart.retry_after, self.settings.backoff_max))
        if restart.failed:
            self._down(state, restart, delay)
        elif restart.cause == "closed":
            log.debug("%s watch ended by the server; resuming from resourceVersion %s", state.kind, state.version)
        elif restart.relist:
            log.info("%s: %s; listing again", state.kind, restart.message)
        else:
            log.info("%s watch %s (%s); resuming from resourceVersion %s", state.kind, restart.cause,
                     restart.message, state.version)
        return delay

    def _down(self, state: _Kind, restart: _Restart, delay: float) -> None:
        state.error = f"{state.kind}: {restart.message}"
        if state.healthy or state.failing_since is None:
            state.failing_since = time.monotonic()
            log.warning("%s: %s; retrying with backoff, the view keeps serving what it has (next try in %.1f s)",
                        state.kind, restart.message, delay)
        else:  # the same outage again: the first line said it all
            log.debug("%s: still failing (%s), attempt %d, next try in %.1f s", state.kind, restart.message,
                      state.failures, delay)
        state.healthy = False
        metrics.SOURCE_UP.set(0)

    def _up(self, state: _Kind) -> None:
        if state.healthy:
            return
        state.healthy = True
        state.error = None
        if state.failing_since is not None:
            log.info("%s: the API server answers again after %.1f s", state.kind,
                     time.monotonic() - state.failing_since)
            state.failing_since = None
        if all(s.healthy for s in self._states.values()):
            metrics.SOURCE_UP.set(1)

    # -- list ----------------------------------------------------------------------------------
    def _list(self, state: _Kind) -> None:
        """Every page, parsed as it arrives; the view changes only once the last page is in (the view
        builds the new records first, then swaps under its lock), so a failed list changes nothing;
        except the first list of pods into an empty view, which goes in as it comes (ClusterView._fill:
        nothing decides from a view before every kind is listed, and the next list puts it right)."""
        version: list[str | None] = [None]
        start = time.monotonic()
        self.ingest.relist(self.view, state.kind, self._pages(state, version))
        state.version = version[0] or "0"
        self.view.versions[state.kind] = state.version
        state.progressed = True
        log.info("%s listed: %d in the view at resourceVersion %s in %.2f s", state.kind, self._count(state.kind),
                 state.version, time.monotonic() - start)
        self._freeze_once()

    def _pages(self, state: _Kind, version: list[str | None]) -> Iterator[dict[str, Any]]:
        """Every page's items. Each page is parsed here and its items handed on; meanwhile a helper
        thread already fetches the next one, so the API server produces page N+1 while page N is
        ingested (the list takes the longer of the two, not their sum: 150,000 pods ready in about
        the time the API server takes to send them)."""
        next_body = _in_background(f"list-{state.kind}", self._page, state, None)
        while True:
            body = next_body.result()  # a failed fetch raises here (an abandoned one finishes alone)
            self._up(state)
            metrics.heard_from_source()
            page = orjson.loads(body)
            del body
            meta = page.get("metadata") or {}
            version[0] = meta.get("resourceVersion") or version[0]
            token = meta.get("continue") or None
            if token is not None:
                next_body = _in_background(f"list-{state.kind}", self._page, state, token)
            items = page.get("items") or ()
            del page
            yield from items
            del items
            if not self._frozen:
                # While the first lists come in, each page's records go out of the collector's sight at
                # once: otherwise every full collection walks the growing heap again (2.9 s of GC
                # within a 150,000-pod list, measured; 0.4 s this way). `_freeze_once` rescans it all.
                gc.freeze()
            if token is None:
                return

    def _page(self, state: _Kind, token: str | None) -> bytes:
        """One list page's body, read to the end (the connection goes back to the pool)."""
        query: list[tuple[str, str | int | bool]] = [("limit", self.settings.page_size)]
        if state.selector:
            query.append(("fieldSelector", state.selector))
        if token:
            query.append(("continue", token))
        response = self._request(state, query, self.settings.list_timeout)
        try:
            if response.status != 200:
                raise _classify(api_error(response), listing=True)
            body = response.read()
        except BaseException as exc:
            self._forget(state, response, reuse=False)
            if isinstance(exc, urllib3.exceptions.HTTPError):
                raise self._no_answer(exc) from None
            raise
        self._forget(state, response, reuse=True)
        return body

    def _count(self, kind: str) -> int:
        table = getattr(self.view, kind, None)
        return len(table) if table is not None else self.view.dra.count(kind)

    def _freeze_once(self) -> None:
        """Once every kind's first list is in (the pods' being by far the largest), move the heap built
        so far into the GC's permanent generation. Those hundreds of thousands of records live as long
        as the process; without this, every full collection walks them all (~680 ms measured at 5,000
        nodes / 30,000 pods) and lands in the middle of a scheduling request. Later relists are not
        frozen: they replace few objects, and freezing again would pin whatever they dropped."""
        with self._freeze_lock:
            if self._frozen or not self.ready:
                return
            self._frozen = True
        start = time.monotonic()
        gc.unfreeze()  # what the pages froze on the way, back for one full collection:
        gc.collect()  # cyclic garbage frozen for good would never be freed
        gc.freeze()
        log.info("view ready; %d objects moved out of the garbage collector's sight in %.2f s",
                 gc.get_freeze_count(), time.monotonic() - start)

    # -- watch ---------------------------------------------------------------------------------
    def _watch(self, state: _Kind) -> None:
        """Returns when the server ends the stream cleanly (after `server_timeout`); raises _Restart."""
        query: list[tuple[str, str | int | bool]] = [
            ("watch", True), ("allowWatchBookmarks", True), ("resourceVersion", state.version or "0"),
            ("timeoutSeconds", self.settings.server_timeout)]
        if state.selector:
            query.append(("fieldSelector", state.selector))
        response = self._request(state, query, self.settings.watch_timeout)
        opened = time.monotonic()
        try:
            if response.status != 200:
                raise _classify(api_error(response), listing=False)
            self._up(state)
            for line in _lines(response):
                self._apply(state, line)
        except urllib3.exceptions.ReadTimeoutError:
            raise _Restart("stalled", f"no data for {self.settings.client_timeout:.0f} s") from None
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as exc:
            if self._stop.is_set():
                raise _Stopped from None
            if time.monotonic() - opened >= _STEADY_SECONDS:
                state.progressed = True
            raise _Restart("cut", f"stream cut: {_reason(exc)}") from None
        finally:
            self._forget(state, response, reuse=False)  # a watch connection is not worth reusing
        if self._stop.is_set():
            raise _Stopped
        if time.monotonic() - opened >= _STEADY_SECONDS:
            state.progressed = True
        raise _Restart("closed", "ended by the server")

    def _apply(self, state: _Kind, line: bytes) -> None:
        """The per-event work, kept small (it shares the GIL with the request path): parse, one
        ingest call, the resume point, two counters."""
        event = orjson.loads(line)
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind in _CHANGES:
            try:
                self.ingest.event(self.view, state.kind, kind, obj)
            except Exception:  # one broken object must not stall the stream on a loop of restarts
                log.exception("%s %s event for %s could not be applied; skipped", state.kind, kind,
                              (obj.get("metadata") or {}).get("name"))
        elif kind == "ERROR":
            raise _classify(_status_error(obj), listing=False)
        elif kind != "BOOKMARK":
            log.debug("%s watch: ignored event of type %s", state.kind, kind)
            return
        state.version = (obj.get("metadata") or {}).get("resourceVersion") or state.version
        self.view.versions[state.kind] = state.version or ""  # applied up to here (extender/settle.py)
        state.progressed = True
        state.counters[kind].inc()
        metrics.heard_from_source()

    # -- HTTP ----------------------------------------------------------------------------------
    def _request(self, state: _Kind, query: list[tuple[str, str | int | bool]],
                 timeout: Timeout) -> urllib3.BaseHTTPResponse:
        if self._stop.is_set():
            raise _Stopped
        try:
            response = request(self.api, "GET", state.path, query=query, timeout=timeout)
        except urllib3.exceptions.HTTPError as exc:
            if self._stop.is_set():
                raise _Stopped from None
            raise self._no_answer(exc) from None
        with self._open_lock:  # registered for stop(); checked again so a stop racing us is not missed
            if self._stop.is_set():
                response.close()
                raise _Stopped
            self._open[state.kind] = response
        return response

    def _forget(self, state: _Kind, response: urllib3.BaseHTTPResponse, reuse: bool) -> None:
        with self._open_lock:
            self._open.pop(state.kind, None)
        if reuse:
            response.release_conn()
        else:
            response.close()

    def _no_answer(self, exc: Exception) -> _Restart:
        # NewConnectionError (refused, no route) is a ConnectTimeoutError subclass: test it first.
        if isinstance(exc, urllib3.exceptions.NewConnectionError):
            return _Restart("unavailable", f"API server unreachable ({_reason(exc)})", failed=True)
        if isinstance(exc, urllib3.exceptions.ConnectTimeoutError):
            return _Restart("unavailable", f"API server did not answer within {self.settings.connect_timeout:g} s "
                                           f"({_reason(exc)})", failed=True)
        if isinstance(exc, urllib3.exceptions.ReadTimeoutError):
            return _Restart("unavailable", f"API server did not answer within {self.settings.read_timeout:g} s "
                                           f"({_reason(exc)})", failed=True)
        return _Restart("unavailable", f"API server unreachable ({_reason(exc)})", failed=True)


def _in_background(name: str, fn: Callable[..., bytes], *args: Any) -> Future[bytes]:
    """fn(*args) in a daemon thread of its own, one per list page: a fetch blocked on a dead API
    server never holds up the process's exit, as a pool's worker would."""
    future: Future[bytes] = Future()

    def run() -> None:
        try:
            future.set_result(fn(*args))
        except BaseException as exc:  # handed to whoever waits for the page
            future.set_exception(exc)

    threading.Thread(target=run, name=name, daemon=True).start()
    return future


def _lines(response: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
    """Watch events, one JSON object a line; a line may arrive split over several chunks."""
    parts: list[bytes] = []
    for chunk in _chunks(response):
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if parts:
                parts.append(chunk[start:end])
                line = b"".join(parts)
                parts.clear()
            else:
                line = chunk[start:end]
            if line.strip():
                yield line
            start = end + 1
        if start < len(chunk):
            parts.append(chunk[start:])
    if parts and b"".join(parts).strip():
        raise urllib3.exceptions.ProtocolError("stream ended inside an event")


def _chunks(response: urllib3.BaseHTTPResponse) -> Iterator[bytes]:
    """What has arrived, as soon as it arrives: `read(n)` would wait for n bytes (an event held back
    until 64 KiB of later ones came)."""
    if isinstance(response, urllib3.HTTPResponse) and response.chunked and response.supports_chunked_reads():
        yield from response.read_chunked(decode_content=True)
        return
    while data := response.read1(_READ_SIZE):
        yield data


def _status_error(status: Mapping[str, Any]) -> ApiError:
    """A watch ERROR event's object: a meta/v1 Status (kube/api.py), as sent."""
    code = int(status.get("code") or 500)
    return ApiError.of(code, str(status.get("reason") or ""), str(status.get("message") or "watch ERROR event"))


def _classify(error: ApiError, listing: bool) -> _Restart:
    if isinstance(error, ApiGone) or error.reason in ("Expired", "Gone"):
        what = "continue token" if listing else "resourceVersion"
        return _Restart("gone", f"{what} expired (410 {error.reason or 'Gone'}: {error.message})", relist=True)
    if error.status == 429:
        return _Restart("throttled", f"API server asks to slow down ({error})", failed=True,
                        retry_after=error.retry_after)
    if error.status >= 500:
        return _Restart("unavailable", f"API server error ({error})", failed=True, retry_after=error.retry_after)
    if error.status in (401, 403):
        hint = (" (RBAC: the service needs list and watch on namespaces, nodes and pods; the extender on "
                "policy's poddisruptionbudgets; the webhook's quota mirror on the resourcequotas named "
                f"{MIRROR_NAME}; both on resource.k8s.io's resourceslices, deviceclasses, resourceclaims and "
                "resourceclaimtemplates where DRA is served)" if isinstance(error, ApiForbidden) else "")
        return _Restart("refused", f"{error}{hint}", failed=True)
    return _Restart("refused", str(error), failed=True, relist=True)


def _reason(exc: BaseException) -> str:
    """urllib3's message without its `HTTPSConnection(host=..., port=...): ` prefix."""
    reason = getattr(exc, "reason", None)
    text = " ".join(str(reason if isinstance(reason, BaseException) else exc).split())
    return _CONNECTION_PREFIX.sub("", text)[:300] or type(exc).__name__


def _shutdown(response: urllib3.BaseHTTPResponse) -> None:
    """Wake a thread blocked reading this response: shut the socket's read side (closing it would not
    wake a blocked recv on Linux)."""
    try:
        response.shutdown()
    except Exception:
        try:
            response.close()
        except Exception:
            log.debug("closing a response on stop failed", exc_info=True)
