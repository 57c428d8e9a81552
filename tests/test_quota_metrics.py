"""The webhook's quota metrics as /metrics shows them: holds outstanding and the oldest one's age,
how holds end, the lists that settle them, and the GETs of namespaces the view lacked."""

from __future__ import annotations

import asyncio

import pytest

from gpu_placement.base.config import Config
from gpu_placement.observe.metrics import exposition
from gpu_placement.samples.cluster import make_pod, namespace
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from tests.fakeapi import FakeApiServer
from tests.support.metrics import sample
from webhook.holds import HoldChecker
from webhook.namespace_reader import NamespaceReader
from webhook.quota import Reservations

pytestmark = pytest.mark.timeout(30)

GPU = (("nvidia.com/gpu", 1),)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def settled(outcome: str) -> float:
    return sample("gpu_placement_quota_hold_settlements_total", outcome=outcome)


def test_holds_outstanding_their_age_and_how_each_ends() -> None:
    clock = Clock()
    config = Config()
    view = ClusterView(config, clock=clock)
    holds = Reservations(view, ttl_seconds=10, listed=True)
    before = {outcome: settled(outcome) for outcome in ("seen", "released", "not_created", "expired")}
    with view.lock:
        holds.hold("research", "research/a", "uid-a", GPU)
        clock.now += 4
        holds.hold("research", "research/b", "uid-b", GPU)
        holds.hold("research", "research/c", "uid-c", GPU)
    clock.now += 3
    assert sample("gpu_placement_quota_holds") == 3
    assert sample("gpu_placement_quota_hold_oldest_age_seconds") == 7  # research/a, made 7 s ago

    # The view shows a; this webhook denies b on a retried call; a list after c's time lacks it.
    pod = make_pod("research", "a", gpus={"nvidia.com/gpu": 1}, uid="uid-a")
    Ingest(config).replace(view, "pods", [pod])
    clock.now += 10
    with view.lock:
        holds.release("research", "research/b", "uid-b")
        assert holds.pending("research") == {"nvidia.com/gpu": 1}  # c only: a counts in the view now
        assert holds.settle("research", clock.now, {}) == 1
    assert [settled(o) - before[o] for o in ("seen", "released", "not_created", "expired")] == [1, 1, 1, 0]
    assert sample("gpu_placement_quota_holds") == 0
    assert sample("gpu_placement_quota_hold_oldest_age_seconds") == 0


def test_without_an_api_server_holds_expire_and_say_so() -> None:
    clock = Clock()
    view = ClusterView(Config(), clock=clock)
    holds = Reservations(view, ttl_seconds=5, listed=False)
    before = settled("expired")
    with view.lock:
        holds.hold("research", "research/a", "", GPU)
    clock.now += 6
    with view.lock:
        assert holds.pending("research") == {}
    assert settled("expired") == before + 1
    assert "gpu_placement_quota_holds 0.0" in exposition().decode()


def test_the_lists_that_settle_holds_count_their_outcome(fake_api: FakeApiServer) -> None:
    clock = Clock()
    view = ClusterView(Config(), clock=clock)
    holds = Reservations(view, ttl_seconds=1, listed=True)
    lists = "gpu_placement_quota_hold_lists_total"
    ok, refused = sample(lists, outcome="ok"), sample(lists, outcome="refused")
    with fake_api.api_client() as api:
        checker = HoldChecker(holds, api, recheck=0)
        with view.lock:
            holds.hold("research", "research/a", "uid-a", GPU)
        clock.now += 2
        fake_api.fail_next(1, 403, reason="Forbidden", path="/api/v1/namespaces/research/pods")
        assert checker.check() == 0  # a failed list settles nothing: the namespace stays full
        assert sample(lists, outcome="refused") == refused + 1 and sample("gpu_placement_quota_holds") == 1
        clock.now += 1
        assert checker.check() == 1
        assert sample(lists, outcome="ok") == ok + 1 and sample("gpu_placement_quota_holds") == 0


def test_namespace_reads_count_by_outcome(fake_api: FakeApiServer) -> None:
    fake_api.add(namespace("fresh", {"gpu-placement.io/quota": "nvidia.com/gpu=2"}))
    reads = "gpu_placement_namespace_reads_total"
    before = {o: sample(reads, outcome=o) for o in ("ok", "not_found", "refused")}
    view = ClusterView(Config())
    with fake_api.api_client() as api:
        reader = NamespaceReader(view, api, retry_seconds=0)
        asyncio.run(reader.read("fresh"))
        asyncio.run(reader.read("missing"))
        fake_api.fail_next(1, 429, reason="TooManyRequests", path="/api/v1/namespaces/late")
        asyncio.run(reader.read("late"))
    assert reader.record("fresh")[0] is not None
    assert {o: sample(reads, outcome=o) - before[o] for o in before} == {"ok": 1, "not_found": 1, "refused": 1}
