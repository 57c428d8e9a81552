"""Decisions that match what the GPU stack enforces on the node (contract sections 5 and 6), over HTTP
through the extender, the way kube-scheduler asks: MPS memory caps, sharing levels on replica and MIG
`single` nodes, CUDA compatibility as the container runtime reads it, and charges frozen at binding.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from gpu_placement.app.explain import explain_pod
from gpu_placement.samples.cluster import make_node, make_pod, namespace
from gpu_placement.view.ingest import Ingest
from tests.support.extender import Extender, api_pod, cluster, verdict

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
APP_IMAGE = "registry.example.com/inference/chat:1.4"  # says nothing about CUDA


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


# -- 2. an exclusive pod never lands on a replica or a MIG slice ----------------------------------
T4_TIMESLICED = make_node("t4-ts", "t4-timeslicing",  # nvidia.com/gpu: 8 replicas of one T4, not renamed
                          labels={"nvidia.com/gpu.sharing-strategy": "time-slicing"})
A100_MIG_SINGLE = make_node("a100-mig", "h100", labels={  # MIG single strategy: nvidia.com/gpu = 1g.5gb slices
    "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", "nvidia.com/gpu.memory": "4864",
    "nvidia.com/gpu.count": "7", "nvidia.com/gpu.family": "ampere", "nvidia.com/gpu.compute.major": "8",
    "nvidia.com/gpu.compute.minor": "0", "nvidia.com/mig.strategy": "single", "nvidia.com/mig.config": "all-1g.5gb",
    "nvidia.com/gpu.slices.gi": "1", "nvidia.com/gpu.slices.ci": "1", "nvidia.com/gpu.multiprocessors": "14"})
A100_WHOLE = make_node("a100-whole", "h100", labels={"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
                                                      "nvidia.com/gpu.memory": "40960"})
SHARING_NODES = ["t4-ts", "a100-mig", "a100-whole"]


@pytest.fixture(scope="module")
def sharing() -> Iterator[Extender]:
    extender = Extender(cluster(T4_TIMESLICED, A100_MIG_SINGLE, A100_WHOLE))
    yield extender
    extender.close()


def test_exclusive_pod_is_kept_off_replicas_and_mig_single_slices(sharing: Extender) -> None:
    answer = sharing.filter(api_pod(namespace="train", image=APP_IMAGE), SHARING_NODES)
    assert answer["NodeNames"] == ["a100-whole"]
    assert answer["FailedNodes"] == {}  # preemption cannot turn a slice into a GPU
    assert answer["FailedAndUnresolvableNodes"] == {
        "t4-ts": "SharingMismatch: the pod's sharing level is exclusive (whole GPUs), but nvidia.com/gpu here is a "
                 "replica of a shared GPU (nvidia.com/gpu.replicas > 1, time-slicing or MPS); to accept a share, set "
                 "gpu-placement.io/sharing=shared on the pod (allowed in any namespace)",
        "a100-mig": "SharingMismatch: the pod's sharing level is exclusive (whole GPUs), but nvidia.com/gpu here is "
                    "a MIG 1g.5gb slice (nvidia.com/mig.strategy=single); to accept that slice, set "
                    "gpu-placement.io/sharing=mig-1g.5gb on the pod"}


@pytest.mark.parametrize(("ns", "annotations", "passes"), [
    # Only an exclusive level is kept off shares and slices; narrower levels take what nvidia.com/gpu gives.
    ("serve", {}, SHARING_NODES),  # the namespace shares: a replica is what it asked for
    ("serve", {"gpu-placement.io/sharing": "exclusive"}, SHARING_NODES),  # a pod cannot widen its namespace's
    ("train", {"gpu-placement.io/sharing": "shared"}, SHARING_NODES),  # a pod may narrow it
    ("train", {"gpu-placement.io/sharing": "mig-1g.5gb"}, SHARING_NODES),
])
def test_the_pod_sharing_level_comes_from_its_namespace_narrowed_by_the_pod(
        sharing: Extender, ns: str, annotations: dict[str, str], passes: list[str]) -> None:
    assert sharing.filter(api_pod(namespace=ns, image=APP_IMAGE, annotations=annotations),
                          SHARING_NODES)["NodeNames"] == passes


def test_gpu_products_matches_a_slice_only_for_a_pod_that_asked_for_slices(sharing: Extender) -> None:
    products = {"gpu-placement.io/gpu-products": "NVIDIA-A100-SXM4-40GB"}
    exclusive = sharing.filter(api_pod(namespace="train", image=APP_IMAGE, annotations=products), SHARING_NODES)
    assert exclusive["NodeNames"] == ["a100-whole"]
    assert exclusive["FailedAndUnresolvableNodes"]["a100-mig"].startswith("SharingMismatch: ")
    shared = sharing.filter(api_pod(namespace="serve", image=APP_IMAGE, annotations=products), SHARING_NODES)
    assert shared["NodeNames"] == ["a100-whole"]
    assert shared["FailedAndUnresolvableNodes"]["a100-mig"].startswith("ProductMismatch: ")
    slices = sharing.filter(api_pod(namespace="train", image=APP_IMAGE, annotations={
        **products, "gpu-placement.io/sharing": "mig-1g.5gb"}), SHARING_NODES)
    assert slices["NodeNames"] == ["a100-mig", "a100-whole"]


def test_a_namespace_sharing_change_reaches_the_extender(sharing: Extender) -> None:
    """The level is read from the view's namespace record: no pod-side copy to go stale."""
    pod = api_pod(name="late-0", namespace="later", image=APP_IMAGE)
    assert "t4-ts" not in sharing.filter(pod, SHARING_NODES)["NodeNames"]  # unknown namespace: exclusive
    sharing.core.view.upsert_namespace(Ingest(sharing.core.config).namespace(
        namespace("later", {"gpu-placement.io/sharing": "shared"})))
    assert "t4-ts" in sharing.filter(pod, SHARING_NODES)["NodeNames"]


# -- 3. CUDA as the container runtime and minor-version compatibility decide -----------------------
def _driver(version: str, cuda: str) -> dict[str, str]:
    major, minor, *_ = version.split(".")
    return {"nvidia.com/cuda.driver-version.full": version, "nvidia.com/cuda.driver-version.major": major,
            "nvidia.com/cuda.driver-version.minor": minor, "nvidia.com/cuda.runtime-version.full": cuda,
            "nvidia.com/cuda.runtime-version.major": cuda.split(".")[0],
            "nvidia.com/cuda.runtime-version.minor": cuda.split(".")[1]}


H100_R535 = make_node("h100-r535", "h100x8")  # published labels: driver 535.129.03, CUDA 12.2, data center
H100_R545 = make_node("h100-r545", "h100x8", labels=_driver("545.23.08", "12.3"))
V100_R470 = make_node("v100-r470", "h100x8", labels={**_driver("470.256.02", "11.4"), "nvidia.com/gpu.family": "volta",
                                                     "nvidia.com/gpu.product": "Tesla-V100-SXM2-16GB",
                                                     "nvidia.com/gpu.compute.major": "7",
                                                     "nvidia.com/gpu.compute.minor": "0"})
CUDA_NODES = ["h100-r535", "h100-r545", "v100-r470"]
# nvidia/cuda:12.4.1's own NVIDIA_REQUIRE_CUDA, shortened to the brands that matter here.
REQUIRE_12_4 = ("cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=nvidia,driver>=470,driver<471 "
                "brand=tesla,driver>=525,driver<526 brand=nvidia,driver>=525,driver<526 "
                "brand=tesla,driver>=535,driver<536 brand=nvidia,driver>=535,driver<536")


@pytest.fixture(scope="module")
def drivers() -> Iterator[Extender]:
    extender = Extender(cluster(H100_R535, H100_R545, V100_R470))
    yield extender
    extender.close()


def test_cuda_12_4_images_run_on_r535_by_minor_version_compatibility(drivers: Extender) -> None:
    answer = drivers.filter(api_pod(namespace="train", image="pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"),
                            CUDA_NODES)
    assert answer["NodeNames"] == ["h100-r535", "h100-r545"]
    # A CUDA 11 driver is another major: minor-version compatibility does not cross it, and an image
    # without NVIDIA's compatibility package has no forward compatibility; the sentence says why.
    message = answer["FailedAndUnresolvableNodes"]["v100-r470"]
    assert message.startswith("DriverTooOld: driver 470.256.02 supports CUDA up to 11.4; the image needs CUDA 12.4")
    assert message.endswith("and minor-version compatibility stays within CUDA 12.x")
    assert "v100-r470" not in message  # node-independent (contract 3)


@pytest.mark.parametrize("image", ["nvcr.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04",
                                   "nvcr.io/nvidia/pytorch:24.05-py3"])
def test_nvidia_12_4_images_also_run_on_a_data_center_r470_by_forward_compatibility(drivers: Extender,
                                                                                    image: str) -> None:
    answer = drivers.filter(api_pod(namespace="train", image=image), CUDA_NODES)
    assert sorted(answer["NodeNames"]) == ["h100-r535", "h100-r545", "v100-r470"]


def test_explain_says_which_cuda_rule_lets_each_node_run_the_image(drivers: Extender) -> None:
    plain = make_pod("train", "tagged", gpus={GPU: 1}, image="nvcr.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04")
    text = explain_pod(drivers.core, plain, None)
    assert "  h100-r535: CUDA 12.4.1 by minor-version compatibility (the driver supports CUDA 12.2)" in text
    assert "  h100-r545: CUDA 12.4.1 by minor-version compatibility (the driver supports CUDA 12.3)" in text
    required = make_pod("train", "required", gpus={GPU: 1}, image="registry.example.com/team/trainer:7")
    required["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_REQUIRE_CUDA", "value": REQUIRE_12_4}]
    text = explain_pod(drivers.core, required, None)
    assert "  h100-r535: NVIDIA_REQUIRE_CUDA of container main: brand=nvidia,driver>=535,driver<536 holds" in text
    assert "  v100-r470: NVIDIA_REQUIRE_CUDA of container main: brand=tesla,driver>=470,driver<471 holds" in text


def test_ngc_release_tag_gets_the_cuda_of_its_release(drivers: Extender) -> None:
    req = drivers.core.placement.requirements(api_pod(namespace="train", image="nvcr.io/nvidia/pytorch:24.05-py3"))
    assert req.describe().split("; ")[1] == ("CUDA >= 12.4.1 (NGC pytorch 24.05 of container main, CUDA 12.4.1 by "
                                              "the NGC support matrix, minor-version compatible, or forward "
                                              "compatibility on data-center GPUs with R470 470.57+, R525 525.85+, "
                                              "R535 535.86+, R545 545.23+ (NGC 24.05 release notes))")


def test_nvidia_require_cuda_alternatives_decide_as_the_runtime_does(drivers: Extender) -> None:
    pod = api_pod(namespace="train", image="registry.example.com/team/trainer:7")
    pod["spec"]["containers"][0]["env"].append({"name": "NVIDIA_REQUIRE_CUDA", "value": REQUIRE_12_4})
    answer = drivers.filter(pod, CUDA_NODES)
    # R535 (brand nvidia) and R470 (brand tesla) are listed branches; R545 is neither listed nor CUDA 12.4.
    assert answer["NodeNames"] == ["h100-r535", "v100-r470"]
    assert answer["FailedAndUnresolvableNodes"] == {"h100-r545": (
        "DriverTooOld: driver 545.23.08 supports CUDA up to 12.3 and meets no alternative of NVIDIA_REQUIRE_CUDA, "
        "so the container runtime would refuse to start it; use a node with a newer driver")}
    assert "any of 7 alternatives (cuda>=12.4 | brand=tesla,driver>=470,driver<471 | " \
           "brand=nvidia,driver>=470,driver<471 | ...)" in drivers.core.placement.requirements(pod).describe()


def test_an_explicit_cuda_annotation_is_strict_unless_it_says_minor(drivers: Extender) -> None:
    strict = api_pod(namespace="train", image=APP_IMAGE, annotations={"gpu-placement.io/cuda": "12.4"})
    answer = drivers.filter(strict, CUDA_NODES)
    assert answer["NodeNames"] == []
    assert answer["FailedAndUnresolvableNodes"]["h100-r535"].startswith("DriverTooOld: ")
    assert "(pod annotation, strict)" in drivers.core.placement.requirements(strict).describe()
    minor = api_pod(namespace="train", image=APP_IMAGE, annotations={"gpu-placement.io/cuda": "12.4",
                                                                     "gpu-placement.io/cuda-compat": "minor"})
    assert drivers.filter(minor, CUDA_NODES)["NodeNames"] == ["h100-r535", "h100-r545"]
    # cuda-compat: none makes an image's version strict as well
    none = api_pod(namespace="train", image="nvcr.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04",
                   annotations={"gpu-placement.io/cuda-compat": "none"})
    assert drivers.filter(none, CUDA_NODES)["NodeNames"] == []


# -- 4. a running pod's charge is fixed when it is first seen bound -------------------------------
T4_RENAMED = make_node("t4-shared", "t4-timeslicing", shared_resource=SHARED)  # 8 x 1920 MiB = 15360 MiB


@pytest.fixture
def frozen() -> Iterator[Extender]:
    running = make_pod("serve", "big", gpus={SHARED: 1}, node="t4-shared", image=APP_IMAGE,
                       annotations={"gpu-placement.io/gpu-memory": "14Gi"})
    extender = Extender(cluster(T4_RENAMED, extra=(running,)))
    yield extender
    extender.close()


def _event(extender: Extender, kind: str, obj: dict[str, Any]) -> None:
    """What the watch delivers: the object as the API server now has it."""
    Ingest(extender.core.config).event(extender.core.view, kind, "MODIFIED", obj)


def test_an_annotation_edit_on_a_running_pod_frees_nothing(frozen: Extender) -> None:
    pod = api_pod(name="next-0", namespace="serve", resource=SHARED, image=APP_IMAGE,
                  annotations={"gpu-placement.io/gpu-memory": "2Gi"})
    assert frozen.filter(pod, ["t4-shared"])["FailedNodes"]["t4-shared"].startswith("InsufficientGPUMemory: ")
    # kubectl annotate pod big gpu-placement.io/gpu-memory=1Mi --overwrite: the process still holds 14Gi.
    _event(frozen, "pods", make_pod("serve", "big", gpus={SHARED: 1}, node="t4-shared", image=APP_IMAGE,
                                    annotations={"gpu-placement.io/gpu-memory": "1Mi"}))
    assert frozen.filter(pod, ["t4-shared"])["FailedNodes"]["t4-shared"].startswith("InsufficientGPUMemory: ")
    assert frozen.core.view.free_mib[SHARED]["t4-shared"] == 15360 - 14336


def test_a_namespace_default_change_does_not_recharge_running_pods(frozen: Extender) -> None:
    _event(frozen, "namespaces", namespace("serve", {"gpu-placement.io/sharing": "shared",
                                                     "gpu-placement.io/gpu-memory": "512Mi"}))
    _event(frozen, "pods", make_pod("serve", "small", gpus={SHARED: 1}, node="t4-shared", image=APP_IMAGE))
    assert frozen.core.view.free_mib[SHARED]["t4-shared"] == 15360 - 14336 - 512
    _event(frozen, "namespaces", namespace("serve", {"gpu-placement.io/sharing": "shared",
                                                     "gpu-placement.io/gpu-memory": "4Mi"}))
    assert frozen.core.view.free_mib[SHARED]["t4-shared"] == 15360 - 14336 - 512  # "small" still holds 512Mi
    pod = api_pod(name="next-1", namespace="serve", resource=SHARED, image=APP_IMAGE,
                  annotations={"gpu-placement.io/gpu-memory": "1000Mi"})
    assert frozen.filter(pod, ["t4-shared"])["FailedNodes"]["t4-shared"].startswith("InsufficientGPUMemory: ")


def test_explain_shows_the_frozen_charge_and_where_it_came_from(frozen: Extender) -> None:
    _event(frozen, "pods", make_pod("serve", "big", gpus={SHARED: 1}, node="t4-shared", image=APP_IMAGE,
                                    annotations={"gpu-placement.io/gpu-memory": "1Mi"}))
    text = explain_pod(frozen.core, make_pod("serve", "big", gpus={SHARED: 1}, node="t4-shared", image=APP_IMAGE,
                                             annotations={"gpu-placement.io/gpu-memory": "1Mi"}), None)
    assert ("holds 1x nvidia.com/gpu.shared = 14336 MiB on t4-shared, fixed when first seen bound (14Gi from the "
            "pod annotation); later annotation or namespace-default edits do not change it") in text
