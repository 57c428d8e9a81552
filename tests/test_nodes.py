"""A node's GPU facts from the labels the GPU Operator publishes: every published label set, the
deprecated label names, derived figures, and junk values that must stay one node's problem."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

from gpu_placement.base.config import Config
from gpu_placement.decide.placement import Placement
from gpu_placement.decide.requirements import requirements_for
from gpu_placement.facts.nodes import MigProfile, NodeFacts, node_from_json
from gpu_placement.samples.cluster import base_labels, make_node, validator_pod
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest

FIXTURE = resources.files("gpu_placement").joinpath("data/gpu-operator-node-labels.json")  # samples/cluster.py's too


def _fixture_sets() -> list[dict[str, Any]]:
    return json.loads(FIXTURE.read_text())["nodes"]


def _node_obj(labels: dict[str, str], capacity: dict[str, str] | None = None, name: str = "gpu-0",
              ready: bool = True) -> dict[str, Any]:
    """A Node as the API server returns it, around a published label set (no kind: list items carry none)."""
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False",
                                              "reason": "KubeletReady" if ready else "KubeletNotReady"}]}
    if capacity is not None:
        status["capacity"] = dict(capacity)
        status["allocatable"] = dict(capacity)
    return {"metadata": {"name": name, "labels": dict(labels)}, "spec": {}, "status": status}


# What a platform engineer reads off each published node (`gpu-placement nodes`), by fixture index.
EXPECTED: dict[int, dict[str, Any]] = {
    0: dict(product="NVIDIA-H100-80GB-HBM3", count=1, device_memory_mib=81559, replicas=1, sharing="none",
            mig_strategy="single", mig={}, driver=(550, 54, 15), max_cuda=(12, 4),
            max_cuda_source="nvidia.com/cuda.runtime-version", compute=(9, 0), upgrade_state="upgrade-done",
            paused=None, mig_config_state="success"),
    1: dict(product="NVIDIA-H100-80GB-HBM3", count=1, device_memory_mib=81559, replicas=0, sharing="none",
            mig_strategy="mixed",
            mig={"1g.10gb": MigProfile(2, 9984), "2g.20gb": MigProfile(1, 20096), "3g.40gb": MigProfile(1, 40320)},
            driver=(550, 54, 15), max_cuda=(12, 4), max_cuda_source="nvidia.com/cuda.runtime-version",
            compute=(9, 0), upgrade_state="upgrade-done", paused=None, mig_config_state="success"),
    # Old GFD wrote gpu.memory in bytes (16106127360) and only the deprecated driver/runtime labels.
    2: dict(product="Tesla-T4-SHARED", count=1, device_memory_mib=15360, replicas=8, mig_strategy="single", mig={},
            driver=(510, 73, 8), max_cuda=(11, 7), max_cuda_source="nvidia.com/cuda.runtime", compute=(7, 5),
            upgrade_state=None, paused=None, mig_config_state=None),
    3: dict(product="GRID-A100-40C", count=1, device_memory_mib=40960, replicas=1, sharing="none", mig={},
            driver=(580, 126, 9), max_cuda=(13, 0), max_cuda_source="nvidia.com/cuda.runtime-version",
            compute=(8, 0), upgrade_state="upgrade-done", paused=None, mig_config_state=None),
    # gpu.deploy.driver=pre-installed is not a paused state.
    4: dict(product="NVIDIA-H100-80GB-HBM3", count=8, device_memory_mib=81559, replicas=1, sharing="none", mig={},
            driver=(535, 129, 3), max_cuda=(12, 2), max_cuda_source="nvidia.com/cuda.runtime-version",
            compute=(9, 0), upgrade_state="upgrade-done", paused=None, mig_config_state="success"),
    # grep-filtered capture: no cuda.* labels at all, so driver and CUDA are unknown, not guessed.
    5: dict(product="NVIDIA-A10G", count=1, device_memory_mib=23028, replicas=1, sharing="none", mig={},
            driver=None, max_cuda=None, max_cuda_source="unknown", compute=(8, 6), upgrade_state="upgrade-done",
            paused=None, mig_config_state=None),
}


def test_every_published_label_set_has_expectations() -> None:
    assert sorted(EXPECTED) == list(range(len(_fixture_sets())))


@pytest.mark.parametrize("index", sorted(EXPECTED))
def test_published_label_set(index: int) -> None:
    entry = _fixture_sets()[index]
    capacity = entry.get("capacity") or None
    facts = node_from_json(_node_obj(entry["labels"], capacity))
    assert facts.problems == {}, f"{entry['source']}: {facts.problems}"
    assert facts.name == "gpu-0" and facts.ready and facts.gpu_present
    for field, expected in EXPECTED[index].items():
        assert getattr(facts, field) == expected, f"{field} of {entry['source'][:60]}"


def test_published_capacity_is_parsed() -> None:
    sets = _fixture_sets()
    t4 = node_from_json(_node_obj(sets[2]["labels"], sets[2]["capacity"]))
    assert t4.capacity == {"nvidia.com/gpu": 8} and t4.allocatable == {"nvidia.com/gpu": 8}  # cpu, memory: not ours
    a10g = node_from_json(_node_obj(sets[5]["labels"], sets[5]["capacity"]))
    assert a10g.allocatable == {"nvidia.com/gpu": 0}


def test_mig_mixed_offers_slices_not_whole_gpus() -> None:
    facts = node_from_json(make_node("mig", "h100-mig-mixed"))
    assert facts.replicas == 0
    assert facts.allocatable == {"nvidia.com/mig-1g.10gb": 2, "nvidia.com/mig-2g.20gb": 1, "nvidia.com/mig-3g.40gb": 1}
    assert facts.unit_memory("nvidia.com/mig-1g.10gb") == 9984
    assert facts.unit_memory("nvidia.com/mig-3g.40gb") == 40320
    assert facts.unit_memory("nvidia.com/mig-7g.80gb") is None  # a profile this node does not have


def test_time_slicing_share_is_device_memory_over_replicas() -> None:
    facts = node_from_json(make_node("t4", "t4-timeslicing"))
    assert facts.unit_memory("nvidia.com/gpu") == 15360 // 8
    assert facts.device_memory("nvidia.com/gpu") == 15360
    assert facts.is_shared("nvidia.com/gpu")


@pytest.mark.parametrize(("raw", "mib"), [("81559", 81559), ("16106127360", 15360), ("85899345920", 81920),
                                          ("10000000", 10000000)])
def test_memory_label_mib_or_old_gfd_bytes(raw: str, mib: int) -> None:
    facts = node_from_json(make_node("n", "h100", labels={"nvidia.com/gpu.memory": raw}))
    assert facts.device_memory_mib == mib


def _h100_without(prefixes: tuple[str, ...], **extra: str) -> NodeFacts:
    """The published H100 node without the labels starting with `prefixes`, plus `extra`."""
    labels = {k: v for k, v in base_labels("h100").items() if not k.startswith(prefixes)}
    return node_from_json(make_node("n", None, labels={**labels, **extra}))


def test_driver_from_deprecated_labels_only() -> None:
    facts = _h100_without(("nvidia.com/cuda.driver-version.",))
    assert facts.driver == (550, 54, 15)
    assert facts.problems == {}


def test_driver_full_label_wins_over_parts() -> None:
    facts = node_from_json(make_node("n", "h100", labels={"nvidia.com/cuda.driver-version.full": "550.90.07"}))
    assert facts.driver == (550, 90, 7)


def test_max_cuda_from_deprecated_runtime_labels() -> None:
    facts = _h100_without(("nvidia.com/cuda.runtime-version.",))
    assert facts.max_cuda == (12, 4)
    assert facts.max_cuda_source == "nvidia.com/cuda.runtime"


@pytest.mark.parametrize(("driver", "cuda"), [("550.54.15", (12, 4)), ("535.129.03", (12, 2)),
                                              ("470.256.02", (11, 4)), ("580.65.06", (13, 0)),
                                              ("525.60.12", (11, 8)), ("440.33.01", None)])
def test_max_cuda_derived_from_driver_when_runtime_labels_missing(driver: str, cuda: tuple[int, ...] | None) -> None:
    facts = _h100_without(("nvidia.com/cuda.runtime", "nvidia.com/cuda.driver"),
                          **{"nvidia.com/cuda.driver-version.full": driver})
    assert facts.max_cuda == cuda
    assert facts.max_cuda_source == "driver table"


def test_max_cuda_derived_from_deprecated_driver_labels() -> None:
    labels = {"nvidia.com/cuda.driver.major": "535", "nvidia.com/cuda.driver.minor": "129",
              "nvidia.com/cuda.driver.rev": "03"}
    facts = _h100_without(("nvidia.com/cuda.",), **labels)
    assert facts.driver == (535, 129, 3)
    assert facts.max_cuda == (12, 2)


def test_no_driver_labels_means_unknown() -> None:
    facts = _h100_without(("nvidia.com/cuda.",))
    assert facts.driver is None and facts.max_cuda is None and facts.problems == {}


def test_compute_capability() -> None:
    facts = node_from_json(make_node("n", "h100", labels={"nvidia.com/gpu.compute.major": "7",
                                                          "nvidia.com/gpu.compute.minor": "5"}))
    assert facts.compute == (7, 5)
    assert _h100_without(("nvidia.com/gpu.compute.",)).compute is None


@pytest.mark.parametrize("state", ["upgrade-required", "cordon-required", "wait-for-jobs-required",
                                   "pod-deletion-required", "drain-required", "pod-restart-required",
                                   "validation-required", "uncordon-required", "upgrade-failed", "upgrade-done"])
def test_upgrade_state(state: str) -> None:
    facts = node_from_json(make_node("n", "h100", labels={"nvidia.com/gpu-driver-upgrade-state": state}))
    assert facts.upgrade_state == state


def test_paused_deploy_labels() -> None:
    facts = node_from_json(make_node("n", "h100", labels={"nvidia.com/gpu.deploy.driver": "paused-for-driver-upgrade"}))
    assert facts.paused == "nvidia.com/gpu.deploy.driver=paused-for-driver-upgrade"
    facts = node_from_json(make_node("n", "h100",
                                     labels={"nvidia.com/gpu.deploy.device-plugin": "paused-for-mig-change"}))
    assert facts.paused == "nvidia.com/gpu.deploy.device-plugin=paused-for-mig-change"
    assert node_from_json(make_node("n", "h100x8")).paused is None  # pre-installed, true, "": not paused


@pytest.mark.parametrize("state", ["pending", "rebooting", "failed", "success"])
def test_mig_config_state(state: str) -> None:
    facts = node_from_json(make_node("n", "h100", labels={"nvidia.com/mig.config.state": state}))
    assert facts.mig_config_state == state


def test_capacity_and_allocatable_unhealthy_devices() -> None:
    facts = node_from_json(make_node("n", "h100x8", allocatable={"nvidia.com/gpu": "7"},
                                     capacity={"nvidia.com/gpu": "8"}))
    assert facts.capacity == {"nvidia.com/gpu": 8} and facts.allocatable == {"nvidia.com/gpu": 7}
    assert facts.unhealthy_devices == 1


def test_ready_condition_and_cordon() -> None:
    down = node_from_json(make_node("n", "h100", ready=False))
    assert not down.ready and "False" in down.ready_message and "KubeletNotReady" in down.ready_message
    assert node_from_json(make_node("n", "h100", unschedulable=True)).unschedulable
    bare = node_from_json({"metadata": {"name": "bare"}})
    assert not bare.ready and bare.ready_message == "has no Ready condition"


JUNK = {
    "nvidia.com/gpu.memory": "abc",
    "nvidia.com/cuda.driver-version.full": "n/a",
    "nvidia.com/gpu.count": "-1",
    "nvidia.com/gpu.replicas": "two",
    "nvidia.com/gpu.compute.major": "x",
    "nvidia.com/cuda.runtime-version.major": "twelve",
    "nvidia.com/mig-1g.10gb.count": "many",
}


@pytest.mark.parametrize(("label", "value"), sorted(JUNK.items()))
def test_junk_label_is_a_problem_never_an_exception(label: str, value: str) -> None:
    facts = node_from_json(make_node("junk", "h100", labels={label: value}, allocatable={"nvidia.com/gpu": "1"}))
    assert label in facts.problems
    assert repr(value) in facts.problems[label]  # the sentence quotes what GFD wrote


def test_junk_driver_does_not_invent_a_version() -> None:
    facts = _h100_without(("nvidia.com/cuda.driver",), **{"nvidia.com/cuda.driver-version.full": "n/a"})
    assert facts.driver is None
    assert "nvidia.com/cuda.driver-version.full" in facts.problems


def test_junk_quantities_in_status() -> None:
    facts = node_from_json(make_node("junk", "h100", allocatable={"nvidia.com/gpu": "lots"}))
    assert "status.allocatable" in facts.problems and "lots" in facts.problems["status.allocatable"]


def test_all_junk_at_once_never_raises() -> None:
    facts = node_from_json(make_node("junk", "h100", labels=JUNK, allocatable={"nvidia.com/gpu": "x"}))
    assert set(JUNK) - {"nvidia.com/mig-1g.10gb.count"} <= set(facts.problems)
    for obj in ({}, {"metadata": None, "spec": None, "status": None}, {"metadata": {"labels": {}}}):
        assert node_from_json(obj).problems == {}


def test_junk_labels_fail_that_node_only() -> None:
    """One node with a broken label gets a reason of its own; its neighbours' verdicts do not move."""
    config = Config()
    ingest = Ingest(config)

    def verdicts(bad_labels: dict[str, str]) -> tuple[list[str], dict[str, str]]:
        view = ClusterView(config)
        for name in ("good-1", "odd", "good-2"):
            view.upsert_node(ingest.node(make_node(name, "h100", labels=bad_labels if name == "odd" else None,
                                                   allocatable={"nvidia.com/gpu": "1"})))
            view.upsert_pod(ingest.pod(validator_pod(name)))
        pod = {"metadata": {"name": "p", "namespace": "ml"},
               "spec": {"containers": [{"name": "c", "image": "nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04",
                                        "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}
        req = requirements_for(pod, None, config.is_gpu_resource)
        result = Placement(view, config).filter(req, ["good-1", "odd", "good-2"])
        return sorted(result.passed), {**result.failed, **result.unresolvable}  # passed: in no particular order

    assert verdicts({}) == (["good-1", "good-2", "odd"], {})
    for label, value in JUNK.items():
        passed, failed = verdicts({label: value})
        assert passed[:1] == ["good-1"] and passed[1:2] == ["good-2"], label
        assert "good-1" not in failed and "good-2" not in failed
    passed, failed = verdicts({"nvidia.com/gpu.memory": "abc"})
    assert passed == ["good-1", "good-2"]
    assert failed["odd"].startswith("BadLabel: nvidia.com/gpu.memory='abc'")
