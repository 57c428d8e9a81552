"""Outcome counting on the fake API: replicas of the outcome counter that share one Lease."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

from gpu_placement.kube.api import WatchSettings
from gpu_placement.outcomes.counter import CounterSettings, OutcomeCounter
from gpu_placement.outcomes.record import Outcomes
from gpu_placement.samples.history import Change
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from gpu_placement.view.live import LiveSource
from tests.fakeapi import FakeApiServer
from tests.outcome_replay import Clock, config, exposition, figures
from tests.support.waiting import wait_for

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
