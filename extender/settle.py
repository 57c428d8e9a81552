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
Every wait is drawn from a budget, SETTLE_SHARE of wall time with SETTLE_BURST saved up: on a busy
cluster, where waiting pods are retried on every event, the waits stop at a small share of the
scheduler's time; a pod answered from a lagging view then, is moved again by the next event, which on
such a cluster is near.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from gpu_placement.decide.placement import FilterResult
from gpu_placement.observe import metrics
from gpu_placement.view.cluster import ClusterView

__all__ = ["LAGGING", "RETRIED", "SETTLE_BURST", "SETTLE_SECONDS", "SETTLE_SHARE", "Budget", "Settle", "newer"]

log = logging.getLogger("gpu_placement.extender")

# The longest one /filter waits. Our watch was 1-16 ms behind kube-scheduler's retry on `make e2e`
# (scenarios 6 and 19, a CPU hog beside them); the wait ends as soon as the view has the change, and
# waits that find nothing are what the budget bounds.
SETTLE_SECONDS = 0.05
SETTLE_SHARE = 0.02  # of wall time that waits may take, on average
SETTLE_BURST = 0.2  # seconds of waiting saved up (four whole waits) for a quiet cluster's rare races
LAGGING, RETRIED = "lagging", "retried"
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


class Budget:
    """Seconds of waiting allowed: `share` of wall time, with up to `burst` saved up (a token bucket).
    A wait takes its longest possible length up front and settles with what it really took: waits
    that overlap never overdraw, and one that overran (a loaded machine) is paid for by the next ones."""

    def __init__(self, share: float = SETTLE_SHARE, burst: float = SETTLE_BURST,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.share, self.burst, self.clock = share, burst, clock
        self.left = burst
        self._at = clock()

    def take(self, seconds: float) -> bool:
        now = self.clock()
        self.left = min(self.burst, self.left + (now - self._at) * self.share)
        self._at = now
        if self.left < seconds:
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


class Settle:
    """Per extender app: which pods were rejected everywhere, and the budget."""

    def __init__(self, view: ClusterView, budget: Budget | None = None, seconds: float = SETTLE_SECONDS) -> None:
        self.view, self.seconds = view, seconds
        self.budget = budget or Budget()
        self._rejected: OrderedDict[str, _Rejected] = OrderedDict()
        self._waited = {(why, outcome): metrics.FILTER_SETTLE_SECONDS.labels(why, outcome)
                        for why in (LAGGING, RETRIED) for outcome in ("changed", "unchanged")}
        self._denied = {why: metrics.FILTER_SETTLE_DENIED.labels(why) for why in (LAGGING, RETRIED)}

    def why(self, key: str, uid: str, version: str, result: FilterResult) -> str | None:
        """Why this answer, which passes no node, should wait for the view (LAGGING, RETRIED), or None."""
        if newer(version, self.view.versions.get("pods")):
            return LAGGING
        last = self._rejected.get(key)
        if last is not None and last.uid == uid and last.version == version and last.answer == _answer(result):
            return RETRIED
        return None

    async def wait(self, key: str, why: str, version: str) -> bool:
        """Wait (within the budget) for the view: True when it changed and the pod must be judged again."""
        if not self.budget.take(self.seconds):
            self._denied[why].inc()
            log.debug("filter pod=%s answered without waiting for the view (%s): the settle budget is spent", key, why)
            return False
        start = time.perf_counter()
        try:
            if why == LAGGING:
                changed = await _view_changes(self.view, self.seconds, until=version)
            else:
                changed = await _view_changes(self.view, self.seconds)
        finally:
            waited = time.perf_counter() - start
            self.budget.give_back(self.seconds - waited)
        self._waited[why, "changed" if changed else "unchanged"].observe(waited)
        log.debug("filter pod=%s waited %.1f ms for the view (%s): %s", key, waited * 1000, why,
                  "it changed, judged again" if changed else "no change")
        return changed

    def answered(self, key: str, uid: str, version: str, result: FilterResult) -> None:
        """Remember a pod rejected everywhere (a retry of it may wait), forget one that passed."""
        if result.passed:
            self.forget(key)
            return
        self._rejected[key] = _Rejected(uid, version, _answer(result))
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
