"""Counting flows past a launch still undecided (gpu_placement/outcomes/record.py, the deferred set): a GPU
pod stuck in ContainerCreating holds no figure back, and each launch is still counted once, by one
replica, across a crash and a restart. The stories go into the fake API server; replicas run the real
list+watch loop and the OutcomeCounter, on a clock that follows the objects (turns every 10 s)."""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator

import pytest
from prometheus_client import REGISTRY

from gpu_placement.outcomes.counter import LocalCounter, OutcomeCounter
from gpu_placement.outcomes.record import SETTLE_SECONDS, START_HORIZON_SECONDS
from gpu_placement.samples.cluster import namespace
from gpu_placement.samples.history import H100, Change, Story, Truth
from tests.fakeapi import FakeApiServer
from tests.outcome_replay import START, Clock, ViewReplica, apply, exposition, figures, held, truth_histograms
from tests.support.outcomes import SETTINGS, Cluster

pytestmark = [pytest.mark.timeout(300), pytest.mark.slow]  # slow: stories replayed through replicas that crash

M = 60.0
TURN = SETTINGS.renew_seconds
STUCK, BIG, STARTS, FAILS, LATE = 0, 1, 2, 3, 4  # the story's pods, by index (job-000 ...)
READY = "gpu_placement_node_ready_seconds"


def story(late_kubelet: bool = False) -> tuple[list[Change], Truth, dict[str, float]]:
    """A node that serves; at 05:00 a GPU pod bound there stays in ContainerCreating for ever (a volume
    that never mounts); at 08:00 one pulls a 20-minute image; at 10:00 one starts, at 12:00 one fails on
    the node (the device plugin's Allocate); a node that joined at 10:00 is verified at 16:00. Returns
    the changes, the figures, and when each figure may be counted at the latest: SETTLE_SECONDS plus one
    turn after its anchor, or one turn after its decision when that comes later."""
    told = Story(START)
    told.put(-2 * 3600, namespace("ml"))
    told.put(-2 * 3600, namespace("gpu-operator"))
    old = -30 * 86400.0
    told.put(-2 * 3600, told.node("train-1", "training", H100, old))
    told.put(-2 * 3600, told.validator("train-1", old + 120, old + 600))
    joined = 10 * M
    told.put(joined, told.node("train-2", "training", H100, joined, ready_at=joined + 60))
    told.put(joined + 90, told.validator("train-2", joined + 90, None))
    told.put(16 * M, told.validator("train-2", joined + 90, 16 * M))
    told.truth.ready.append(("training", H100, 6 * M))
    for index, created, what in ((STUCK, 5 * M, "stuck"), (BIG, 8 * M, "big_image"), (STARTS, 10 * M, "start"),
                                 (FAILS, 12 * M, "device_plugin")):
        told.launch(index, created, "train-1", story=what)
    if late_kubelet:  # bound at 20:03 to a node whose kubelet takes it only at 30:03 (startTime), runs at 30:28
        told.launch(LATE, 20 * M, "train-1", story="start", taken_after=10 * M)
    late = SETTLE_SECONDS + TURN
    due = {"started": START + 10 * M + 5 + late, "device_plugin": START + 12 * M + 5 + late,
           "ready": START + 16 * M + late, "big_image": START + 8 * M + 5 + 20 * M + 1 + TURN,
           "not_started": START + 5 * M + 5 + START_HORIZON_SECONDS + TURN}
    return sorted(told.changes, key=lambda c: c.at), told.truth, due


def counted(starts: Counter[tuple[str, ...]], histograms: dict[str, Counter[tuple[str, ...]]]) -> set[str]:
    """Which of the story's figures the exposition shows."""
    found = {"ready"} if histograms.get(READY, Counter())[("training", H100)] else set()
    started = starts[("started", "none", "training", "true")]
    found |= {"started"} if started >= 1 else set()
    found |= {"big_image"} if started >= 2 else set()
    found |= {"device_plugin"} if starts[("failed", "device_plugin", "training", "true")] else set()
    return found | ({"not_started"} if starts[("failed", "not_started", "training", "true")] else set())


def expected(truth: Truth) -> dict[str, Counter[tuple[str, ...]]]:
    """The story's histogram counts (the families it has observations of)."""
    return {metric: counts for metric, counts in truth_histograms(truth).items() if counts}


@pytest.fixture
def cluster(fake_api: FakeApiServer) -> Iterator[Cluster]:
    made = Cluster(fake_api, Clock(START - 5 * M))
    yield made
    made.close()


def test_a_pod_stuck_in_container_creating_holds_no_figure_back(cluster: Cluster) -> None:
    """Each figure is counted within SETTLE_SECONDS plus one turn of its anchor (a launch decided later:
    one turn after its decision), while the pod bound at 05:00 stays in ContainerCreating; that one
    counts not_started an hour after it was taken, and every launch once."""
    changes, truth, due = story()
    cluster.start("a")
    seen: dict[str, float] = {}

    def scrape(c: Cluster) -> None:
        for figure in counted(*c.totals()) - seen.keys():
            seen[figure] = c.clock.now

    cluster.run(changes, START + 5 * M + START_HORIZON_SECONDS + 2 * TURN, {}, scrape, step=TURN)
    late = {figure: (seen.get(figure), at) for figure, at in due.items() if seen.get(figure, float("inf")) > at}
    assert late == {}, "counted later than due (counted at, due by)"
    starts, histograms = cluster.totals()
    assert starts == truth.starts
    assert histograms == expected(truth)
    assert cluster.replicas["a"].outcomes.deferred == {}


def test_a_crash_while_launches_are_deferred_counts_each_once(cluster: Cluster) -> None:
    """A leads, defers the stuck pod and the big image's, and crashes at 11:00; B takes the Lease when
    A's runs out (5 minutes on) and reads the deferred set: it counts the big image's launch when it
    starts (28:06), once, and the stuck pod's at the horizon; A comes back at 40:00 as a fresh process
    and stands by."""
    changes, truth, _ = story()
    cluster.start("a")
    cluster.start("b")
    cluster.run(changes, START + 5 * M + START_HORIZON_SECONDS + 2 * TURN, {
        START + 11 * M: lambda c: c.retire("a", crash=True),
        START + 40 * M: lambda c: c.start("a2"),
    }, step=TURN)
    starts, histograms = cluster.totals()
    assert starts == truth.starts
    assert histograms == expected(truth)
    a = cluster.retired[0]
    assert set(a.outcomes.deferred) == {"uid-job-000", "uid-job-001"}
    assert a.counter.counted == 2  # the two pods' waits
    assert cluster.replicas["b"].counter.counted == 7 and cluster.replicas["a2"].counter.counted == 0


def test_a_restart_while_a_launch_is_deferred_counts_it_once(cluster: Cluster) -> None:
    """One replica, stopped at 20:00 with the big image's pod deferred, started again at 30:00 as a new
    process (the pod started at 28:06 meanwhile): it reads the deferred set back and counts it, once."""
    changes, truth, _ = story()
    cluster.start("a")
    cluster.run(changes, START + 5 * M + START_HORIZON_SECONDS + 2 * TURN, {
        START + 20 * M: lambda c: c.retire("a", crash=False),
        START + 30 * M: lambda c: c.start("a2"),
    }, step=TURN)
    starts, histograms = cluster.totals()
    assert starts == truth.starts
    assert histograms == expected(truth)
    before, after = cluster.retired[0].counter.counted, cluster.replicas["a2"].counter.counted
    assert (before, after) == (7, 2)  # after: the big image's launch, and the stuck pod's at the horizon


class Replay:
    """One view fed straight from the changes, counted by a LocalCounter, a turn every 10 s."""

    def __init__(self, changes: list[Change]) -> None:
        self.changes, self.applied = changes, 0
        self.clock = Clock(START - 5 * M)
        self.replica = ViewReplica(self.clock)
        self.counter = LocalCounter(self.replica.outcomes, self.clock)

    def until(self, at: float) -> set[str]:
        """Turns until `at`; the story's figures counted by then."""
        while self.clock.now < at:
            turn = self.clock.now + TURN
            while self.applied < len(self.changes) and self.changes[self.applied].at <= turn:
                change = self.changes[self.applied]
                self.clock.now = max(self.clock.now, change.at)
                apply(self.replica.ingest, self.replica.view, change)
                self.applied += 1
            self.clock.now = turn
            self.counter.step()
        return counted(*figures(exposition(self.replica.outcomes)))


def test_a_deferred_pod_deleted_undecided_is_not_counted() -> None:
    """The stuck pod deleted at 30:00 (its owner gave up): no launch to count; it leaves the deferred set."""
    changes, truth, due = story()
    stuck = next(c for c in reversed(changes) if c.key == ("Pod", "ml", "job-000"))
    replay = Replay(sorted([*changes, Change(START + 30 * M, stuck.obj, deleted=True)], key=lambda c: c.at))
    replay.until(START + 29 * M)
    assert list(replay.counter.deferred) == ["uid-job-000"]
    replay.until(START + 30 * M + TURN)
    assert replay.counter.deferred == {}
    assert replay.until(due["not_started"]) == {"started", "device_plugin", "ready", "big_image"}
    truth.starts[("failed", "not_started", "training", "true")] -= 1
    starts, histograms = figures(exposition(replay.replica.outcomes))
    assert +starts == +truth.starts and histograms == expected(truth)


def test_a_launch_deferred_before_its_kubelet_took_it_is_counted_once() -> None:
    """A pod bound at 20:03 whose kubelet takes it only at 30:03: deferred at its binding (no startTime
    yet), its anchor moves to 30:03, past W; it leaves the deferred set and is counted when W passes
    30:03, once (counted from the set as well, it would be counted twice)."""
    changes, truth, _ = story(late_kubelet=True)
    replay = Replay(changes)
    replay.until(START + 29 * M)
    assert set(replay.counter.deferred) == {"uid-job-000", "uid-job-004"}
    replay.until(START + 5 * M + START_HORIZON_SECONDS + 2 * TURN)
    starts, histograms = figures(exposition(replay.replica.outcomes))
    assert starts == truth.starts and histograms == expected(truth)


def test_a_crash_after_a_launch_left_the_deferred_set_counts_it_once(cluster: Cluster) -> None:
    """The late kubelet's pod again, with A (leading) crashing at 31:00, after the pod left the deferred
    set and before W passed its new anchor: B counts it; A comes back as a fresh process and stands by."""
    changes, truth, _ = story(late_kubelet=True)
    cluster.start("a")
    cluster.start("b")
    cluster.run(changes, START + 5 * M + START_HORIZON_SECONDS + 2 * TURN, {
        START + 31 * M: lambda c: c.retire("a", crash=True),
        START + 40 * M: lambda c: c.start("a2"),
    }, step=TURN)
    starts, histograms = cluster.totals()
    assert starts == truth.starts and histograms == expected(truth)


def test_the_deferred_set_is_bounded_and_the_watermark_waits_beyond(monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for one deferred launch, the big image's pod (the second undecided) holds the watermark
    below its anchor, as every undecided launch did before: the launches after it wait until it starts."""
    monkeypatch.setattr("gpu_placement.outcomes.record.MAX_DEFERRED", 1)
    changes, _, due = story()
    replay = Replay(changes)
    assert replay.until(due["ready"]) == set()
    assert list(replay.counter.deferred) == ["uid-job-000"]
    assert replay.counter.watermark is not None and START + 8 * M < replay.counter.watermark < START + 8 * M + 5
    assert replay.until(due["big_image"]) == {"started", "device_plugin", "ready", "big_image"}


def writes(outcome: str) -> float:
    return REGISTRY.get_sample_value("gpu_placement_outcomes_writes_total",
                                     {"lease": SETTINGS.lease_name, "outcome": outcome}) or 0.0


def test_a_failed_watermark_write_is_logged_counted_and_retried(fake_api: FakeApiServer,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    """The holder's write of W refused twice in a row as it passes the node's verification (a 500, then
    a 422: each logged, each counted in gpu_placement_outcomes_writes_total): those turns count nothing,
    the replica still leads, and the next turn counts what they could not; in the end every event of the
    story once."""
    fake_api.add({"kind": "Namespace", "metadata": {"name": "gpu-placement"}})
    changes, truth, _ = story()
    clock = Clock(START - 5 * M)
    replica = ViewReplica(clock)
    counter = OutcomeCounter(fake_api.api_client(), replica.outcomes, "gpu-placement", "a", SETTINGS, clock)
    applied = iter(changes)
    upcoming = next(applied, None)

    def turn(at: float) -> None:
        nonlocal upcoming
        clock.now = at
        while upcoming is not None and upcoming.at <= clock.now:
            apply(replica.ingest, replica.view, upcoming)
            upcoming = next(applied, None)
        counter.step()

    verified = START + 16 * M + SETTLE_SECONDS  # W passes the node's verification from here
    while clock.now < verified - 20:
        turn(clock.now + TURN)
    turn(verified - 2)  # renews the Lease (10 s are up): the next turns' only PUT is the watermark's
    refused, ok = writes("refused"), writes("ok")
    counted = held(replica.outcomes)
    assert READY not in {metric for metric, table in counted[1].items() if table} and counter.leading
    caplog.set_level(logging.INFO, "gpu_placement.outcomes.record")
    path = f"/apis/coordination.k8s.io/v1/namespaces/gpu-placement/leases/{SETTINGS.lease_name}"
    for status, at in ((500, verified), (422, verified + 2)):
        fake_api.fail_next(1, status, method="PUT", path=path)
        turn(at)
        assert counter.leading and held(replica.outcomes) == counted  # nothing counted, nothing lost
        assert any(r.levelno == logging.ERROR and f"HTTP {status}" in r.getMessage() for r in caplog.records)
        caplog.clear()
    assert (writes("refused"), writes("ok")) == (refused + 2, ok)
    turn(verified + 4)
    assert counter.last_error is None and writes("ok") == ok + 1
    assert "the API server answers again" in caplog.text
    assert held(replica.outcomes)[1][READY]  # the node's preparation, counted now
    while clock.now < START + 5 * M + START_HORIZON_SECONDS + 2 * TURN:
        turn(clock.now + TURN)
    starts, histograms = figures(exposition(replica.outcomes))
    assert starts == truth.starts and histograms == expected(truth)
