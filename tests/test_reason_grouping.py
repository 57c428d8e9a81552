"""Reasons as kube-scheduler shows them: counted by identical string (contract sections 3-4).

kube-scheduler's `FitError.Error()` (pkg/scheduler/framework/types.go) counts identical reason strings
over every node and writes `0/N nodes are available: <count> <reason>, ...` (sorted, joined with ", ")
into the pod's `PodScheduled` condition and `FailedScheduling` Event. A reason that names its node or
holds a per-node figure is one entry per node; these tests pin that on 1,000 nodes it stays one entry
per cause.
"""

from __future__ import annotations

import re
from collections import Counter
from functools import cache
from typing import Any

import orjson
import pytest

from gpu_placement.app.assembly import Core, core_from_objects
from gpu_placement.base.config import Config
from gpu_placement.samples.cluster import make_node, make_pod, validator_pod

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
GOOD_DRIVER = {"nvidia.com/cuda.driver-version.full": "550.54.15", "nvidia.com/cuda.driver.major": "550",
               "nvidia.com/cuda.driver.minor": "54", "nvidia.com/cuda.driver.rev": "15",
               "nvidia.com/cuda.runtime-version.major": "12", "nvidia.com/cuda.runtime-version.minor": "4"}
DRIVER_LABELS = (*GOOD_DRIVER, "nvidia.com/cuda.driver-version.major", "nvidia.com/cuda.driver-version.minor",
                 "nvidia.com/cuda.driver-version.revision", "nvidia.com/cuda.runtime-version.full",
                 "nvidia.com/cuda.runtime.major", "nvidia.com/cuda.runtime.minor")
PRODUCTS = "NVIDIA-H100-80GB-HBM3,Tesla-V100-SXM2-32GB,NVIDIA-A10"
ASK = {"gpu-placement.io/gpu-memory": "24Gi", "gpu-placement.io/cuda": "12.4",
       "gpu-placement.io/min-compute-capability": "8.0", "gpu-placement.io/gpu-products": PRODUCTS}
# code -> nodes of that class in the 1,000-node cluster (the ghosts are asked about but not in the view)
CLASSES = {"InsufficientGPU": 220, "DriverTooOld": 150, "NodeNotReady": 50, "NoGPU": 100, "NotValidated": 50,
           "DriverUpgrade": 50, "MIGReconfiguring": 50, "BadLabel": 30, "UnknownDriver": 50,
           "ComputeCapability": 50, "ProductMismatch": 100, "UnknownGPUMemory": 30, "InsufficientGPUMemory": 50,
           "UnknownNode": 20}
SHARED_NODES = 300


def _name(code: str, i: int) -> str:
    return f"gpu-node-{code.lower()}-{i:04d}"


def _node(code: str, i: int) -> tuple[list[dict[str, Any]], bool]:
    """The node objects of one member of a class (node, its validator, pods bound there) and whether
    it is in the view. Every member carries a different load, so a per-node figure would show."""
    name = _name(code, i)
    good = {**GOOD_DRIVER}
    validated = code != "NotValidated"
    if code == "NoGPU":
        return [make_node(name, None)], True
    if code == "UnknownNode":
        return [], False
    kwargs: dict[str, Any] = {}
    labels = dict(good)
    drop: tuple[str, ...] = ()
    if code == "DriverTooOld":
        labels = {}  # the published H100 x8 label set: driver 535.129.03, CUDA 12.2
    elif code == "NodeNotReady":
        kwargs["ready"] = False
    elif code == "DriverUpgrade":
        labels["nvidia.com/gpu-driver-upgrade-state"] = ("drain-required", "pod-restart-required")[i % 2]
    elif code == "MIGReconfiguring":
        labels["nvidia.com/mig.config.state"] = "pending"
    elif code == "BadLabel":
        labels["nvidia.com/gpu.memory"] = "abc"
    elif code == "UnknownDriver":
        labels, drop = {}, DRIVER_LABELS
    elif code == "ComputeCapability":
        labels.update({"nvidia.com/gpu.product": "Tesla-V100-SXM2-32GB", "nvidia.com/gpu.compute.major": "7",
                       "nvidia.com/gpu.compute.minor": "0", "nvidia.com/gpu.memory": "32768"})
    elif code == "ProductMismatch":
        labels.update({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB", "nvidia.com/gpu.compute.minor": "0",
                       "nvidia.com/gpu.compute.major": "8", "nvidia.com/gpu.memory": "40960"})
    elif code == "UnknownGPUMemory":
        drop = ("nvidia.com/gpu.memory",)
    elif code == "InsufficientGPUMemory":  # each device smaller than the pod's 24Gi ask
        labels.update({"nvidia.com/gpu.product": "NVIDIA-A10", "nvidia.com/gpu.compute.major": "8",
                       "nvidia.com/gpu.compute.minor": "6", "nvidia.com/gpu.memory": "23028"})
    objects = [make_node(name, "h100x8", labels=labels, drop=drop, **kwargs)]
    if validated:
        objects.append(validator_pod(name))
    busy = 7 + i % 2 if code == "InsufficientGPU" else i % 7  # 0 or 1 GPU left; other classes: any load
    objects += [make_pod("team-b", f"{name}-run-{j}", gpus={GPU: 1}, node=name) for j in range(busy)]
    return objects, True


def _shared_node(i: int) -> list[dict[str, Any]]:
    """A time-sliced H100 advertised as the renamed shared resource, holding one share of its own size."""
    name = f"gpu-node-shared-{i:04d}"
    labels = {**GOOD_DRIVER, "nvidia.com/gpu.replicas": "4", "nvidia.com/gpu.sharing-strategy": "time-slicing",
              "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED"}
    held = make_pod("inference", f"{name}-chat", gpus={SHARED: 1}, node=name,
                    annotations={"gpu-placement.io/gpu-memory": f"{50 + i % 20}Gi"})
    return [make_node(name, "h100", labels=labels, shared_resource=SHARED), validator_pod(name), held]


@cache
def _cluster() -> tuple[Core, tuple[str, ...], tuple[str, ...]]:
    objects: list[dict[str, Any]] = []
    asked: list[str] = []
    for code, count in CLASSES.items():
        for i in range(count):
            members, _ = _node(code, i)
            objects += members
            asked.append(_name(code, i))
    shared = []
    for i in range(SHARED_NODES):
        objects += _shared_node(i)
        shared.append(f"gpu-node-shared-{i:04d}")
    return core_from_objects(Config(), objects), tuple(asked), tuple(shared)


@pytest.fixture(scope="module")
def cluster() -> tuple[Core, tuple[str, ...], tuple[str, ...]]:
    return _cluster()


def _filter(core: Core, pod: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    from gpu_placement.web import asgi

    body = orjson.dumps({"Pod": pod, "Nodes": None, "NodeNames": list(names)})
    status, answer = asgi.call(core.extender_app(), "POST", "/filter", body)
    assert status == 200, answer
    return orjson.loads(answer)


def fit_error(answer: dict[str, Any], all_nodes: int) -> str:
    """What kube-scheduler writes for a pod no node passes: `FitError.Error()` over the extender's
    statuses (`findNodesThatPassExtenders` keeps the unresolvable reason when a node is in both maps)."""
    statuses = {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}
    histogram = sorted(f"{count} {reason}" for reason, count in Counter(statuses.values()).items())
    return f"0/{all_nodes} nodes are available: {', '.join(histogram)}."


def _pod() -> dict[str, Any]:
    return make_pod("team-a", "train-big", gpus={GPU: 2}, annotations=ASK)


def test_a_pod_that_fits_nowhere_on_1000_nodes_gets_a_short_grouped_message(cluster: Any) -> None:
    core, asked, _ = cluster
    assert len(asked) == 1000
    answer = _filter(core, _pod(), asked)
    assert answer["NodeNames"] == [] and answer["Error"] == ""
    message = fit_error(answer, len(asked))
    assert len(message.encode()) <= 4096, message
    counts: Counter[str] = Counter()
    for count, code in re.findall(r"(?:: |, )(\d+) ([A-Za-z]+): ", message):
        counts[code] += int(count)
    assert counts == CLASSES, message  # every code involved, with its count
    # preemption can make room only where devices are busy; the split is the contract's
    assert set(answer["FailedNodes"]) == {_name("InsufficientGPU", i) for i in range(CLASSES["InsufficientGPU"])}


def test_every_member_of_a_class_gets_the_same_string(cluster: Any) -> None:
    """Loads, driver-upgrade states aside, differ on every node; the reason does not."""
    core, asked, _ = cluster
    answer = _filter(core, _pod(), asked)
    statuses = {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}
    by_code: dict[str, set[str]] = {}
    for reason in statuses.values():
        by_code.setdefault(reason.split(":", 1)[0], set()).add(reason)
    assert {code: len(reasons) for code, reasons in by_code.items()} == {
        code: 2 if code == "DriverUpgrade" else 1 for code in CLASSES}  # two upgrade states, two strings


def test_no_reason_names_a_node_or_holds_a_per_node_figure(cluster: Any) -> None:
    core, asked, shared = cluster
    answers = [_filter(core, _pod(), asked),
               _filter(core, make_pod("inference", "chat-big", gpus={SHARED: 1},
                                      annotations={"gpu-placement.io/gpu-memory": "40Gi"}), shared)]
    for answer in answers:
        for node, reason in {**answer["FailedNodes"], **answer["FailedAndUnresolvableNodes"]}.items():
            assert "gpu-node" not in reason and node not in reason, reason
            assert "team-b/" not in reason and "-run-" not in reason, reason  # no pod names either
    # 300 shared nodes, each with a different share taken: one string, no free MiB in it
    shared_answer = answers[1]
    assert len(shared_answer["FailedNodes"]) == SHARED_NODES
    assert set(shared_answer["FailedNodes"].values()) == {
        f"InsufficientGPUMemory: the pod needs 40960 MiB of {SHARED} memory free and the node has less "
        "(per-node figures: gpu-placement explain)"}
    free = {core.view.free_mib[SHARED][name] for name in shared}
    assert len(free) == 20  # the figures are real and differ; they live in the view and in explain
    message = fit_error(shared_answer, SHARED_NODES)
    assert message.startswith(f"0/{SHARED_NODES} nodes are available: {SHARED_NODES} InsufficientGPUMemory: ")
