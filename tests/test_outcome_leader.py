"""Counted once per cluster: a day of changes replayed into the fake API server, watched by replicas
that each run the real list+watch loop and an OutcomeCounter on one Lease; a replica crashes, another
restarts; the sum of their counters is the story's figures, each launch counted once."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gpu_placement.outcomes.counter import WATERMARK_ANNOTATION
from gpu_placement.outcomes.store import pack
from gpu_placement.samples.history import day
from tests.fakeapi import FakeApiServer
from tests.outcome_replay import START, Clock, truth_histograms
from tests.support.outcomes import SETTINGS, Cluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # slow: a day replayed through replicas that crash


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
