"""/filter when kube-scheduler's sample is refused whole while nodes outside it fit (extender/sample.py), over
real HTTP on loopback: every refusal answered unresolvable with one `OutsideSample` sentence, so DefaultPreemption
finds no candidate on the sample; answered as before when the names cannot be a cut sample (fewer than
numFeasibleNodesToFind, or percentageOfNodesToScore 100), when no node outside fits, and once the pod's
samples have gone round every node."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import REGISTRY

from extender.sample import OUTSIDE_SAMPLE, Samples, feasible_nodes_to_find, may_be_cut
from gpu_placement.base.config import Config, ConfigError, Scoring, parse_config
from gpu_placement.samples.cluster import make_node, make_pod, validator_pod
from tests.support.extender import Extender

GPU = "nvidia.com/gpu"
FULL = [f"full-{i:03d}" for i in range(130)]  # every GPU taken: InsufficientGPU, resolvable
IDLE = [f"idle-{i:03d}" for i in range(120)]
NODES = 250  # numFeasibleNodesToFind(250, adaptive) = 250 * (50 - 2) // 100 = 120
SAMPLE = FULL[:120]


@pytest.mark.parametrize(("nodes", "percentage", "expected"), [
    (50, 0, 50), (99, 0, 99), (100, 0, 100), (250, 0, 120), (500, 0, 230), (1000, 0, 420), (5000, 0, 500),
    (6000, 0, 300), (20000, 0, 1000), (500, 100, 500), (500, 30, 150), (500, 10, 100),
])
def test_the_sample_size_is_kube_schedulers(nodes: int, percentage: int, expected: int) -> None:
    """schedule_one.go numFeasibleNodesToFind at v1.37.2: all below 100 nodes; else the percentage (adaptive:
    50 - nodes/125, at least 5) of them, at least 100."""
    assert feasible_nodes_to_find(nodes, percentage) == expected


def test_only_a_full_sample_short_of_every_node_may_be_cut() -> None:
    assert may_be_cut(230, 500, 0) and may_be_cut(231, 500, 0)
    assert not may_be_cut(229, 500, 0)  # fewer feasible than it looks for: it filtered every node
    assert not may_be_cut(500, 500, 100) and not may_be_cut(99, 99, 0)  # it looks for every node


def pod(name: str, uid: str | None = None) -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": "ml", "uid": uid or f"uid-{name}", "resourceVersion": "7",
                         "annotations": {"gpu-placement.io/admitted": "exclusive"}},
            "spec": {"schedulerName": "gpu-placement", "priority": 1000,
                     "containers": [{"name": "main", "image": "registry.example.com/app:1",
                                     "resources": {"limits": {GPU: "1"}, "requests": {GPU: "1"}}}]},
            "status": {"phase": "Pending"}}


def cluster(idle_too: bool = False) -> list[dict[str, Any]]:
    """250 8-GPU nodes: 130 full, 120 idle (or full too)."""
    objects: list[dict[str, Any]] = []
    for name in [*FULL, *IDLE]:
        objects += [make_node(name, "h100x8"), validator_pod(name)]
        if name in FULL or idle_too:
            objects.append(make_pod("batch", f"on-{name}", gpus={GPU: 8}, node=name))
    return objects


@pytest.fixture(scope="module")
def served() -> Iterator[Extender]:
    extender = Extender(cluster(), Config(scoring=Scoring(tier_size=8)))
    yield extender
    extender.close()


def outside_sample_answers() -> float:
    return REGISTRY.get_sample_value("gpu_placement_decisions_total",
                                     {"component": "extender", "reason": OUTSIDE_SAMPLE}) or 0.0


def test_a_refused_sample_with_fitting_nodes_outside_is_answered_unresolvable(served: Extender) -> None:
    before = outside_sample_answers()
    answer = served.filter(pod("sampled"), SAMPLE)
    assert answer["NodeNames"] == [] and answer["FailedNodes"] == {} and answer["Error"] == ""
    refused = answer["FailedAndUnresolvableNodes"]
    assert sorted(refused) == SAMPLE  # every name asked, nothing for preemption to pick
    assert len(set(refused.values())) == 1  # one string: kube-scheduler counts it once
    sentence = refused[SAMPLE[0]]
    assert sentence.startswith("OutsideSample: none of the 120 nodes in kube-scheduler's sample fits "
                               "(120 InsufficientGPU) but 120 node(s) outside it do"), sentence
    assert "nothing is preempted" in sentence and "percentageOfNodesToScore 100" in sentence
    assert outside_sample_answers() == before + 1


def test_the_complete_feasible_list_is_answered_as_before(served: Extender) -> None:
    """Fewer names than kube-scheduler looks for: it filtered every node, and the nodes not sent are ones its
    own filters refused. Preemption reads the resolvable reasons as before."""
    answer = served.filter(pod("complete"), SAMPLE[:119])
    assert answer["FailedAndUnresolvableNodes"] == {}
    assert sorted(answer["FailedNodes"]) == SAMPLE[:119]
    assert all(reason.startswith("InsufficientGPU: ") for reason in answer["FailedNodes"].values())


def test_every_node_filtered_is_answered_as_before() -> None:
    """percentageOfNodesToScore 100 (passed by the chart): the names are every feasible node, never a sample."""
    extender = Extender(cluster(), Config(scoring=Scoring(tier_size=8), percentage_of_nodes_to_score=100))
    try:
        answer = extender.filter(pod("all"), SAMPLE)
        assert sorted(answer["FailedNodes"]) == SAMPLE and answer["FailedAndUnresolvableNodes"] == {}
    finally:
        extender.close()


def test_no_fitting_node_outside_is_answered_as_before() -> None:
    """Every node full: preemption is what the pod needs, on the sample as anywhere."""
    extender = Extender(cluster(idle_too=True), Config(scoring=Scoring(tier_size=8)))
    try:
        answer = extender.filter(pod("nowhere"), SAMPLE)
        assert sorted(answer["FailedNodes"]) == SAMPLE and answer["FailedAndUnresolvableNodes"] == {}
    finally:
        extender.close()


def test_the_answer_stops_once_the_samples_went_round_every_node(served: Extender) -> None:
    """ceil(250 / 120) = 3 samples go round the nodes: a node outside every one of them is one kube-scheduler's
    own filters keep from the pod (its node selector, a taint), and preemption may act from the fourth on.
    Passing somewhere, or a new pod under the name, counts from zero again."""
    def outside(p: dict[str, Any]) -> bool:
        return served.filter(p, SAMPLE)["FailedNodes"] == {}

    assert [outside(pod("round")) for _ in range(5)] == [True, True, True, False, False]
    assert served.filter(pod("round"), [IDLE[0]])["NodeNames"] == [IDLE[0]]
    assert outside(pod("round"))
    assert [outside(pod("round", uid="uid-round-2")) for _ in range(4)] == [True, True, True, False]


def test_samples_are_counted_per_pod_and_bounded() -> None:
    samples = Samples()
    assert [samples.allow("ns/a", "u1", 500, 1000) for _ in range(3)] == [True, True, False]
    assert samples.allow("ns/b", "u2", 500, 1000)  # another pod: its own count
    assert samples.allow("ns/a", "u3", 500, 1000)  # replaced: from zero
    samples.forget("ns/a")
    assert samples.allow("ns/a", "u3", 500, 1000)


def test_the_percentage_is_checked_like_kube_schedulers() -> None:
    assert parse_config({"percentageOfNodesToScore": 40}).percentage_of_nodes_to_score == 40
    assert parse_config({}).percentage_of_nodes_to_score == 0
    for bad in (-1, 101):
        with pytest.raises(ConfigError, match="percentageOfNodesToScore must be an integer from 0 to 100"):
            parse_config({"percentageOfNodesToScore": bad})
