"""/filter answers the best tier only (config `scoring.tierSize`, docs/performance.md "One call per pod"), over
real HTTP on loopback: the passing nodes tied at the best score, at most tierSize drawn at random, only names
asked; every refused node with its reason when nothing passes (kube-scheduler's message and preemption read
them); one node answered holds the pod's GPUs there until kube-scheduler's bind shows."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpu_placement.base.config import Config, ConfigError, Scoring, parse_config
from gpu_placement.samples.cluster import make_node, make_pod, validator_pod
from tests.support.extender import Extender

GPU = "nvidia.com/gpu"


def pod(name: str, gpus: int = 1, namespace: str = "ml") -> dict[str, Any]:
    """A GPU pod as kube-scheduler's cache holds it."""
    return {"metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "resourceVersion": "7",
                         "annotations": {"gpu-placement.io/admitted": "exclusive"}},
            "spec": {"schedulerName": "gpu-placement",
                     "containers": [{"name": "main", "image": "registry.example.com/app:1",
                                     "resources": {"limits": {GPU: str(gpus)}, "requests": {GPU: str(gpus)}}}]},
            "status": {"phase": "Pending"}}


IDLE = [f"idle-{i}" for i in range(10)]


def cluster() -> list[dict[str, Any]]:
    """Ten idle 8-GPU nodes, two with 4 GPUs in use, one with 7, and one whose validator is not Ready."""
    nodes = [*IDLE, "half-a", "half-b", "full", "unverified"]
    objects = [make_node(name, "h100x8") for name in nodes]
    objects += [validator_pod(name, ready=name != "unverified") for name in nodes]
    objects += [make_pod("ml", "running-a", gpus={GPU: 4}, node="half-a"),
                make_pod("ml", "running-b", gpus={GPU: 4}, node="half-b"),
                make_pod("ml", "running-c", gpus={GPU: 7}, node="full")]
    return objects


ALL = [*IDLE, "half-a", "half-b", "full", "unverified"]


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[Extender]:
    strategy, size = request.param
    extender = Extender(cluster(), Config(scoring=Scoring(strategy=strategy, tier_size=size)))
    yield extender
    extender.close()


@pytest.mark.parametrize("served", [("binpack", 8)], indirect=True)
def test_the_answer_is_the_nodes_tied_at_the_best_score_and_no_failure_maps(served: Extender) -> None:
    """Binpack: the two half-used nodes tie above every idle one (the full one cannot take 2 GPUs);
    kube-scheduler's own plugins choose between them, and it gets no reasons for the others."""
    answer = served.filter(pod("two", gpus=2), ALL)
    assert sorted(answer["NodeNames"]) == ["half-a", "half-b"]
    assert answer["FailedNodes"] == {} and answer["FailedAndUnresolvableNodes"] == {}
    assert answer["Error"] == ""
    # the same pod asked about idle nodes only: every idle node ties, capped at 8 distinct names asked
    idle = served.filter(pod("two"), IDLE)["NodeNames"]
    assert len(idle) == 8 == len(set(idle)) and set(idle) <= set(IDLE)


@pytest.mark.parametrize("served", [("spread", 3)], indirect=True)
def test_ties_are_drawn_at_random_so_equal_nodes_share_a_burst(served: Extender) -> None:
    answers = [served.filter(pod(f"p{i}"), IDLE)["NodeNames"] for i in range(30)]
    assert all(len(names) == 3 == len(set(names)) and set(names) <= set(IDLE) for names in answers)
    assert len({name for names in answers for name in names}) > 3  # not always the same three


@pytest.mark.parametrize("served", [("binpack", 1)], indirect=True)
def test_nothing_passes_lists_every_refused_node_with_its_reason(served: Extender) -> None:
    """Nine GPUs fit nowhere: kube-scheduler's message and preemption read every node's reason."""
    answer = served.filter(pod("big", gpus=9), [*ALL, "ghost"])
    assert answer["NodeNames"] == []
    failed, unresolvable = answer["FailedNodes"], answer["FailedAndUnresolvableNodes"]
    assert set(failed) | set(unresolvable) == {*ALL, "ghost"}
    assert not set(failed) & set(unresolvable)
    assert failed["half-a"].startswith("InsufficientGPU") and failed["full"].startswith("InsufficientGPU")
    assert unresolvable["ghost"].startswith("UnknownNode")
    assert "unverified" in unresolvable


@pytest.mark.parametrize("served", [("binpack", 1)], indirect=True)
def test_only_names_asked_are_answered(served: Extender) -> None:
    """The best node overall (full, the fullest that fits one GPU) is not asked: the best of those asked is."""
    assert served.filter(pod("one"), ALL)["NodeNames"] == ["full"]
    answer = served.filter(pod("other"), ["idle-3", "half-b", "unverified", "ghost"])
    assert answer["NodeNames"] == ["half-b"]


@pytest.mark.parametrize("served", [("spread", 1)], indirect=True)
def test_one_node_answered_holds_the_pods_gpus_there_until_it_is_seen_bound(served: Extender) -> None:
    """A burst: kube-scheduler binds behind the next pods' cycles, so the pod's GPUs are held on the one node
    answered at once; the next pod, spread, goes elsewhere. A retry of the pod (its bind failed) drops its
    hold before it is judged; the watch showing it bound drops it too."""
    view = served.core.view
    first = served.filter(pod("a", gpus=4), ["idle-0", "idle-1"])["NodeNames"]
    assert len(first) == 1 and view.reservations["ml/a"].node == first[0]
    second = served.filter(pod("b", gpus=4), ["idle-0", "idle-1"])["NodeNames"]
    assert second == [name for name in ("idle-0", "idle-1") if name not in first]
    # a is retried (its bind failed): its own hold does not count against it, and it is held once
    again = served.filter(pod("a", gpus=4), first)
    assert again["NodeNames"] == first and view.reservations["ml/a"].node == first[0]
    # the watch shows a bound: the pod's own charge counts instead of the hold
    with view.lock:
        served.core.ingest.event(view, "pods", "ADDED", make_pod("ml", "a", gpus={GPU: 4}, node=first[0]) |
                                 {"metadata": {"name": "a", "namespace": "ml", "uid": "uid-a"}})
    assert "ml/a" not in view.reservations


@pytest.mark.parametrize("served", [("binpack", 0)], indirect=True)
def test_tier_size_zero_answers_every_passing_node_and_every_reason(served: Extender) -> None:
    """A scheduler configuration that still calls /prioritize: the whole answer, as before the tier."""
    answer = served.filter(pod("one"), ALL)
    assert sorted(answer["NodeNames"]) == sorted(set(ALL) - {"unverified"})
    assert set(answer["FailedAndUnresolvableNodes"]) == {"unverified"}
    assert "ml/one" not in served.core.view.reservations


@pytest.mark.parametrize("served", [("binpack", 1)], indirect=True)
def test_a_pod_without_gpus_passes_every_node(served: Extender) -> None:
    plain = pod("cpu")
    plain["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1"}}
    assert sorted(served.filter(plain, ALL)["NodeNames"]) == sorted(ALL)


def test_tier_size_is_a_count() -> None:
    assert parse_config({}).scoring.tier_size == 0  # a bare `serve`: every passing node (the chart sets 8)
    assert parse_config({"scoring": {"tierSize": 8}}).scoring.tier_size == 8
    for bad in (-1, True, "8", 1.5):
        with pytest.raises(ConfigError, match=r"scoring\.tierSize"):
            parse_config({"scoring": {"tierSize": bad}})


def test_a_pod_with_a_soft_spread_gets_the_nodes_tied_at_the_best_score() -> None:
    """Nodes with one, two and three GPUs in use score alike for a 1-GPU pod (0..10), and fragmentation's finer
    order answers one of them; a pod that asks kube-scheduler for a ScheduleAnyway spread gets all three, for
    PodTopologySpread to weigh (and none is held)."""
    names = [f"used-{i}" for i in range(1, 4)]
    objects = [make_node(name, "h100x8") for name in names] + [validator_pod(name) for name in names]
    objects += [make_pod("ml", f"r{i}", gpus={GPU: i}, node=f"used-{i}") for i in range(1, 4)]
    served = Extender(objects, Config(scoring=Scoring(strategy="fragmentation", tier_size=8)))
    try:
        assert served.filter(pod("plain"), names)["NodeNames"] == ["used-1"]
        spread = pod("spread")
        spread["spec"]["topologySpreadConstraints"] = [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                                                        "whenUnsatisfiable": "ScheduleAnyway",
                                                        "labelSelector": {"matchLabels": {"app": "x"}}}]
        assert sorted(served.filter(spread, names)["NodeNames"]) == names
    finally:
        served.close()
