"""Counted once per cluster: a day of changes replayed into the fake API server, watched by replicas
that each run the real list+watch loop and an OutcomeCounter on one Lease; a replica crashes, another
restarts; the sum of their counters is the story's figures, each launch counted once."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpu_placement.kube.api import WatchSettings
from gpu_placement.outcomes.counter import WATERMARK_ANNOTATION, CounterSettings, OutcomeCounter
from gpu_placement.outcomes.record import Outcomes
from gpu_placement.outcomes.store import pack
from gpu_placement.samples.history import Change, day
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from gpu_placement.view.live import LiveSource
from tests.fakeapi import FakeApiServer
from tests.outcome_replay import START, Clock, config, exposition, figures, truth_histograms
from tests.test_live import wait_for

pytestmark = pytest.mark.timeout(300)

FAST_WATCH = WatchSettings(connect_timeout=1.0, read_timeout=2.0, server_timeout=30, client_timeout=35.0,
                           backoff_initial=0.05, backoff_max=0.3)
# In replay seconds: the holder renews every turn; a crashed holder's Lease runs out after 5 minutes.
SETTINGS = CounterSettings(lease_name="gpu-placement-outcomes", lease_seconds=300, renew_seconds=10.0)
STEP = 120.0


class Replica:
    """One webhook replica: its view from the real list+watch loop, its Outcomes and counter."""

    def __init__(self, fake: FakeApiServer, identity: str, clock: Clock) -> None:
        self.identity = identity
        self.config = config()
        self.view = ClusterView(self.config)
        self.ingest = Ingest(self.config)
        self.api = fake.api_client()
        self.source = LiveSource(self.view, self.ingest, self.api, FAST_WATCH)
        self.outcomes = Outcomes(self.view, self.config, clock=clock).start()
        self.counter = OutcomeCounter(self.api, self.outcomes, "gpu-placement", identity, SETTINGS, clock)
        self.alive = False

    def start(self) -> Replica:
        self.source.start()
        wait_for(lambda: self.source.ready, what="the first lists")
        self.alive = True
        return self

    def crash(self) -> None:
        """Gone without a word: its Lease runs out by itself."""
        self.alive = False
        self.source.stop()

    def stop(self) -> None:
        """A clean stop (a rolling update): the Lease is handed over at once."""
        if self.alive:
            self.alive = False
            self.counter.stop()
            self.source.stop()

    def sees(self, stored: dict[tuple[str, str | None, str], Any]) -> bool:
        for (kind, namespace, name), obj in stored.items():
            if kind == "Pod":
                record = self.view.pods.get(f"{namespace}/{name}")
                if (record.version if record else None) != (int(obj["metadata"]["resourceVersion"]) if obj else None):
                    return False
            elif kind == "Node":
                if self.view.nodes.get(name) != (self.ingest.node(obj) if obj else None):
                    return False
            elif (name in self.view.namespaces) != bool(obj):
                return False
        return True


class Cluster:
    def __init__(self, fake: FakeApiServer, clock: Clock) -> None:
        self.fake, self.clock = fake, clock
        self.replicas: dict[str, Replica] = {}
        self.retired: list[Replica] = []
        fake.add({"kind": "Namespace", "metadata": {"name": "gpu-placement"}})

    def start(self, identity: str) -> Replica:
        replica = self.replicas[identity] = Replica(self.fake, identity, self.clock).start()
        return replica

    def retire(self, identity: str, crash: bool) -> None:
        replica = self.replicas.pop(identity)
        replica.crash() if crash else replica.stop()
        self.retired.append(replica)

    def apply(self, changes: list[Change]) -> None:
        stored: dict[tuple[str, str | None, str], Any] = {}
        for change in changes:
            kind, namespace, name = change.key
            if change.deleted:
                self.fake.delete(kind, name, namespace)
                stored[change.key] = None
            else:
                stored[change.key] = self.fake.upsert(change.obj, keep_uid=True, keep_created=True)
        for replica in self.replicas.values():
            wait_for(lambda r=replica: r.sees(stored), what="the views to catch up")

    def run(self, changes: list[Change], until: float, events: dict[float, Any],
            after_turn: Callable[[Cluster], None] | None = None, step: float = STEP) -> None:
        """Turns every `step` of replay time; `events`: at a replay time, something to do to the replicas;
        `after_turn`: called after each turn (a scrape)."""
        pending = list(changes)
        while self.clock.now < until:
            turn = self.clock.now + step
            for at in sorted(t for t in events if self.clock.now < t <= turn):
                self._due(pending, at)
                events.pop(at)(self)
            self._due(pending, turn)
            self.clock.now = turn
            for replica in list(self.replicas.values()):
                replica.counter.step()
            if after_turn is not None:
                after_turn(self)

    def _due(self, pending: list[Change], until: float) -> None:
        while pending and pending[0].at <= until:
            at = pending[0].at
            batch = []
            while pending and pending[0].at == at:
                batch.append(pending.pop(0))
            self.clock.now = max(self.clock.now, at)
            self.apply(batch)

    def totals(self) -> tuple[Counter[tuple[str, ...]], dict[str, Counter[tuple[str, ...]]]]:
        """What every replica running now exports: the cluster's totals, the same on each."""
        exported = [figures(exposition(replica.outcomes)) for replica in self.replicas.values()]
        for other in exported[1:]:
            assert other == exported[0], "replicas export different totals"
        return exported[0]

    def close(self) -> None:
        for replica in list(self.replicas.values()):
            replica.stop()
        for replica in [*self.retired, *self.replicas.values()]:
            replica.api.close()


@pytest.fixture
def cluster(fake_api: FakeApiServer) -> Iterator[Cluster]:
    made = Cluster(fake_api, Clock(START - 3 * 3600))
    yield made
    made.close()
    gc.unfreeze()


def watermark(fake: FakeApiServer) -> str | None:
    lease = fake.get("Lease", SETTINGS.lease_name, "gpu-placement") or {}
    return (lease.get("metadata", {}).get("annotations") or {}).get(WATERMARK_ANNOTATION)


def test_two_replicas_and_a_crash_count_each_event_once(cluster: Cluster) -> None:
    """A and B watch the whole day. A leads until it crashes at 08:30, in the middle of train-3's
    outage (B saw it go out, and counts its recovery); A comes back at 11:00 as a fresh process and
    stands by. Every launch, wait and node time is counted exactly once over the three processes."""
    changes, truth = day(START)
    cluster.start("a")
    cluster.start("b")
    cluster.run(changes, START + 26 * 3600, {
        START + 8.5 * 3600: lambda c: c.retire("a", crash=True),
        START + 11 * 3600: lambda c: c.start("a2"),
    })
    starts, histograms = cluster.totals()  # b's and a2's, equal
    assert starts == truth.starts
    assert histograms == truth_histograms(truth)
    assert [r.counter.counted > 0 for r in cluster.retired] == [True]  # A counted until it crashed
    assert cluster.replicas["b"].counter.counted > 0 and cluster.replicas["a2"].counter.counted == 0
    assert watermark(cluster.fake) is not None


def test_a_restart_neither_counts_twice_nor_loses(cluster: Cluster) -> None:
    """One replica, stopped at 09:58 and started again at 10:04 as a new process with an empty view.
    A pod started while it was down (job bound 09:57:30, running 09:59): counted once, after the restart."""
    changes, truth = day(START)
    cluster.start("a")
    cluster.run(changes, START + 26 * 3600, {
        START + 598 * 60: lambda c: c.retire("a", crash=False),
        START + 604 * 60: lambda c: c.start("a2"),
    })
    starts, histograms = cluster.totals()
    assert starts == truth.starts
    expected = truth_histograms(truth)
    # That pod was bound at 09:57:30, its wait not yet counted at the stop; the new process never saw it
    # pending, so it cannot tell why it waited (3 s): counted once, as `unknown`.
    waits = expected["gpu_placement_gpu_pod_wait_seconds"]
    waits[("training", "none")] -= 1
    waits[("training", "unknown")] += 1
    assert histograms == expected
    before, after = cluster.retired[0].counter.counted, cluster.replicas["a2"].counter.counted
    assert before > 0 and after > 0


def test_a_stale_lease_counts_nothing(cluster: Cluster) -> None:
    """The compare-and-swap: a holder whose Lease changed since it read it (another replica wrote it)
    gets 409 for its watermark write, and counts nothing of that turn."""
    changes, _ = day(START)
    a = cluster.start("a")
    cluster.run(changes, START + 3600, {})
    lease = a.counter._read()
    counted = dict(a.outcomes.counts)
    cluster.fake.set_annotations("Lease", SETTINGS.lease_name, {"touched": "by another writer"}, "gpu-placement")
    assert not a.counter._write(lease, START + 3000, pack(a.outcomes.totals(), None, {}).text)
    assert a.outcomes.counts == counted
