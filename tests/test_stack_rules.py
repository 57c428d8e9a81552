"""Decisions that match what the GPU stack enforces on the node (contract sections 5 and 6), over HTTP
through the extender, the way kube-scheduler asks: MPS memory caps, sharing levels on replica and MIG
`single` nodes, CUDA compatibility as the container runtime reads it, and charges frozen at binding.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpu_placement.demo_cluster import make_node, namespace, validator_pod
from tests.test_extender_http import Extender, api_pod

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
APP_IMAGE = "registry.example.com/inference/chat:1.4"  # says nothing about CUDA


def cluster(*nodes: dict[str, Any], extra: tuple[dict[str, Any], ...] = ()) -> list[dict[str, Any]]:
    """Nodes with Ready validators, an exclusive namespace and a shared one."""
    objects: list[dict[str, Any]] = [
        namespace("train"),  # no sharing annotation: exclusive, the default
        namespace("serve", {"gpu-placement.io/sharing": "shared"}),
    ]
    for node in nodes:
        objects += [node, validator_pod(node["metadata"]["name"])]
    return [*objects, *extra]


def verdict(answer: dict[str, Any], node: str) -> str:
    """"pass", or which map the node failed in and why."""
    if node in (answer["NodeNames"] or []):
        return "pass"
    if node in answer["FailedNodes"]:
        return "resolvable " + answer["FailedNodes"][node]
    return "unresolvable " + answer["FailedAndUnresolvableNodes"][node]


# -- 1. MPS caps every client at device memory / replicas ------------------------------------------
H100_MPS = make_node("h100-mps", "h100", labels={"nvidia.com/gpu.sharing-strategy": "mps",
                                                  "nvidia.com/gpu.replicas": "4",
                                                  "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3-SHARED"})
H100_MPS_RENAMED = make_node("h100-mps-renamed", "h100", shared_resource=SHARED,
                             labels={"nvidia.com/gpu.sharing-strategy": "mps", "nvidia.com/gpu.replicas": "4"})
H100_TIMESLICED = make_node("h100-ts", "h100", labels={"nvidia.com/gpu.sharing-strategy": "time-slicing",
                                                        "nvidia.com/gpu.replicas": "4"})


@pytest.fixture(scope="module")
def mps() -> Iterator[Extender]:
    extender = Extender(cluster(H100_MPS, H100_MPS_RENAMED, H100_TIMESLICED))
    yield extender
    extender.close()


@pytest.mark.parametrize("memory", ["40Gi", "79Gi"])
def test_mps_ask_above_the_per_client_cap_is_unresolvable(mps: Extender, memory: str) -> None:
    # 81559 MiB / 4 replicas: the device plugin pins every MPS client at 20389 MiB.
    for node, resource in (("h100-mps", GPU), ("h100-mps-renamed", SHARED)):
        pod = api_pod(namespace="serve", resource=resource, image=APP_IMAGE,
                      annotations={"gpu-placement.io/gpu-memory": memory})
        answer = mps.filter(pod, [node])
        assert verdict(answer, node) == (
            f"unresolvable InsufficientGPUMemory: the pod asks {int(memory[:-2]) * 1024} MiB per device; MPS splits "
            "each device's memory evenly between its replicas (nvidia.com/gpu.memory / nvidia.com/gpu.replicas) and "
            "caps every client there, so the ask cannot fit a share: lower gpu-placement.io/gpu-memory or use a node "
            "with fewer replicas")


def test_mps_ask_within_the_cap_passes_and_time_slicing_has_no_cap(mps: Extender) -> None:
    pod = api_pod(namespace="serve", image=APP_IMAGE, annotations={"gpu-placement.io/gpu-memory": "19Gi"})
    assert verdict(mps.filter(pod, ["h100-mps"]), "h100-mps") == "pass"
    # Time-slicing shares the whole framebuffer: a 40Gi ask is the pod's business there.
    big = api_pod(namespace="serve", image=APP_IMAGE, annotations={"gpu-placement.io/gpu-memory": "40Gi"})
    assert verdict(mps.filter(big, ["h100-ts"]), "h100-ts") == "pass"
