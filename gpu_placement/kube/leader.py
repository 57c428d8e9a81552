"""A worker that acts only while it holds its Lease: the ResourceQuota mirror and the DRA taint controller.

One daemon thread (a `Worker`, as the webhook's registration and quota holds are) takes or renews the
Lease every `renew_seconds` (sooner when woken by an event), then calls `step()`. A bug in a pass is
logged and the thread goes on; on stop the Lease is handed over at once rather than after its
duration, so a rolling update does not leave the work undone that long. `counted` counts each write
by how it ended.

Each object a pass writes is its own unit of work (`Failures.unit`): an answer about that object
(RBAC, validation, a conflict, an admission refusal) is logged once per distinct error, counted, kept
for a retry on a later turn, and the pass goes on with the others. Only the API server being out of
reach or overloaded (no answer, 429, 503, 504) ends a pass: every other object would wait out the same.
A long pass renews the Lease on the way (`_still_leading`) and stops if another replica took it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType

import urllib3
from prometheus_client import Counter, Gauge

from gpu_placement.kube.api import ApiError, ApiForbidden
from gpu_placement.kube.lease import Lease
from gpu_placement.observe.metrics import api_outcome

__all__ = ["Failures", "LeaderLoop", "Pacer", "PassInterrupted", "Worker", "about_the_object", "counted",
           "namespace_terminating"]

_SERVER_WIDE = frozenset({429, 503, 504})  # the API server overloaded or unavailable: not the object's fault


class PassInterrupted(Exception):
    """A pass ends early: the process stops, or the Lease went to another replica in the middle of it, or
    could not be renewed (then `__cause__` is the API server's answer)."""


def about_the_object(exc: BaseException) -> bool:
    """Whether an error is the API server's answer about one object (the pass goes on without it), not
    the server being out of reach or overloaded (the pass ends: the next object would meet the same)."""
    return isinstance(exc, ApiError) and exc.status not in _SERVER_WIDE


def namespace_terminating(exc: BaseException) -> bool:
    """NamespaceLifecycle's refusal of new content in a namespace being deleted (k8s.io/apiserver v0.37.2
    pkg/admission/plugin/namespace/lifecycle/admission.go: 403 Forbidden with the `NamespaceTerminating`
    cause, "unable to create new content in namespace X because it is being terminated"): nothing is
    wanted there any more, so the create is settled, not failed."""
    return isinstance(exc, ApiForbidden) and (
        "NamespaceTerminating" in exc.causes or "because it is being terminated" in exc.message)


@contextmanager
def counted(counter: Counter, *labels: str) -> Iterator[None]:
    """Count one API call in `counter`, `labels` first and how it ended last (`api_outcome`: ok, conflict,
    not_found, refused, timeout, unreachable); the error goes on up."""
    try:
        yield
    except (ApiError, OSError, urllib3.exceptions.HTTPError) as exc:
        counter.labels(*labels, api_outcome(exc)).inc()
        raise
    counter.labels(*labels, "ok").inc()


class _Unit:
    """`Failures.unit`: a context whose `__exit__` says `bool`, so the type checker knows the code after
    the `with` runs also when its body was cut short by a swallowed error (a @contextmanager's may not)."""

    __slots__ = ("failures", "key")

    def __init__(self, failures: Failures, key: str) -> None:
        self.failures, self.key = failures, key

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> bool:
        if exc is None:
            self.failures.succeeded(self.key)
            return False
        if isinstance(exc, ApiError) and about_the_object(exc):
            self.failures.failed(self.key, exc)
            return True
        return False


class Pacer:
    """A leader's writes paced by a token bucket: `per_second`, up to `burst` at once (a first install
    writes to every node)."""

    def __init__(self, per_second: float, burst: int, clock: Callable[[], float]) -> None:
        self.per_second, self.burst, self.clock = per_second, burst, clock
        self._tokens = float(burst)
        self._refilled = clock()

    def take(self, stop: threading.Event, between: Callable[[], None]) -> None:
        """Return once a token is there; while waiting, end the pass on `stop` and call `between` (the
        leader renews its Lease there, so a long paced pass does not lose it under the writes)."""
        while True:
            now = self.clock()
            self._tokens = min(float(self.burst), self._tokens + (now - self._refilled) * self.per_second)
            self._refilled = now
            if self._tokens >= 1:
                self._tokens -= 1
                return
            if stop.wait((1 - self._tokens) / self.per_second):
                raise PassInterrupted("stopping")
            between()


class Failures:
    """The objects of a loop whose last write failed, by key (namespace/name, or name), with their error.
    Each is logged when its error is new or changed, and again at info once it is written; `gauge` (if
    any) counts them. The loop retries them on its later turns."""

    def __init__(self, what: str, log: logging.Logger, gauge: Gauge | None = None) -> None:
        self.what, self.log, self.gauge = what, log, gauge
        self.errors: dict[str, str] = {}
        self._publish()  # the series from the start, at 0

    def unit(self, key: str) -> _Unit:
        """One object's work: an error about the object is kept here and swallowed; any other goes on up."""
        return _Unit(self, key)

    def failed(self, key: str, exc: BaseException) -> None:
        if self.errors.get(key) != str(exc):
            self.log.error("%s: %s: %s; the rest of the pass goes on, and %s is tried again on the next turn",
                           self.what, key, exc, key)
        self.errors[key] = str(exc)
        self._publish()

    def succeeded(self, key: str) -> None:
        if self.errors.pop(key, None) is not None:
            self.log.info("%s: %s written now, after its earlier failure", self.what, key)
            self._publish()

    def forget(self, keys: Iterable[str]) -> None:
        """Objects no longer wanted or no longer ours to write (another replica leads)."""
        for key in list(keys):
            self.errors.pop(key, None)
        self._publish()

    def _publish(self) -> None:
        if self.gauge is not None:
            self.gauge.set(len(self.errors))


class Worker:
    """A daemon thread that runs `step()`, then `_pause()`, until `stop()`. What a step expects to fail
    (the API server's answers, the network) it handles itself; anything else is a bug: logged with its
    traceback (`crashed`), and the thread goes on. `_stop` ends it; `_wake` cuts a pause short."""

    what = "worker"  # the log's name for it, and its thread's: "quota mirror" runs as thread quota-mirror
    crashed = "%s failed"  # the log line of a step that raised, `what` in it
    log = logging.getLogger("gpu_placement")

    def __init__(self) -> None:
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def step(self) -> None:
        raise NotImplementedError

    def _pause(self) -> None:
        """Wait for the next step (`_stop` set ends the wait)."""
        raise NotImplementedError

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.what.lower().replace(" ", "-"), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # a bug, not the network: say so, keep the thread
                self.log.exception(self.crashed, self.what)
            self._pause()


class LeaderLoop(Worker):
    what = "leader loop"  # the log's name for the worker, e.g. "quota mirror"
    crashed = "%s pass failed"

    def __init__(self, lease: Lease, leading_gauge: Gauge, renew_seconds: float, clock: Callable[[], float],
                 settle_seconds: float = 0.0) -> None:
        super().__init__()
        self.lease = lease
        self.clock = clock
        self._leading_gauge = leading_gauge
        self._renew_seconds = renew_seconds
        self._settle_seconds = settle_seconds  # after a wake, let a burst of events arrive before a pass
        self.leading = False
        self._renewed = float("-inf")
        self._lead_lock = threading.RLock()
        self.last_error: str | None = None  # what ended the last turn, or a failing object's error
        self._next_resync = 0.0  # when the next full pass is due (the loop's clock); 0: the next turn

    @property
    def leading(self) -> bool:
        return self._leading

    @leading.setter
    def leading(self, value: bool) -> None:
        self._leading = value
        self._leading_gauge.set(float(value))

    def step(self) -> None:
        """One turn (`_turn`). An error that ends it (the API server out of reach, or the Lease's answer)
        is logged when it is new, kept in `last_error`, and makes the next turn a full pass; a pass
        interrupted by stopping or by the Lease going to another replica just ends (a full pass next)."""
        try:
            self._turn()
        except PassInterrupted as exc:
            if exc.__cause__ is None:
                self.log.info("%s: pass interrupted: %s", self.what, exc)
                self._next_resync = 0.0
            else:
                self._turn_failed(exc.__cause__)
        except (ApiError, OSError, urllib3.exceptions.HTTPError) as exc:
            self._turn_failed(exc)

    def _turn(self) -> None:
        """`_lead()`, then the work while leading."""
        raise NotImplementedError

    def _turn_failed(self, exc: BaseException) -> None:
        if str(exc) != self.last_error:
            self.log.error("%s: %s; retrying in %.0f s", self.what, exc, self._renew_seconds)
        self.last_error = str(exc)
        self._next_resync = 0.0  # what failed may have been a change: make sure of everything next time

    def _took_lead(self) -> None:
        """This replica just became the leader (whatever happened while another led is to be checked)."""

    def _not_leading(self) -> None:
        """A turn on which another replica leads."""

    # -- running -------------------------------------------------------------------------------
    def stop(self) -> None:
        super().stop()
        if self.leading:
            self.leading = False
            try:
                self.lease.release()
            except (ApiError, OSError, urllib3.exceptions.HTTPError) as exc:
                self.log.info("%s: could not release the lease (%s); it runs out by itself", self.what, exc)

    def _pause(self) -> None:
        self._wake.wait(self._renew_seconds)
        self._wake.clear()
        if self._settle_seconds:
            self._stop.wait(self._settle_seconds)

    def _take_token(self, pacer: Pacer) -> None:
        """Before a write of a paced pass: a long wait for a token renews the Lease on the way."""
        pacer.take(self._stop, self._still_leading)

    def _still_leading(self) -> None:
        """Between two objects of a pass: renew the Lease when due, as between turns, so that a pass
        longer than the Lease does not let another replica write beside this one; stop the pass when
        the process stops or the Lease went to another replica."""
        if self._stop.is_set():
            raise PassInterrupted("stopping")
        try:
            self._lead()
        except ApiError as exc:  # the Lease's answer, not the object's: not for Failures.unit to keep
            raise PassInterrupted(f"the Lease could not be renewed: {exc}") from exc
        if not self.leading:
            raise PassInterrupted("another replica took the lease in the middle of a pass")

    def _lead(self) -> None:
        """Take or renew the Lease when due; raises what the API server answered (then not leading).
        One caller at a time: two renewals of our own at once would conflict (a 409 on the second PUT)
        and read as the Lease lost (a pass run by hand beside the loop's own, as tests do)."""
        with self._lead_lock:
            now = self.clock()
            if self.leading and now - self._renewed < self._renew_seconds:
                return
            try:
                leading = self.lease.acquire()
            except BaseException:
                self.leading = False
                raise
            if leading and not self.leading:
                self._took_lead()
            elif self.leading and not leading:
                self.log.info("%s: another replica holds the lease now", self.what)
            self.leading = leading
            if leading:
                self._renewed = now
            else:
                self._not_leading()
