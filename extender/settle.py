"""When a /filter that passes no node waits for the view to take a change already on its way.

kube-scheduler retries a pod the extender rejected on any cluster event its informers see
(pkg/scheduler/schedule_one.go v1.37.2 `findNodesThatFitPod`: `ExtenderName` goes into the pod's
UnschedulablePlugins; framework/runtime/framework.go `defaultEnqueueExtension` registers it for every
event of `framework.UnrollWildCardResource`), within a millisecond or two of the event, and our own
watch may still be that far behind. Answered from that view (the validator not Ready yet, the deleted
pod's memory still held), the pod goes back to kube-scheduler's unschedulable pool and waits for the
next event it listens to, or the five-minute flush (`podMaxInUnschedulablePodsDuration`). So the answer
waits, up to SETTLE_SECONDS (50 ms), but only where the view is plausibly behind:

- `lagging`: the pod kube-scheduler sends (its informer's copy) has a newer resourceVersion than the
  newest pods event the view applied: our pods watch is behind kube-scheduler's. Resource versions of
  one resource compare as integers (k8s.io/apimachinery/pkg/util/resourceversion
  `CompareResourceVersion`); the wait ends once the view has caught up.
- `retried`: kube-scheduler sends again the pod (same UID and resourceVersion) that this extender
  rejected everywhere, and the answer would be the same: kube-scheduler moved it on an event that has
  not changed the view yet (or one the view does not watch). The wait ends when the view changes.

The first attempt of a pod that is not `lagging` never waits (the review's 25 ms on every pod that
fits nowhere), nor does a pod whose own update (kube-scheduler's PodScheduled write) is what moved it.

One event moves every pod the extender rejected (pkg/scheduler/backend/queue/scheduling_queue.go
v1.37.2 `moveEntitiesToActiveOrBackoffQueue` -> `requeueEntityWithQueueingStrategy`: to the active
queue, or to the backoff queue while the pod backs off, which active_queue.go's `backoffQPopper` pops
from as soon as the active queue is empty, SchedulerPopFromBackoffQ being on by default since v1.33),
and kube-scheduler's serial cycle sends them one after the other. One wait serves the whole round: the
view it waited for is the view every later pod is judged on. So two kinds of retry do not wait
(gpu_placement_filter_settle_skipped_total):

- `standing`: the pod is rejected on every node for what the node is, not what it is doing: its GPU's
  product, memory per device, compute capability, driver, sharing mode or labels (STANDING_CODES). No pod
  event changes those; the node changes that do (a driver upgrade, a MIG layout) pass through answers
  that wait (DriverUpgrade, MIGReconfiguring, NotValidated, a cordon's NodeNotReady). What is lost: a
  pod that races a node relabelled straight from one standing answer to a fit (a label fixed by hand)
  waits for the next event. What is won: a backlog of pods too big for any GPU no longer spends the
  budget that a pod racing a deletion needs (the review's finding 3).
- `covered`: a `retried` wait at the view's current generation found nothing, and kube-scheduler has
  been retrying rejected pods since without a pause of SETTLE_SECONDS: the same round of retries, moved
  by the event that wait already gave the view time to apply. A second wait at that generation would
  only find what arrived since; it costs SETTLE_SECONDS of the serial scheduler per pod of the backlog.
  After a pause, or once the view has changed, the next retry may wait again: the mark does not outlive
  its round, or the first pod of the next event's round (the very race the wait is for) would be
  answered from a view still at that generation (a pod update that changes no GPU figure, or an event
  of a kind the view does not watch, leaves the generation as it was).

Every wait is drawn from a budget, SETTLE_SHARE of wall time with SETTLE_BURST saved up, in an order
of who may take its last part (the `keep` of `Budget.take`):

- a `lagging` pod may take all of it: the view is provably behind, and the wait ends once it has
  caught up;
- a `retried` pod leaves one whole wait (SETTLE_SECONDS) for a `lagging` one;
- a pod of the backlog, answered the same way BACKLOG_ANSWERS times in a row, waits only from a full
  budget (`backlog` in the skipped counter otherwise). A round begins at every event, and one that
  changed nothing the view holds (a bound pod's status, a pod without GPUs) costs its first wait
  SETTLE_SECONDS: on `make e2e` such rounds came twice a second, five times what the budget refills,
  so the pods earlier scenarios left waiting kept it empty, and the next pod that raced a deletion or
  a validator's Ready was answered without its wait, then parked with nothing to move it again
  (scenario 6, not bound in 15 s). The backlog's waits now never take the budget below SETTLE_BURST -
  SETTLE_SECONDS (three whole waits stay for answers that are new, less an overrun); on a quiet
  cluster the budget is full, and a pod of the backlog waits as any other.

gpu_placement_filter_settle_denied_total counts the waits the budget refused to a pod that is not of
the backlog: the ones whose absence may park a pod that raced the watch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from gpu_placement.decide.placement import FilterResult
from gpu_placement.decide.rules import (
    BAD_LABEL,
    COMPUTE_CAPABILITY,
    DRIVER_TOO_OLD,
    INSUFFICIENT_GPU_MEMORY,
    NO_GPU,
    PRODUCT_MISMATCH,
    SHARING_MISMATCH,
    UNKNOWN_DRIVER,
    UNKNOWN_GPU_MEMORY,
)
from gpu_placement.observe import metrics
from gpu_placement.view.cluster import ClusterView

__all__ = ["BACKLOG", "BACKLOG_ANSWERS", "COVERED", "LAGGING", "RETRIED", "SETTLE_BURST", "SETTLE_SECONDS",
           "SETTLE_SHARE", "STANDING", "STANDING_CODES", "Budget", "Settle", "newer", "standing"]

log = logging.getLogger("gpu_placement.extender")

# The longest one /filter waits. Our watch was 1-16 ms behind kube-scheduler's retry on `make e2e`
# (scenarios 6 and 19, a CPU hog beside them); the wait ends as soon as the view has the change, and
# waits that find nothing are what the budget bounds.
SETTLE_SECONDS = 0.05
SETTLE_SHARE = 0.02  # of wall time that waits may take, on average
SETTLE_BURST = 0.2  # seconds of waiting saved up (four whole waits) for a quiet cluster's rare races
LAGGING, RETRIED = "lagging", "retried"  # why a /filter waits
STANDING, COVERED, BACKLOG = "standing", "covered", "backlog"  # why one that could have waited did not
# A pod answered the same way this many times in a row (its first attempt, the retry its own PodScheduled
# write causes, then one per cluster event) is part of the backlog: it waits only from a full budget.
BACKLOG_ANSWERS = 8
# Rejections for what a node is. InsufficientGPUMemory is one only where preemption could not help (the
# ask is more than a device has, or than MPS lets a client use): `standing` asks that no node was
# rejected as resolvable (FailedNodes: memory or devices in use). Codes not listed may wait.
STANDING_CODES = frozenset({NO_GPU, BAD_LABEL, UNKNOWN_DRIVER, DRIVER_TOO_OLD, COMPUTE_CAPABILITY,
                            PRODUCT_MISMATCH, UNKNOWN_GPU_MEMORY, SHARING_MISMATCH, INSUFFICIENT_GPU_MEMORY})
_POLL = 0.001
_REMEMBERED = 10_000  # pods rejected everywhere, for `retried`


def newer(version: str, than: str | None) -> bool:
    """Whether resourceVersion `version` is past `than`, both of one resource. False when either is
    not a well-formed one (a positive integer without leading zeros: CompareResourceVersion's rule)."""
    if not than or not _well_formed(version) or not _well_formed(than):
        return False
    return len(version) > len(than) or (len(version) == len(than) and version > than)


def _well_formed(version: str) -> bool:
    return bool(version) and version[0] != "0" and version.isascii() and version.isdigit()


def standing(result: FilterResult) -> bool:
    """Whether every node of this answer (which passes none) rejects the pod for what the node is."""
    return len(result.failed_json) <= 2 and result.reasons.keys() <= STANDING_CODES


class Budget:
    """Seconds of waiting allowed: `share` of wall time, with up to `burst` saved up (a token bucket).
    A wait takes its longest possible length up front and settles with what it really took: waits
    that overlap never overdraw, and one that overran (a loaded machine) is paid for by the next ones."""

    def __init__(self, share: float = SETTLE_SHARE, burst: float = SETTLE_BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.share, self.burst, self.clock = share, burst, clock
        self.left = burst
        self._at = clock()

    def take(self, seconds: float, keep: float = 0.0) -> bool:
        """Take `seconds` if at least `keep` more is left after them."""
        now = self.clock()
        self.left = min(self.burst, self.left + (now - self._at) * self.share)
        self._at = now
        if self.left - seconds < keep:
            return False
        self.left -= seconds
        return True

    def give_back(self, seconds: float) -> None:
        """What a wait did not use of what it took; negative for a wait that overran."""
        self.left = min(self.burst, self.left + seconds)


@dataclass(slots=True, frozen=True)
class _Rejected:
    uid: str
    version: str
    answer: tuple[int, int, int, int]  # lengths and hashes of FailedNodes and FailedAndUnresolvableNodes
    times: int = 1  # answers in a row that were this one (any version of the pod)


class Settle:
    """Per extender app: which pods were rejected everywhere, the round a wait found nothing in, and
    the budget."""

    def __init__(self, view: ClusterView, budget: Budget | None = None, seconds: float = SETTLE_SECONDS,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.view, self.seconds, self.clock = view, seconds, clock
        self.budget = budget or Budget()
        self._rejected: OrderedDict[str, _Rejected] = OrderedDict()
        # (generation, until): a wait at that view generation found nothing; retries at it before
        # `until` (each one pushes it on by `seconds`) are the same round and do not wait (COVERED)
        self._covered: tuple[int, float] | None = None
        self._waited = {(why, outcome): metrics.FILTER_SETTLE_SECONDS.labels(why, outcome)
                        for why in (LAGGING, RETRIED) for outcome in ("changed", "unchanged")}
        self._denied = {why: metrics.FILTER_SETTLE_DENIED.labels(why) for why in (LAGGING, RETRIED)}
        self._skipped = {(why, cause): metrics.FILTER_SETTLE_SKIPPED.labels(why, cause) for why, cause in
                         ((LAGGING, STANDING), (RETRIED, STANDING), (RETRIED, COVERED), (RETRIED, BACKLOG))}

    def why(self, key: str, uid: str, version: str, result: FilterResult) -> str | None:
        """Why this answer, which passes no node, should wait for the view (LAGGING, RETRIED), or None."""
        if newer(version, self.view.versions.get("pods")):
            why = LAGGING
        else:
            last = self._rejected.get(key)
            if last is None or last.uid != uid or last.version != version or last.answer != _answer(result):
                return None
            why = RETRIED
        covered = False
        if why == RETRIED and self._covered is not None:
            generation, until = self._covered
            now = self.clock()
            if generation == self.view.generation and now < until:
                self._covered, covered = (generation, now + self.seconds), True  # the round goes on
        if standing(result):
            self._skipped[why, STANDING].inc()
            return None
        if covered:
            self._skipped[RETRIED, COVERED].inc()
            return None
        return why

    async def wait(self, key: str, why: str, version: str) -> bool:
        """Wait (within the budget) for the view: True when it changed and the pod must be judged again."""
        last = self._rejected.get(key)
        backlog = why == RETRIED and last is not None and last.times >= BACKLOG_ANSWERS
        keep = self.budget.burst - self.seconds if backlog else self.seconds if why == RETRIED else 0.0
        if not self.budget.take(self.seconds, keep=keep):
            if backlog:
                self._skipped[RETRIED, BACKLOG].inc()
            else:
                self._denied[why].inc()
            log.debug("filter pod=%s answered without waiting for the view (%s): the settle budget is %s", key, why,
                      "not full (a pod of the backlog)" if backlog else "spent")
            return False
        generation, start = self.view.generation, time.perf_counter()
        try:
            if why == LAGGING:
                changed = await _view_changes(self.view, self.seconds, until=version)
            else:
                changed = await _view_changes(self.view, self.seconds)
        finally:
            waited = time.perf_counter() - start
            self.budget.give_back(self.seconds - waited)
        if not changed and (why == RETRIED or newer(version, self.view.versions.get("pods"))):
            self._covered = (generation, self.clock() + self.seconds)  # timed out: nothing came
        self._waited[why, "changed" if changed else "unchanged"].observe(waited)
        log.debug("filter pod=%s waited %.1f ms for the view (%s): %s", key, waited * 1000, why,
                  "it changed, judged again" if changed else "no change")
        return changed

    def answered(self, key: str, uid: str, version: str, result: FilterResult) -> None:
        """Remember a pod rejected everywhere (a retry of it may wait), forget one that passed."""
        if result.passed:
            self.forget(key)
            return
        answer, last = _answer(result), self._rejected.get(key)
        times = last.times + 1 if last is not None and last.uid == uid and last.answer == answer else 1
        self._rejected[key] = _Rejected(uid, version, answer, times)
        self._rejected.move_to_end(key)
        if len(self._rejected) > _REMEMBERED:
            self._rejected.popitem(last=False)

    def forget(self, key: str) -> None:
        self._rejected.pop(key, None)


def _answer(result: FilterResult) -> tuple[int, int, int, int]:
    """The answer's node maps, compared without keeping them (they run to megabytes at 10,000 nodes);
    bytes cache their hash, and an answer replayed for an unchanged kind is the same bytes object."""
    failed, unresolvable = result.failed_json, result.unresolvable_json
    return len(failed), hash(failed), len(unresolvable), hash(unresolvable)


async def _view_changes(view: ClusterView, seconds: float, until: str | None = None) -> bool:
    """Whether the view changes within `seconds`; with `until`, the wait also ends once the view has
    applied the pods event of that resourceVersion (polled: the event loop stays free meanwhile)."""
    generation, deadline = view.generation, time.monotonic() + seconds
    while view.generation == generation and time.monotonic() < deadline:
        if until is not None and not newer(until, view.versions.get("pods")):
            break
        await asyncio.sleep(_POLL)
    return view.generation != generation
