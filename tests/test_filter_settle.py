"""When a /filter that passes no node waits for the view (extender/settle.py), and what that costs.

kube-scheduler is serial: every millisecond a /filter waits is a millisecond no pod is scheduled. A
wait is made only where the view is plausibly behind kube-scheduler's informers (the pod sent is newer
than the view's pods, or kube-scheduler sent the same pod again for the same answer), once per round
of retries at a view generation, never for a pod every node rejects for what it is, and all waits
together stay within a budget. Counted in gpu_placement_filter_settle_seconds / _denied_total /
_skipped_total.
"""

from __future__ import annotations

import asyncio
import itertools
import threading
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import httpx
import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from extender import settle as settle_module
from extender.app import create_app
from extender.binding import SnapshotBinder
from extender.settle import (
    BACKLOG_ANSWERS,
    LAGGING,
    RETRIED,
    SETTLE_BURST,
    SETTLE_SECONDS,
    STANDING_CODES,
    Budget,
    Settle,
    newer,
    standing,
)
from gpu_placement.app.assembly import core_from_objects
from gpu_placement.base.config import Config
from gpu_placement.decide.placement import FilterResult, Placement
from gpu_placement.decide.rules import (
    CODES,
    DRIVER_TOO_OLD,
    INSUFFICIENT_GPU,
    INSUFFICIENT_GPU_MEMORY,
    NOT_VALIDATED,
    UNKNOWN_NODE,
)
from gpu_placement.samples.cluster import make_node, make_pod, namespace, validator_pod
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from gpu_placement.view.live import LiveSource
from gpu_placement.web.serving import ServerThread, make_server
from tests.fakeapi import FakeApiServer
from tests.support.live import FAST
from tests.support.waiting import wait_for

Live = Callable[[list[dict[str, Any]]], "_Live"]

pytestmark = pytest.mark.timeout(60)

SHARED = "nvidia.com/gpu.shared"
IMAGE = "registry.example.com/inference/chat:1.4"
T4S = [f"t4-{i}" for i in range(4)]


class Extender:
    """The extender app over HTTP on `view`; `metrics()` reads its /metrics as Prometheus would."""

    def __init__(self, view: ClusterView, config: Config, ready: Callable[[], tuple[bool, str]]) -> None:
        self.app = create_app(view, Placement(view, config), SnapshotBinder(view), ready)
        self.server = ServerThread(make_server(self.app, "127.0.0.1", 0)).start()
        self.http = httpx.Client(base_url=self.server.url(""), timeout=10)

    def filter(self, pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
        response = self.http.post("/filter", content=orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": names}))
        assert response.status_code == 200, response.text
        return dict(response.json())

    def settle(self) -> dict[str, float]:
        """gpu_placement_filter_settle_* samples by name and labels (`_count{why=retried}`, ...)."""
        text = self.http.get("/metrics").text
        samples: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            if family.name.startswith("gpu_placement_filter_settle"):
                for sample in family.samples:
                    labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                    samples[f"{sample.name}{{{labels}}}"] = sample.value
        return samples

    def close(self) -> None:
        self.http.close()
        self.server.stop()


def _since(before: Mapping[str, float], after: Mapping[str, float], name: str) -> float:
    """The sum over labels of one sample's growth (`count`, `sum`, `denied`)."""
    return sum(value - before.get(key, 0.0) for key, value in after.items() if key.split("{")[0] == name)


def _full_t4s() -> list[dict[str, Any]]:
    """Four time-sliced T4s, replicas free and memory all taken: kube-scheduler's own filters pass them,
    the extender answers InsufficientGPUMemory (the review's repro_filter_settle_wait.py)."""
    objects = [namespace("ml")]
    for name in T4S:
        objects += [make_node(name, "t4-timeslicing", labels={"nvidia.com/gpu.sharing-strategy": "time-slicing"},
                              shared_resource=SHARED), validator_pod(name),
                    make_pod("ml", f"running-{name}", gpus={SHARED: 1}, node=name, image=IMAGE,
                             annotations={"gpu-placement.io/gpu-memory": "15Gi"})]
    return objects


def _waiting(name: str, **annotations: str) -> dict[str, Any]:
    return make_pod("ml", name, gpus={SHARED: 1}, image=IMAGE,
                    annotations={"gpu-placement.io/gpu-memory": "4Gi", **annotations})


@pytest.fixture
def quiet() -> Iterator[Extender]:
    """The full T4s in a view that does not change (the objects are the source)."""
    core = core_from_objects(Config(), _full_t4s())
    extender = Extender(core.view, core.config, core.readiness)
    yield extender
    extender.close()


def test_pods_that_fit_nowhere_are_answered_at_once(quiet: Extender) -> None:
    """The review's finding 6: each of 100 waiting pods' /filter waited 25 ms. A first attempt, of a pod
    the view is not behind on, now waits for nothing: no time in the settle histogram."""
    before = quiet.settle()
    assert "gpu_placement_filter_settle_seconds_count{outcome=unchanged,why=retried}" in before  # accounted
    for i in range(100):
        answer = quiet.filter(_waiting(f"waiting-{i}"), T4S)
        assert answer["NodeNames"] == [] and set(answer["FailedNodes"]) == set(T4S), answer
        assert answer["FailedNodes"]["t4-0"].startswith("InsufficientGPUMemory: ")
    for i in range(100):  # refused everywhere for a reason preemption cannot fix: no wait either
        answer = quiet.filter(_waiting(f"too-new-{i}", **{"gpu-placement.io/cuda": "13.9"}), T4S)
        assert answer["FailedAndUnresolvableNodes"]["t4-0"].startswith("DriverTooOld: ")
    after = quiet.settle()
    assert _since(before, after, "gpu_placement_filter_settle_seconds_count") == 0
    assert _since(before, after, "gpu_placement_filter_settle_seconds_sum") == 0
    assert _since(before, after, "gpu_placement_filter_settle_denied_total") == 0


def test_a_pod_retried_with_nothing_new_waits_only_within_the_budget(quiet: Extender) -> None:
    """The worst case: kube-scheduler sends the same waiting pod again and again, each time in a round
    of its own (moved by events the view does not watch, a pause between them: no wait covers the
    next), and the view never changes. Each retry may wait; all of them together stay within the
    budget: with no time passing for its refill, SETTLE_BURST less the SETTLE_SECONDS a `retried`
    wait leaves for a `lagging` one, and the overrun of the last wait."""
    settle = quiet.app.state.extender.settle
    settle.budget = Budget(clock=lambda: 0.0)  # no refill: only what is saved up
    pauses = itertools.count()
    settle.clock = lambda: next(pauses) * 1.0  # a second between any two looks: every retry a new round
    pod = _waiting("retried")
    first = quiet.filter(pod, T4S)
    before = quiet.settle()
    for _ in range(100):
        assert quiet.filter(pod, T4S) == first  # the same answer, waited for or not
    after = quiet.settle()
    waits = _since(before, after, "gpu_placement_filter_settle_seconds_count")
    waited = _since(before, after, "gpu_placement_filter_settle_seconds_sum")
    assert 1 <= waits <= (SETTLE_BURST - SETTLE_SECONDS) / SETTLE_SECONDS, after
    refused = _since(before, after, "gpu_placement_filter_settle_denied_total") + after[
        "gpu_placement_filter_settle_skipped_total{cause=backlog,why=retried}"] - before.get(
        "gpu_placement_filter_settle_skipped_total{cause=backlog,why=retried}", 0.0)
    assert refused == 100 - waits, after
    assert waited <= SETTLE_BURST + _longest(before, after) - 2 * SETTLE_SECONDS, (waited, after)


def test_a_round_of_retries_waits_once(quiet: Extender) -> None:
    """The review's finding 3: an event moves every pod the extender rejected, and kube-scheduler sends
    them one after the other. The first one's wait finds the view unchanged; the others, in the same
    round at the same view generation, would find no more (main: four of them waited 50 ms each, the
    budget's whole burst, and the rest were denied). One waits; the budget is left for the next race."""
    settle = quiet.app.state.extender.settle
    settle.clock = lambda: 0.0  # kube-scheduler sends them back to back, however slow this machine is
    pods = [_waiting(f"backlog-{i}") for i in range(20)]
    answers = [quiet.filter(pod, T4S) for pod in pods]  # their first attempts
    before = quiet.settle()
    assert [quiet.filter(pod, T4S) for pod in pods] == answers  # the round: same answers
    after = quiet.settle()
    assert _since(before, after, "gpu_placement_filter_settle_seconds_count") == 1, after
    assert after["gpu_placement_filter_settle_seconds_count{outcome=unchanged,why=retried}"] - before[
        "gpu_placement_filter_settle_seconds_count{outcome=unchanged,why=retried}"] == 1
    assert _since(before, after, "gpu_placement_filter_settle_denied_total") == 0
    assert after["gpu_placement_filter_settle_skipped_total{cause=covered,why=retried}"] - before.get(
        "gpu_placement_filter_settle_skipped_total{cause=covered,why=retried}", 0.0) == 19


class _Race:
    """The full T4s, and kube-scheduler's side of a race: `seen(pod)` is a holder's deletion that
    kube-scheduler's informer has and our watch has not; the view applies it during the next wait
    for the view that /filter makes (none, none applied: the answer comes from the view without it)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.objects = _full_t4s()
        core = core_from_objects(Config(), self.objects)
        self.view, self.ingest = core.view, core.ingest
        self.extender = Extender(core.view, core.config, core.readiness)
        self.settle = self.extender.app.state.extender.settle
        self.pending: list[dict[str, Any]] = []
        self.waits: list[str] = []
        settle = settle_module._view_changes

        async def waiting(view: ClusterView, seconds: float, until: str | None = None) -> bool:
            self.waits.append("lagging" if until is not None else "retried")
            if self.pending:  # on its way to our watch: it arrives once the loop is free
                asyncio.get_running_loop().call_soon(self._apply, self.pending.pop())
            return await settle(view, seconds, until)

        monkeypatch.setattr(settle_module, "_view_changes", waiting)

    def seen(self, name: str) -> None:
        self.pending.append(next(o for o in self.objects if o["kind"] == "Pod" and o["metadata"]["name"] == name))

    def _apply(self, pod: dict[str, Any]) -> None:
        self.ingest.event(self.view, "pods", "DELETED", pod)

    def close(self) -> None:
        self.extender.close()


@pytest.fixture
def race(monkeypatch: pytest.MonkeyPatch) -> Iterator[_Race]:
    harness = _Race(monkeypatch)
    yield harness
    harness.close()


def _kept(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod as kube-scheduler's informer keeps it: one resourceVersion across its retries."""
    pod["metadata"]["resourceVersion"] = "500"
    return pod


def test_pods_too_big_for_every_gpu_leave_the_budget_to_a_pod_that_raced_a_deletion(race: _Race) -> None:
    """The review's finding 3 (repro_settle_budget_starved.py): six pods that ask more memory than a T4
    has are retried on an event; then a pod that holds 15 GiB of t4-0 is deleted, kube-scheduler sees
    it first and sends the waiting 4 GiB pod again. On main the six spent the budget's burst (four
    waits of 50 ms, two denied) and the pod was rejected at once from the view without the deletion.
    No event but a node's own change can fit the six anywhere: they do not wait; the raced pod does."""
    late = _kept(_waiting("late"))
    assert race.extender.filter(late, T4S)["NodeNames"] == []  # its first attempt: memory taken
    big = [_kept(_waiting(f"big-{i}", **{"gpu-placement.io/gpu-memory": "40Gi"})) for i in range(6)]
    first = [race.extender.filter(pod, T4S) for pod in big]
    assert all(set(answer["FailedAndUnresolvableNodes"]) == set(T4S) for answer in first), first[0]
    before = race.extender.settle()
    assert [race.extender.filter(pod, T4S) for pod in big] == first  # an event moved them all
    race.seen("running-t4-0")
    answer = race.extender.filter(late, T4S)  # kube-scheduler's retry on the deletion
    after = race.extender.settle()
    assert answer["NodeNames"] == ["t4-0"], answer
    assert race.waits == ["retried"]
    assert after["gpu_placement_filter_settle_skipped_total{cause=standing,why=retried}"] - before[
        "gpu_placement_filter_settle_skipped_total{cause=standing,why=retried}"] == 6
    assert _since(before, after, "gpu_placement_filter_settle_denied_total") == 0


def test_the_next_round_after_a_pause_waits_again(race: _Race) -> None:
    """A round's wait found nothing at view generation G (an event the view does not watch moved the
    pods). Later, with the view still at G, a deletion kube-scheduler sees first moves them again:
    that round's first retry must wait, or the raced pod is answered from the view without it (a
    mark kept until the view changes would cover it: G stays as it was through any event that changes
    no GPU figure)."""
    now = [0.0]
    race.settle.clock = lambda: now[0]
    pods = [_kept(_waiting(f"waiting-{i}")) for i in range(5)]
    for pod in pods:
        race.extender.filter(pod, T4S)
    generation = race.view.generation
    for pod in pods:  # a round: one wait, nothing new
        assert race.extender.filter(pod, T4S)["NodeNames"] == []
    assert race.waits == ["retried"]
    now[0] += SETTLE_SECONDS  # kube-scheduler had nothing left to retry for that long
    race.seen("running-t4-2")
    assert race.view.generation == generation
    answers = [race.extender.filter(pod, T4S)["NodeNames"] for pod in pods]  # the next round
    assert race.waits == ["retried", "retried"]
    assert answers[0] == ["t4-2"], answers


def test_a_backlog_retried_round_after_round_leaves_the_budget_to_a_new_answer(race: _Race) -> None:
    """`make e2e`'s failure: pods left waiting by earlier scenarios are retried on every event, and the
    events came twice a second, each round beginning after a pause: one wait a round, 50 ms when the
    event changed nothing the view holds, spent the budget (2 % of the time), and the next pod that
    raced a deletion or a validator's Ready was answered from the view without it (not bound within
    30 s: nothing else happened). Pods answered the same way BACKLOG_ANSWERS times wait only from a
    full budget; a pod with a new answer finds it."""
    clock = itertools.count()
    race.settle.clock = lambda: next(clock) * 1.0  # a pause before every retry: each a round of its own
    backlog = [_kept(_waiting(f"backlog-{i}")) for i in range(3)]
    for _ in range(BACKLOG_ANSWERS):  # the backlog as it is after a few events
        for pod in backlog:
            race.extender.filter(pod, T4S)
    race.settle.budget = Budget(clock=lambda: 0.0)  # full, and no refill: the churn outruns it
    before = race.extender.settle()
    for _ in range(10):  # ten rounds of churn
        for pod in backlog:
            assert race.extender.filter(pod, T4S)["NodeNames"] == []
    after = race.extender.settle()
    assert _since(before, after, "gpu_placement_filter_settle_seconds_count") <= 1  # from the full budget only
    assert _since(before, after, "gpu_placement_filter_settle_denied_total") == 0
    late = _kept(_waiting("late"))
    race.extender.filter(late, T4S)  # its first attempt
    late["metadata"]["resourceVersion"] = "501"  # kube-scheduler's PodScheduled write moves it once more
    race.extender.filter(late, T4S)
    race.seen("running-t4-1")
    assert race.extender.filter(late, T4S)["NodeNames"] == ["t4-1"]  # kube-scheduler's retry on the deletion


def _longest(before: Mapping[str, float], after: Mapping[str, float]) -> float:
    """An upper bound of the longest wait since `before`: the lowest histogram bucket holding them all."""
    bounds: dict[float, float] = {}
    for key, value in after.items():
        if key.startswith("gpu_placement_filter_settle_seconds_bucket{"):
            bound = float(key.split("le=", 1)[1].split(",", 1)[0].rstrip("}"))
            bounds[bound] = bounds.get(bound, 0.0) + value - before.get(key, 0.0)
    total = bounds[float("inf")]
    return min(bound for bound, count in bounds.items() if count >= total)


def test_the_budget_is_a_share_of_wall_time() -> None:
    now = [0.0]
    budget = Budget(share=0.02, burst=0.1, clock=lambda: now[0])
    spent = 0.0
    for _ in range(1000):  # 100 s of retries, one every 0.1 s, each wait taking all of SETTLE_SECONDS
        now[0] += 0.1
        if budget.take(SETTLE_SECONDS):
            spent += SETTLE_SECONDS
            budget.give_back(0.0)
    assert spent <= 0.1 + 0.02 * now[0] + 1e-9  # the burst, then 2 % of the time that passed
    assert spent >= 0.02 * now[0]  # and all of that share is there to be used
    assert budget.take(SETTLE_SECONDS) is False
    budget.give_back(SETTLE_SECONDS)  # a wait that ended at once gives its reservation back
    assert budget.take(SETTLE_SECONDS) is True


def test_a_retried_wait_leaves_one_whole_wait_for_a_lagging_pod() -> None:
    """A `lagging` pod shows the view behind (its own version is newer than the view's pods), and its
    wait ends once the view has caught up; a `retried` one is a guess. Retried waits stop one whole
    wait short of empty: a new pod racing a deletion then still gets its wait."""
    budget = Budget(clock=lambda: 0.0)  # no refill
    retried = 0
    while budget.take(SETTLE_SECONDS, keep=SETTLE_SECONDS):
        retried += 1
    assert retried == round(SETTLE_BURST / SETTLE_SECONDS) - 1
    assert budget.take(SETTLE_SECONDS)  # a lagging pod's
    assert not budget.take(SETTLE_SECONDS)

    kept: list[float] = []

    class Spent(Budget):
        def take(self, seconds: float, keep: float = 0.0) -> bool:
            kept.append(keep)
            return False

    settle = Settle(ClusterView(Config()), Spent())
    assert asyncio.run(settle.wait("ml/old", RETRIED, "90")) is False
    assert asyncio.run(settle.wait("ml/new", LAGGING, "101")) is False
    assert kept == [SETTLE_SECONDS, 0.0]


def test_an_answer_is_standing_when_every_node_is_rejected_for_what_it_is() -> None:
    def result(failed: bytes, reasons: dict[str, int]) -> FilterResult:
        return FilterResult([], failed, b'{"n":"x"}', Counter(reasons))

    assert standing(result(b"{}", {DRIVER_TOO_OLD: 3, INSUFFICIENT_GPU_MEMORY: 1}))  # too old, too small
    assert not standing(result(b"{}", {DRIVER_TOO_OLD: 3, NOT_VALIDATED: 1}))  # one node's validator
    assert not standing(result(b'{"n":"InsufficientGPUMemory: ..."}', {INSUFFICIENT_GPU_MEMORY: 1}))  # in use
    assert not standing(result(b"{}", {INSUFFICIENT_GPU: 1}))  # DRA devices held by other claims
    assert not standing(result(b"{}", {UNKNOWN_NODE: 1}))  # a node our watch has not listed yet
    assert set(CODES) >= STANDING_CODES


def test_resource_versions_compare_as_the_api_server_defines() -> None:
    assert newer("1000", "999") and newer("1001", "1000") and not newer("1000", "1000")
    assert not newer("999", "1000")
    for broken in ("", "0", "012", "12a", "-1", "١٢"):  # CompareResourceVersion's well-formed rule
        assert not newer(broken, "5") and not newer("5", broken)
    assert not newer("5", None)


# -- a live view: the race of kube-scheduler's informer and our watch ---------------------------------------

class _Live:
    def __init__(self, fake: FakeApiServer) -> None:
        self.config = Config()
        self.view = ClusterView(self.config)
        self.ingest = Ingest(self.config)
        self.api = fake.api_client()
        self.source = LiveSource(self.view, self.ingest, self.api, FAST)
        self.source.start()
        wait_for(lambda: self.source.ready, what="the first full lists")
        self.extender = Extender(self.view, self.config, self.source.readiness)

    def close(self) -> None:
        self.extender.close()
        self.source.stop()
        self.api.close()


@pytest.fixture
def live(fake_api: FakeApiServer) -> Iterator[Live]:
    made: list[_Live] = []

    def make(objects: list[dict[str, Any]]) -> _Live:
        fake_api.load(objects)
        made.append(_Live(fake_api))
        return made[-1]

    yield make
    for harness in made:
        harness.close()


def _hold_watch_until(monkeypatch: pytest.MonkeyPatch, harness: _Live, held: Callable[[str, dict[str, Any]], bool],
                      release: threading.Event) -> list[str]:
    """Our watch a step behind kube-scheduler's informer, as a loaded machine makes it: the events
    `held` picks are applied only once `release` is set (by the extender's wait for the view, or by
    the test once /filter has answered). Returns what the hook saw, for the assertions."""
    seen: list[str] = []
    event = harness.ingest.event

    def late(view: ClusterView, kind: str, event_type: str, obj: dict[str, Any]) -> None:
        if held(kind, obj):
            seen.append(f"{kind} {event_type} {obj['metadata']['name']}")
            release.wait(20)
        event(view, kind, event_type, obj)

    monkeypatch.setattr(harness.ingest, "event", late)
    return seen


def _release_when_waiting(monkeypatch: pytest.MonkeyPatch, release: threading.Event) -> list[str]:
    """The extender's wait for the view lets the held event through (from the watch thread)."""
    waits: list[str] = []
    settle = settle_module._view_changes

    async def waiting(view: ClusterView, seconds: float, until: str | None = None) -> bool:
        waits.append("lagging" if until is not None else "retried")
        release.set()
        return await settle(view, seconds, until)

    monkeypatch.setattr(settle_module, "_view_changes", waiting)
    return waits


def test_a_pod_retried_on_the_validator_turning_ready_takes_the_node(
        live: Live, fake_api: FakeApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """`make e2e` scenario 19's failure: kube-scheduler rejected the pod NotValidated, saw the validator turn
    Ready and retried the pod at once; our watch had not applied that event yet, the answer was
    NotValidated again, and kube-scheduler parked the pod in its unschedulable pool (nothing else
    happened on the cluster to move it). The retry of a pod already rejected everywhere, with nothing
    new in the view, now waits for the view, and the validator's Ready reaches it in time."""
    node = "gpu-a"
    harness = live([namespace("ml"), make_node(node, "h100"), validator_pod(node, ready=False),
                    make_pod("ml", "train", gpus={"nvidia.com/gpu": 1})])
    pod = fake_api.get("Pod", "train", "ml")
    wait_for(lambda: "ml/train" in harness.view.pods, what="the pod in the view")
    first = harness.extender.filter(pod, [node])
    assert first["FailedAndUnresolvableNodes"][node].startswith("NotValidated: "), first

    release = threading.Event()
    seen = _hold_watch_until(monkeypatch, harness, lambda kind, obj: obj["metadata"]["name"].startswith(
        "nvidia-operator-validator"), release)
    waits = _release_when_waiting(monkeypatch, release)
    fake_api.update(validator_pod(node, ready=True))  # kubelet posts Ready: kube-scheduler's informer has it
    wait_for(lambda: seen, what="the validator's event reaching our watch")
    try:
        answer = harness.extender.filter(pod, [node])  # kube-scheduler's retry, the same pod object
    finally:
        release.set()
    assert waits == ["retried"]
    assert answer["NodeNames"] == [node] and not answer["FailedAndUnresolvableNodes"], answer


def test_a_pod_newer_than_the_view_waits_until_the_view_has_caught_up(
        live: Live, fake_api: FakeApiServer, monkeypatch: pytest.MonkeyPatch) -> None:
    """kube-scheduler sends its informer's copy of the pod; when that copy is newer than anything our
    pods watch applied, the view is behind: the events before it (here the holder's deletion, which
    frees the memory) are on their way, and the answer waits for them."""
    node = "t4-a"
    t4 = make_node(node, "t4-timeslicing", labels={"nvidia.com/gpu.sharing-strategy": "time-slicing"},
                   shared_resource=SHARED)
    holder = make_pod("ml", "holder", gpus={SHARED: 1}, node=node, image=IMAGE,
                      annotations={"gpu-placement.io/gpu-memory": "15Gi"})
    harness = live([namespace("ml"), t4, validator_pod(node), holder])
    release = threading.Event()
    seen = _hold_watch_until(monkeypatch, harness, lambda kind, obj: kind == "pods", release)
    waits = _release_when_waiting(monkeypatch, release)
    fake_api.delete("Pod", "holder", "ml")
    pod = fake_api.add(_waiting("next"))  # created after the deletion: kube-scheduler's informer has both
    wait_for(lambda: seen, what="the deletion reaching our watch")
    before = harness.extender.settle()
    try:
        answer = harness.extender.filter(pod, [node])  # the pod's first attempt
    finally:
        release.set()
    assert waits == ["lagging"]
    assert answer["NodeNames"] == [node], answer
    after = harness.extender.settle()
    assert _since(before, after, "gpu_placement_filter_settle_seconds_count") == 1
    assert after["gpu_placement_filter_settle_seconds_count{outcome=changed,why=lagging}"] >= 1


def test_the_live_source_says_how_far_the_view_has_applied_each_kind(
        live: Live, fake_api: FakeApiServer) -> None:
    harness = live([namespace("ml")])
    assert harness.view.versions["pods"]  # the list's version
    added = fake_api.add(make_pod("ml", "p"))
    version = added["metadata"]["resourceVersion"]
    wait_for(lambda: not newer(version, harness.view.versions["pods"]), what="the pods event applied")
    assert "ml/p" in harness.view.pods
    assert asyncio.run(settle_module._view_changes(harness.view, 0.01, until=version)) is False  # caught up: at once
