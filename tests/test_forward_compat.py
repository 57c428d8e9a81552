"""CUDA forward compatibility, from NVIDIA's own figures: NGC framework containers and nvidia/cuda
images carry the CUDA compatibility package, which runs them on older driver branches, on data-center
GPUs only. Decided in the rules, so `/filter` (over HTTP, as kube-scheduler asks) and `explain` agree.

The figures are the release notes': PyTorch/Triton 24.06 (CUDA 12.5) "if you are running on a data
center GPU (for example, T4 or any other data center GPU), you can use NVIDIA driver release 470.57
(or later R470), 525.85 (or later R525), 535.86 (or later R535), or 545.23 (or later R545) ... users
should upgrade from all R418, R440, R450, R460, R510, and R520 drivers".
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from importlib import resources
from typing import Any

import pytest

from gpu_placement.app.explain import explain_pod
from gpu_placement.base.cuda import parse_version
from gpu_placement.facts.cudaneed import container_need, is_data_center
from gpu_placement.samples.cluster import make_node, make_pod
from tests.support.extender import Extender, api_pod, cluster, verdict

GPU = "nvidia.com/gpu"
PYTORCH_24_06 = "nvcr.io/nvidia/pytorch:24.06-py3"  # CUDA 12.5.0


def _node(name: str, driver: str, product: str, cuda: str | None = None) -> dict[str, Any]:
    """A node on this driver; the highest CUDA comes from the driver table unless given (as GFD labels it)."""
    major, minor, *_ = driver.split(".")
    labels = {"nvidia.com/cuda.driver-version.full": driver, "nvidia.com/cuda.driver-version.major": major,
              "nvidia.com/cuda.driver-version.minor": minor, "nvidia.com/gpu.product": product,
              "nvidia.com/cuda.runtime-version.major": None, "nvidia.com/cuda.runtime-version.minor": None,
              "nvidia.com/cuda.runtime.major": None, "nvidia.com/cuda.runtime.minor": None,
              "nvidia.com/cuda.driver.major": None, "nvidia.com/cuda.driver.minor": None,
              "nvidia.com/cuda.driver.rev": None}
    if cuda:
        labels |= {"nvidia.com/cuda.runtime-version.major": cuda.split(".")[0],
                   "nvidia.com/cuda.runtime-version.minor": cuda.split(".")[1]}
    node = make_node(name, "h100x8", labels={k: v for k, v in labels.items() if v is not None})
    for key in [k for k, v in labels.items() if v is None]:
        node["metadata"]["labels"].pop(key, None)
    return node


# The branches 24.06's notes list, at or above each one's lowest driver, on data-center GPUs ...
PASS_NODES = {
    "v100-470": _node("v100-470", "470.57.02", "Tesla-V100-SXM2-16GB"),
    "t4-470": _node("t4-470", "470.256.02", "Tesla-T4"),
    "a100-470": _node("a100-470", "470.141.03", "NVIDIA-A100-SXM4-80GB"),
    "a100-525": _node("a100-525", "525.85.12", "NVIDIA-A100-SXM4-80GB"),
    "h100-535": _node("h100-535", "535.86.10", "NVIDIA-H100-80GB-HBM3"),
    "l4-545": _node("l4-545", "545.23.06", "NVIDIA-L4"),
}
# ... and what they say must be upgraded, a driver below its branch's lowest, and workstation boards.
FAIL_NODES = {
    "v100-418": _node("v100-418", "418.226.00", "Tesla-V100-SXM2-16GB"),
    "v100-440": _node("v100-440", "440.118.02", "Tesla-V100-SXM2-16GB"),
    "a100-450": _node("a100-450", "450.248.02", "NVIDIA-A100-SXM4-80GB"),
    "a100-460": _node("a100-460", "460.106.00", "NVIDIA-A100-SXM4-80GB"),
    "a100-510": _node("a100-510", "510.108.03", "NVIDIA-A100-SXM4-80GB"),
    "a100-520": _node("a100-520", "520.61.05", "NVIDIA-A100-SXM4-80GB"),
    "v100-470-early": _node("v100-470-early", "470.42.01", "Tesla-V100-SXM2-16GB"),
    "rtx4090-470": _node("rtx4090-470", "470.256.02", "NVIDIA-GeForce-RTX-4090"),
    "rtxa6000-470": _node("rtxa6000-470", "470.256.02", "NVIDIA-RTX-A6000"),
    "quadro-470": _node("quadro-470", "470.256.02", "Quadro-RTX-8000"),
}
NAMES = [*PASS_NODES, *FAIL_NODES]


@pytest.fixture(scope="module")
def fleet() -> Iterator[Extender]:
    extender = Extender(cluster(*PASS_NODES.values(), *FAIL_NODES.values()))
    yield extender
    extender.close()


def test_the_release_notes_figures_decide_filter(fleet: Extender) -> None:
    answer = fleet.filter(api_pod(namespace="train", image=PYTORCH_24_06), NAMES)
    assert sorted(answer["NodeNames"]) == sorted(PASS_NODES)
    failed = answer["FailedAndUnresolvableNodes"]
    assert sorted(failed) == sorted(FAIL_NODES)
    assert all(message.startswith("DriverTooOld: ") for message in failed.values())


def test_a_listed_branch_is_named_in_the_sentence_of_one_that_is_not(fleet: Extender) -> None:
    failed = fleet.filter(api_pod(namespace="train", image=PYTORCH_24_06), NAMES)["FailedAndUnresolvableNodes"]
    assert failed["a100-510"] == (
        "DriverTooOld: driver 510.108.03 supports CUDA up to 11.6; the image needs CUDA 12.5.0 (NGC pytorch 24.06), "
        "and minor-version compatibility stays within CUDA 12.x; forward "
        "compatibility (NGC 24.06 release notes) covers R470 470.57+, R525 525.85+, R535 535.86+, R545 545.23+ only")
    assert failed["rtx4090-470"] == (
        "DriverTooOld: driver 470.256.02 supports CUDA up to 11.4; the image needs CUDA 12.5.0 (NGC pytorch 24.06), "
        "and minor-version compatibility stays within CUDA 12.x; forward "
        "compatibility (NGC 24.06 release notes: R470 470.57+, R525 525.85+, R535 535.86+, R545 545.23+) works on "
        "data-center GPUs only, and NVIDIA-GeForce-RTX-4090 is not one")
    assert "covers R470 470.57+" in failed["v100-470-early"]  # 470.42.01 is R470 but below 470.57


def test_explain_names_forward_compatibility_and_its_source(fleet: Extender) -> None:
    """The issue's own case: pytorch 24.05 on a V100 with driver 470.256.02."""
    pod = make_pod("train", "legacy", gpus={GPU: 1}, image="nvcr.io/nvidia/pytorch:24.05-py3")
    text = explain_pod(fleet.core, pod, None)
    assert "  t4-470: forward compatibility (NGC 24.05 release notes)" in text
    assert "  v100-470: forward compatibility (NGC 24.05 release notes)" in text
    assert "  a100-525: CUDA 12.4.1 by minor-version compatibility" in text  # R525 needs no package for 12.x
    rows = {line.split()[0]: line.split()[1] for line in text.split("NODE ", 1)[1].splitlines()[1:]}
    assert rows["v100-470"] == "pass" and rows["rtx4090-470"] == "DriverTooOld"


def test_cuda_base_image_tags_carry_their_brand_alternatives(fleet: Extender) -> None:
    """nvidia/cuda:12.4.1 is built with `brand=...,driver>=470,driver<471 ... driver>=535,driver<536`:
    R470 passes on data-center GPUs; a tag whose Dockerfile text is not in the table gets nothing."""
    passed = fleet.filter(api_pod(namespace="train", image="nvcr.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04"),
                          NAMES)["NodeNames"]
    assert {"v100-470", "t4-470", "a100-470"} <= set(passed) and "rtx4090-470" not in passed
    assert "v100-470-early" in passed  # the image's own term is the whole R470 branch
    unknown = fleet.filter(api_pod(namespace="train", image="nvcr.io/nvidia/cuda:12.5.0-runtime-ubuntu22.04"),
                           NAMES)["NodeNames"]
    assert not {"v100-470", "t4-470", "a100-470"} & set(unknown)
    community = fleet.filter(api_pod(namespace="train", image="pytorch/pytorch:2.4.0-cuda12.4-cudnn9-runtime"),
                             NAMES)["NodeNames"]
    assert not {"v100-470", "t4-470"} & set(community)  # no compatibility package: no forward compatibility


def test_a_forward_compatibility_alternative_of_nvidia_require_cuda_needs_a_data_center_gpu(fleet: Extender) -> None:
    pod = api_pod(namespace="train", image="registry.example.com/app:1")
    pod["spec"]["containers"][0]["env"].append({"name": "NVIDIA_REQUIRE_CUDA", "value": (
        "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=geforcertx,driver>=470,driver<471")})
    answer = fleet.filter(pod, ["v100-470", "rtx4090-470"])
    assert verdict(answer, "v100-470") == "pass"
    assert verdict(answer, "rtx4090-470") == (
        "unresolvable DriverTooOld: driver 470.256.02 supports CUDA up to 11.4; only a forward-compatibility "
        "alternative of NVIDIA_REQUIRE_CUDA holds (brand=geforcertx,driver>=470,driver<471), and forward "
        "compatibility works on data-center GPUs only: NVIDIA-GeForce-RTX-4090 is not one")


def test_strict_pods_get_no_forward_compatibility(fleet: Extender) -> None:
    pod = api_pod(namespace="train", image=PYTORCH_24_06, annotations={"gpu-placement.io/cuda-compat": "none"})
    assert verdict(fleet.filter(pod, ["v100-470"]), "v100-470").startswith("unresolvable DriverTooOld: ")


@pytest.mark.parametrize(("product", "data_center"), [
    ("Tesla-V100-SXM2-16GB", True), ("Tesla-T4", True), ("NVIDIA-A100-SXM4-80GB", True), ("NVIDIA-A10", True),
    ("NVIDIA-H100-80GB-HBM3", True), ("NVIDIA-L40S", True), ("NVIDIA-A100-SXM4-40GB-MIG-1g.5gb", True),
    ("NVIDIA-H100-80GB-HBM3-SHARED", True), ("NVIDIA-GH200-480GB", True),
    ("NVIDIA-GeForce-RTX-4090", False), ("NVIDIA-RTX-A6000", False), ("Quadro-RTX-8000", False),
    ("NVIDIA-TITAN-RTX", False), ("NVIDIA-A10G", False), (None, False), ("", False),
])
def test_which_products_are_data_center_gpus(product: str | None, data_center: bool) -> None:
    assert is_data_center(product) is data_center


def test_every_ngc_release_says_where_its_forward_compatibility_comes_from() -> None:
    raw = json.loads(resources.files("gpu_placement").joinpath("data/ngc-framework-cuda.json").read_text())
    for row in raw["release_cuda"]:
        forward = row["forward_compat"]
        if forward is None:
            assert row["forward_compat_note"], row["release"]
            continue
        assert "https://docs.nvidia.com/" in forward["source"] and f"Release {row['release']}" in forward["source"]
        branches = [parse_version(d) for d in forward["branches"]]
        assert branches == sorted(branches) and all(len(b) == 2 for b in branches), row["release"]
        assert parse_version(row["cuda"])[0] == 12 or parse_version(row["cuda"])[0] == 11
    need = container_need({"name": "main", "image": "nvcr.io/nvidia/pytorch:24.06-py3"}, True)
    assert need is not None and need.branches() == "R470 470.57+, R525 525.85+, R535 535.86+, R545 545.23+"
