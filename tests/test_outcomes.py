"""Launch outcomes and node lifecycle times from the objects' own timestamps (gpu_placement/outcomes/record.py),
on a view fed a day of changes (gpu_placement/samples/history.py) with the clock following the objects."""

from __future__ import annotations

from gpu_placement.outcomes.counter import LocalCounter
from gpu_placement.outcomes.record import SETTLE_SECONDS, wait_reason
from gpu_placement.samples.history import day
from tests.outcome_replay import START, Clock, ViewReplica, apply, exposition, figures, run, truth_histograms


def replay(until: float = START + 26 * 3600) -> tuple[ViewReplica, LocalCounter]:
    changes, _ = day(START)
    clock = Clock(START - 3 * 3600)
    replica = ViewReplica(clock)
    counter = LocalCounter(replica.outcomes, clock)
    run(changes, clock, until, 30.0, lambda change: apply(replica.ingest, replica.view, change), counter.step)
    return replica, counter


def test_a_day_is_counted_as_the_story_says() -> None:
    _, truth = day(START)
    replica, _ = replay()
    starts, histograms = figures(exposition(replica.outcomes))
    assert starts == truth.starts
    assert histograms == truth_histograms(truth)
    # The figures themselves, not only their counts: preparation, recovery and exclusion times.
    ready = replica.outcomes.histograms["gpu_placement_node_ready_seconds"]
    assert {labels: h.total for labels, h in ready.items() if h.count} == {
        (pool, product): took for pool, product, took in truth.ready}
    recovery = replica.outcomes.histograms["gpu_placement_node_recovery_seconds"]
    assert {labels: h.total for labels, h in recovery.items() if h.count} == {
        (pool, product, reason): took for pool, product, reason, took in truth.recovery}
    exclusion = replica.outcomes.histograms["gpu_placement_node_exclusion_seconds"]
    assert {labels: h.total for labels, h in exclusion.items() if h.count} == {
        (pool, product, reason): took for pool, product, reason, took in truth.exclusion}
    assert {node: since for node, (_, _, since) in replica.outcomes.preparing().items()} == truth.preparing


def test_counting_flows_past_a_launch_still_undecided() -> None:
    """The stuck pod (ContainerCreating from 17:00) is deferred, not waited for: the jobs that start at
    17:02 and 17:17 are counted while it is undecided; at 18:00 it counts as not_started, once."""
    before, _ = figures(exposition(replay(until=START + 17 * 3600)[0].outcomes))
    replica, counter = replay(until=START + 17 * 3600 + 30 * 60)
    assert counter.watermark is not None and counter.watermark >= START + 17 * 3600 + 30 * 60 - SETTLE_SECONDS - 30
    assert list(counter.deferred) == ["uid-job-083"]  # the stuck one, bound to batch-1 at 17:00
    held, _ = figures(exposition(replica.outcomes))
    assert held[("failed", "not_started", "batch", "true")] == 0
    assert held[("started", "none", "training", "true")] + held[("started", "none", "batch", "true")] == (
        before[("started", "none", "training", "true")] + before[("started", "none", "batch", "true")] + 2)
    replica, counter = replay(until=START + 18 * 3600 + 10 * 60)
    after, _ = figures(exposition(replica.outcomes))
    assert after[("failed", "not_started", "batch", "true")] == 1
    assert counter.deferred == {}


def test_wait_reason_is_the_code_of_the_node_that_came_closest() -> None:
    assert wait_reason(("NotValidated", "InsufficientGPU")) == "InsufficientGPU"
    assert wait_reason(("SchedulingGated",)) == "SchedulingGated"
    assert wait_reason(("Insufficient nvidia.com/gpu", "NodeAffinity")) == "Insufficient"
    assert wait_reason(()) == "none"


def test_only_a_view_something_counts_from_keeps_events() -> None:
    """The extender's process has the tracker (idle gauges, preparing nodes) but no counter: it keeps no
    event, so nothing grows with the pods it sees. A counter's view keeps only what is not counted yet."""
    changes, _ = day(START)
    clock = Clock(START - 3 * 3600)
    idle = ViewReplica(clock)
    run(changes, clock, START + 26 * 3600, 300.0, lambda change: apply(idle.ingest, idle.view, change), lambda: None)
    assert (len(idle.outcomes._launches), len(idle.outcomes._events)) == (0, 0)
    assert "batch-4" in idle.outcomes.preparing()
    counted, counter = replay()
    assert counter.watermark is not None
    assert all((e.launch.anchor or 0) > counter.watermark for e in counted.outcomes._launches.values())
    assert len(counted.outcomes._launches) + len(counted.outcomes._events) < 5
