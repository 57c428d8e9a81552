"""The one replica that counts launch outcomes and node lifecycle times for the cluster.

Why a Lease and a watermark, and not a mark on each pod: a mark needs `patch` on every pod of the
cluster, which also lets the service change a running pod's image, and an UPDATE of every GPU pod
passing every admission webhook; the watermark needs one small object the service already writes.

Each webhook replica runs an `OutcomeCounter` (a LeaderLoop on its own Lease, `gpu-placement-outcomes`).
The Lease carries the watermark W in the annotation `gpu-placement.io/outcomes-counted-until` (RFC 3339,
microseconds): every event whose anchor is at or before W has been counted by some leader, but the
launches deferred; and in `gpu-placement.io/outcomes-state` the cluster's totals so far (launches by
label set, each histogram's buckets, sum and count) and the launches W passed undecided, by pod UID,
compact and bounded (gpu_placement/outcomes/store.py). On each turn the holder reads the Lease, asks
its `Outcomes` for the next write (`turn`: how far W goes, what it counts, what stays deferred), and
writes the new W with the new state in one PUT carrying the Lease's resourceVersion (a compare-and-swap:
a 409 means another replica took the Lease in between, and then nothing is counted). A standby reads
both on each turn, forgets what is counted, and exports the same totals. So one write carries W past
each event (or takes a deferred launch out of the set), whoever leads and however often a process
restarts: an event is never counted twice, and the exported series are the cluster's own, the same on every
replica, never reset by a restart (Prometheus aggregates them with max, and a window's figure is the
exact difference of the totals at its ends, without increase()'s extrapolation).

The first holder of a Lease without the annotations starts counting at its own clock less `settle`; a
Lease written by a version before the state annotation (`gpu-placement.io/outcomes-totals`, plain JSON)
is read as it is, and its first write moves the totals into the state.
`LocalCounter` is the same without an API server (`serve --snapshot`, the demo): the watermark lives
in memory, so there a restart starts counting afresh.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import orjson
import urllib3
from kubernetes.client import ApiClient

from gpu_placement.base.timestamps import parse_time
from gpu_placement.kube.api import OBJECT_TIMEOUT, ApiConflict, ApiError, get, write
from gpu_placement.kube.leader import LeaderLoop, counted
from gpu_placement.kube.lease import Lease
from gpu_placement.observe.metrics import (
    API_OUTCOMES,
    OUTCOMES_COUNTED_UNTIL,
    OUTCOMES_DEFERRED,
    OUTCOMES_LEADING,
    OUTCOMES_STATE_BYTES,
    OUTCOMES_WRITES,
)
from gpu_placement.outcomes.record import Outcomes, Turn
from gpu_placement.outcomes.store import LIMIT, pack, unpack

__all__ = ["STATE_ANNOTATION", "TOTALS_ANNOTATION", "WATERMARK_ANNOTATION", "CounterSettings", "LocalCounter",
           "OutcomeCounter", "format_watermark"]

log = logging.getLogger("gpu_placement.outcomes.record")

WATERMARK_ANNOTATION = "gpu-placement.io/outcomes-counted-until"
STATE_ANNOTATION = "gpu-placement.io/outcomes-state"  # the totals and deferred launches (store.py)
TOTALS_ANNOTATION = "gpu-placement.io/outcomes-totals"  # before the state: plain JSON, read until the first write


@dataclass(slots=True, frozen=True)
class CounterSettings:
    lease_name: str = "gpu-placement-outcomes"
    lease_seconds: int = 30  # another replica takes over this long after the holder stops renewing
    renew_seconds: float = 10.0  # how often the holder renews and counts (and a standby reads W)


def format_watermark(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _written(at: float) -> float:
    """W as it reads back from its annotation (microseconds): what every replica compares with."""
    parsed = parse_time(format_watermark(at))
    assert parsed is not None
    return parsed


class OutcomeCounter(LeaderLoop):
    what = "outcome counter"
    log = log

    def __init__(self, api: ApiClient, outcomes: Outcomes, namespace: str, identity: str,
                 settings: CounterSettings | None = None, clock: Callable[[], float] = time.time) -> None:
        self.api, self.outcomes, self.identity = api, outcomes, identity
        outcomes.count()
        self.settings = settings or CounterSettings()
        lease = Lease(api, namespace, self.settings.lease_name, identity, self.settings.lease_seconds,
                      clock=lambda: datetime.fromtimestamp(clock(), UTC))
        super().__init__(lease, OUTCOMES_LEADING.labels(self.settings.lease_name), self.settings.renew_seconds, clock)
        self._counted_until = OUTCOMES_COUNTED_UNTIL.labels(self.settings.lease_name)
        self._deferred = OUTCOMES_DEFERRED.labels(self.settings.lease_name)
        self._state_bytes = OUTCOMES_STATE_BYTES.labels(self.settings.lease_name)
        for outcome in API_OUTCOMES:  # every series from the start: rate() and alerts need the zero
            OUTCOMES_WRITES.labels(self.settings.lease_name, outcome)
        self._taken: str | None = None  # the state annotation as last taken in: the same again is not decoded
        self._state: dict[str, Any] | None = None  # what it holds (store.unpack), None: nothing yet
        self._current = False  # whether that is a state this version wrote (else the next write packs it)
        self._path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{self.settings.lease_name}"
        self.last_error: str | None = None
        self.counted = 0  # events this replica counted: for tests and the log

    def step(self) -> None:
        """One turn: renew or take the Lease when due, read W; leading, move it and count."""
        if not self.outcomes.prime():
            return  # the view has not listed nodes and pods yet: nothing may be decided from it
        try:
            self._lead()
            lease = self._read()
            watermark = _watermark(lease)
            self._take(lease)  # every replica exports the cluster's totals as last written
            deferred = _deferred(self._state)
            if watermark is not None:
                self.outcomes.settled(watermark, deferred)
                self._counted_until.set(watermark)
                self._deferred.set(len(deferred))
            if self.leading and ((lease.get("spec") or {}).get("holderIdentity") == self.identity):
                self._count(lease, watermark, deferred)
            self._ok()
        except (ApiError, OSError, urllib3.exceptions.HTTPError) as exc:
            # Nothing was counted (a failed write leaves W and the totals as they were): the next turn
            # counts from the same W. Logged when the error is new or changed.
            if str(exc) != self.last_error:
                log.error("outcome counter: %s; nothing counted this turn, tried again in %g s", exc,
                          self.settings.renew_seconds)
            self.last_error = str(exc)

    def _count(self, lease: dict[str, Any], watermark: float | None, deferred: dict[str, float]) -> None:
        now = self.clock()
        if watermark is None:
            turn: Turn | None = Turn(_written(now - self.outcomes.settle), [], {})
        else:
            turn = self.outcomes.turn(now, watermark, deferred, _written)
        if turn is None:
            return
        packed = None  # only W moves: the state stays as it is (its encoding takes 60 ms for a large cluster)
        if turn.batch or turn.deferred != deferred or not self._current:
            packed = pack(self.outcomes.totals(turn.batch), self._state, turn.deferred)
            if packed.folded:
                log.error("outcome counter: the cluster's totals outgrew %d bytes: %d series with the fewest "
                          "observations are counted under pool and product _other from now on, and no new series "
                          "is kept", LIMIT, packed.folded)
        if not self._write(lease, turn.until, packed.text if packed else str(self._taken)):
            log.info("outcome counter: the Lease changed under the watermark write; another replica leads now")
            return
        if packed is not None:  # what was written: the batch counted in, new series past the cap folded
            self.outcomes.load(packed.totals)
            self._state, self._taken, self._current = packed.totals, packed.text, True
            self._state_bytes.set(len(packed.text))
        self.outcomes.settled(turn.until, turn.deferred)
        self._counted_until.set(turn.until)
        self._deferred.set(len(turn.deferred))
        self.counted += len(turn.batch)
        if watermark is None:
            log.info("outcome counter: counting launch outcomes and node lifecycle times from %s",
                     format_watermark(turn.until))
        elif turn.batch:
            log.debug("outcome counter: counted %d events up to %s (%d launches deferred)", len(turn.batch),
                      format_watermark(turn.until), len(turn.deferred))

    def _take(self, lease: dict[str, Any]) -> None:
        """The state as the Lease holds it, into `_state` and the exported totals (decoded only when changed)."""
        annotations = (lease.get("metadata") or {}).get("annotations") or {}
        text, name = annotations.get(STATE_ANNOTATION), STATE_ANNOTATION
        if text is None:
            text, name = annotations.get(TOTALS_ANNOTATION), TOTALS_ANNOTATION
        if text == self._taken and self.outcomes.loaded:
            return
        self._state, self._current = None, False
        if isinstance(text, str):
            try:
                self._state = orjson.loads(text) if name == TOTALS_ANNOTATION else unpack(text)
                self._current = name == STATE_ANNOTATION
            except ValueError as exc:  # orjson.JSONDecodeError is one
                log.warning("outcome counter: the Lease's %s cannot be read (%s); the totals restart from zero",
                            name, exc)
            self._state_bytes.set(len(text))
        self.outcomes.load(self._state)
        self._taken = text

    def _ok(self) -> None:
        if self.last_error is not None:
            log.info("outcome counter: the API server answers again")
        self.last_error = None

    def _read(self) -> dict[str, Any]:
        lease: dict[str, Any] = get(self.api, self._path, timeout=OBJECT_TIMEOUT)
        return lease

    def _write(self, lease: dict[str, Any], watermark: float, state: str) -> bool:
        """The Lease with the new watermark and state, as read (its resourceVersion included), the totals of
        an earlier version gone (they are in the state now): False on 409."""
        meta = lease.setdefault("metadata", {})
        kept = {k: v for k, v in (meta.get("annotations") or {}).items() if k != TOTALS_ANNOTATION}
        meta["annotations"] = {**kept, WATERMARK_ANNOTATION: format_watermark(watermark), STATE_ANNOTATION: state}
        try:
            with counted(OUTCOMES_WRITES, self.settings.lease_name):
                write(self.api, "PUT", self._path, body=lease, timeout=OBJECT_TIMEOUT)
        except ApiConflict:  # another replica wrote the Lease since it was read (counted as a conflict)
            return False
        return True


def _watermark(lease: dict[str, Any]) -> float | None:
    return parse_time(((lease.get("metadata") or {}).get("annotations") or {}).get(WATERMARK_ANNOTATION))


def _deferred(totals: Any) -> dict[str, float]:
    """The launches W passed undecided, as written with the totals: pod UID -> anchor."""
    found = totals.get("deferred") if isinstance(totals, dict) else None
    if not isinstance(found, dict):
        return {}
    return {str(uid): float(anchor) for uid, anchor in found.items() if isinstance(anchor, int | float)}


class LocalCounter:
    """Counting without an API server: one process, its watermark in memory (`serve --snapshot`, demo)."""

    def __init__(self, outcomes: Outcomes, clock: Callable[[], float] = time.time,
                 start: float | None = None) -> None:
        self.outcomes, self.clock = outcomes, clock
        outcomes.count()
        self.watermark = start  # None: counting starts at the first turn, less `settle`
        self.deferred: dict[str, float] = {}

    def step(self) -> int:
        """Move the watermark and count; returns how many events were counted."""
        if not self.outcomes.prime():
            return 0
        now = self.clock()
        if self.watermark is None:
            self.watermark = now - self.outcomes.settle
            self.outcomes.settled(self.watermark, {})
            self.outcomes.load(None)  # counting starts: the totals are this process's
            return 0
        turn = self.outcomes.turn(now, self.watermark, self.deferred)
        if turn is None:
            return 0
        self.outcomes.emit(turn.batch)
        self.outcomes.settled(turn.until, turn.deferred)
        self.watermark, self.deferred = turn.until, turn.deferred
        return len(turn.batch)
