"""Driver and CUDA compatibility (contract section 5), checked against the CUDA toolkit driver table."""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import pytest

from gpu_placement.base.config import Config
from gpu_placement.base.cuda import driver_table, parse_version
from gpu_placement.decide.placement import Placement
from gpu_placement.decide.requirements import infer_cuda, requirements_for
from gpu_placement.decide.rules import Rejection, check_node
from gpu_placement.facts.namespaces import namespace_from_json
from gpu_placement.facts.nodes import ValidatorState, node_from_json
from gpu_placement.samples.cluster import base_labels, make_node, make_pod, namespace, validator_pod
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest

CONFIG = Config()
TABLE = json.loads(resources.files("gpu_placement").joinpath("data/cuda-driver-table.json").read_text())
ROWS = [(row["cuda"], row["min_driver"]) for row in TABLE["toolkit_min_driver"]]
NGINX = "nginx:1.27"  # an image that says nothing about CUDA


def _below(driver: str) -> str:
    """One revision below a driver version, keeping nvidia-smi's zero padding: 450.51.05 -> 450.51.04."""
    parts = driver.split(".")
    parts[-1] = f"{int(parts[-1]) - 1:0{len(parts[-1])}d}"
    return ".".join(parts)


def _labels(driver: str | None = None, runtime: str | None = None, compute: str | None = "9.0",
            **extra: str) -> dict[str, str]:
    """H100 labels with exactly the driver, runtime and compute labels given (None: label absent)."""
    labels = {k: v for k, v in base_labels("h100").items()
              if not k.startswith(("nvidia.com/cuda.", "nvidia.com/gpu.compute."))}
    if driver is not None:
        labels["nvidia.com/cuda.driver-version.full"] = driver
    if runtime is not None:
        major, minor = runtime.split(".")
        labels["nvidia.com/cuda.runtime-version.major"] = major
        labels["nvidia.com/cuda.runtime-version.minor"] = minor
    if compute is not None:
        major, minor = compute.split(".")
        labels["nvidia.com/gpu.compute.major"] = major
        labels["nvidia.com/gpu.compute.minor"] = minor
    labels.update(extra)
    return labels


def _pod(annotations: dict[str, str] | None = None, image: str = NGINX, ns: str = "ml",
         env: list[dict[str, str]] | None = None) -> dict[str, Any]:
    pod = make_pod(ns, "job", gpus={"nvidia.com/gpu": 1}, image=image, annotations=annotations)
    if env is not None:
        pod["spec"]["containers"][0]["env"] = env
    return pod


def verdict(labels: dict[str, str], pod: dict[str, Any], ns: dict[str, Any] | None = None) -> str:
    """'pass', or the rejection as kube-scheduler would show it."""
    facts = node_from_json(make_node("gpu-1", None, labels=labels))
    req = requirements_for(pod, namespace_from_json(ns) if ns else None, CONFIG.is_gpu_resource)
    entry = check_node(facts, ValidatorState("gpu-operator/validator", True), req, CONFIG)
    return entry.message if isinstance(entry, Rejection) else "pass"


def _runtime_for(driver: str) -> str:
    cuda = driver_table().max_cuda(parse_version(driver))
    assert cuda is not None
    return f"{cuda[0]}.{cuda[1]}"


# -- the driver table, row by row ----------------------------------------------------------------
@pytest.mark.parametrize("labelled", [False, True], ids=["derived", "runtime-labels"])
@pytest.mark.parametrize(("cuda", "min_driver"), ROWS, ids=[row[0] for row in ROWS])
def test_driver_at_minimum_passes_and_one_revision_below_fails(cuda: str, min_driver: str, labelled: bool) -> None:
    """derived: GFD published only the driver; runtime-labels: also the highest CUDA it supports."""
    pod = _pod({"gpu-placement.io/cuda": cuda})
    at = _labels(min_driver, _runtime_for(min_driver) if labelled else None)
    assert verdict(at, pod) == "pass"
    low = _below(min_driver)
    below = _labels(low, _runtime_for(low) if labelled and driver_table().max_cuda(parse_version(low)) else None)
    message = verdict(below, pod)
    assert message.startswith("DriverTooOld: driver "), message
    assert f"CUDA >= {cuda}" in message  # says what the pod needs


MINORS = sorted({tuple(parse_version(cuda)[:2]) for cuda, _ in ROWS})


@pytest.mark.parametrize("minor", MINORS, ids=[f"{m[0]}.{m[1]}" for m in MINORS])
def test_major_minor_needs_the_first_release_of_that_minor(minor: tuple[int, int]) -> None:
    first = min((parse_version(drv), drv) for cuda, drv in ROWS if parse_version(cuda)[:2] == minor)[1]
    pod = _pod({"gpu-placement.io/cuda": f"{minor[0]}.{minor[1]}"})
    assert verdict(_labels(first), pod) == "pass"
    assert verdict(_labels(_below(first)), pod).startswith("DriverTooOld: ")


def test_driver_older_than_every_table_row_is_too_old_not_unknown() -> None:
    """The node publishes its driver (418.87.01, CUDA 10.1 era); it is known, and too old."""
    message = verdict(_labels("418.87.01"), _pod({"gpu-placement.io/cuda": "11.0"}))
    assert message.startswith("DriverTooOld: driver 418.87.01 "), message


def test_rejection_names_driver_and_need() -> None:
    message = verdict(_labels("535.129.03", "12.2"), _pod({"gpu-placement.io/cuda": "12.4"}))
    assert message == ("DriverTooOld: driver 535.129.03 supports CUDA up to 12.2; "
                       "the pod needs CUDA >= 12.4 (pod annotation)")


# -- minor-version compatibility ---------------------------------------------------------------
@pytest.mark.parametrize(("cuda", "floor"), [("11.8", "450.80.02"), ("12.4", "525.60.13"), ("13.1", "580.65.06")])
def test_minor_version_compatibility_floor(cuda: str, floor: str) -> None:
    assert TABLE["minor_version_compat_floor"][cuda.split(".")[0]] == floor
    compat = _pod({"gpu-placement.io/cuda": cuda, "gpu-placement.io/cuda-compat": "minor"})
    strict = _pod({"gpu-placement.io/cuda": cuda})
    assert verdict(_labels(floor), compat) == "pass"
    assert verdict(_labels(floor), strict).startswith("DriverTooOld: ")  # without the annotation: the table
    message = verdict(_labels(_below(floor)), compat)
    assert message.startswith("DriverTooOld: driver "), f"driver {_below(floor)} for CUDA {cuda} (minor): {message}"
    assert "minor-version compatibility" in message


def test_cuda_11_minor_compatibility_needs_450_80_02_not_just_any_11_driver() -> None:
    """450.51.05 runs CUDA 11.0 but is below the 11.x minor-version compatibility floor (450.80.02)."""
    compat = _pod({"gpu-placement.io/cuda": "11.8", "gpu-placement.io/cuda-compat": "minor"})
    assert verdict(_labels("450.51.05"), compat).startswith("DriverTooOld: ")


def test_minor_compatibility_accepts_a_patch_release_and_never_crosses_majors() -> None:
    patch = _pod({"gpu-placement.io/cuda": "12.4.1", "gpu-placement.io/cuda-compat": "minor"})
    assert verdict(_labels("525.60.13"), patch) == "pass"
    cuda13 = _pod({"gpu-placement.io/cuda": "13.0", "gpu-placement.io/cuda-compat": "minor"})
    assert verdict(_labels("575.57.08", "12.9"), cuda13).startswith("DriverTooOld: ")


def test_cuda_compat_none_is_the_default() -> None:
    pod = _pod({"gpu-placement.io/cuda": "12.4", "gpu-placement.io/cuda-compat": "none"})
    assert verdict(_labels("525.60.13"), pod).startswith("DriverTooOld: ")


# -- compute capability ------------------------------------------------------------------------
def test_cuda_13_needs_compute_capability_7_5() -> None:
    cuda13 = _pod({"gpu-placement.io/cuda": "13.0"})
    volta = verdict(_labels("580.65.06", "13.0", compute="7.0"), cuda13)
    assert volta.startswith("ComputeCapability: the node's GPU ") and "7.0" in volta and "7.5" in volta
    assert verdict(_labels("580.65.06", "13.0", compute="7.5"), cuda13) == "pass"  # Turing (T4)
    assert verdict(_labels("580.65.06", "13.0", compute="7.0"), _pod({"gpu-placement.io/cuda": "12.9"})) == "pass"
    image13 = _pod(image="nvcr.io/nvidia/cuda:13.0.0-devel-ubuntu24.04")
    assert verdict(_labels("580.65.06", "13.0", compute="6.1"), image13).startswith("ComputeCapability: ")


def test_min_compute_capability() -> None:
    pod = _pod({"gpu-placement.io/min-compute-capability": "8.0"})
    t4 = verdict(_labels("550.54.15", compute="7.5"), pod)
    assert t4.startswith("ComputeCapability: ") and "gpu-placement.io/min-compute-capability" in t4
    assert verdict(_labels("550.54.15", compute="8.0"), pod) == "pass"
    assert verdict(_labels("550.54.15", compute="9.0"), pod) == "pass"
    assert verdict(_labels("550.54.15", compute=None), pod).startswith("UnknownDriver: ")


# -- driver floor and products -----------------------------------------------------------------
def test_min_driver() -> None:
    pod = _pod({"gpu-placement.io/min-driver": "550.54.15"})
    assert verdict(_labels("550.54.15"), pod) == "pass"
    assert verdict(_labels("555.42.02"), pod) == "pass"
    old = verdict(_labels("550.54.14"), pod)
    assert old.startswith("DriverTooOld: driver 550.54.14 ") and "gpu-placement.io/min-driver" in old
    assert verdict(_labels(None, "12.4"), pod).startswith("UnknownDriver: ")  # runtime labels alone: no driver


@pytest.mark.parametrize(("accepted", "product", "sharing", "expected"), [
    # Time-slicing without renaming calls the product <name>-SHARED: that GPU only for a pod that asked to share.
    ("Tesla-T4", "Tesla-T4-SHARED", "shared", "pass"),
    ("Tesla-T4", "Tesla-T4-SHARED", None, "ProductMismatch"),
    ("Tesla-T4-SHARED", "Tesla-T4-SHARED", None, "pass"),  # named exactly: the user meant it
    # MIG single strategy: <name>-MIG-<profile>, that GPU only for a pod that asked for that slice.
    ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", "mig-1g.10gb", "pass"),
    ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", "mig-2g.20gb", "ProductMismatch"),
    ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", "shared", "ProductMismatch"),
    ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb", None, "SharingMismatch"),  # exclusive: never
    ("NVIDIA-H100-80GB-HBM3,NVIDIA-A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB", None, "pass"),
    (" NVIDIA-H100-80GB-HBM3 , NVIDIA-A100-SXM4-80GB ", "NVIDIA-H100-80GB-HBM3", None, "pass"),
    ("NVIDIA-H100-80GB-HBM3,NVIDIA-A100-SXM4-80GB", "NVIDIA-A10G", None, "ProductMismatch"),
    ("NVIDIA-H100-80GB-HBM3", "NVIDIA-H100-80GB-HBM3-MIG-1g.10gb-SHARED", "shared", "pass"),  # both, as GFD writes it
    ("NVIDIA-H100", "NVIDIA-H100-80GB-HBM3", None, "ProductMismatch"),  # no prefix matching
])
def test_gpu_products(accepted: str, product: str, sharing: str | None, expected: str) -> None:
    annotations = {"gpu-placement.io/gpu-products": accepted}
    if sharing is not None:
        annotations["gpu-placement.io/sharing"] = sharing
    message = verdict(_labels("550.54.15", **{"nvidia.com/gpu.product": product}), _pod(annotations))
    if expected == "pass":
        assert message == "pass"
    else:
        assert message.startswith(f"{expected}: ")
        assert ("gpu-placement.io/gpu-products" if expected == "ProductMismatch" else "gpu-placement.io/sharing") \
            in message


def test_gpu_products_namespace_default_and_pod_override() -> None:
    ns = namespace("ml", {"gpu-placement.io/gpu-products": "NVIDIA-A100-SXM4-80GB"})
    h100 = _labels("550.54.15")
    assert verdict(h100, _pod(), ns).startswith("ProductMismatch: ")
    assert verdict(h100, _pod({"gpu-placement.io/gpu-products": "NVIDIA-H100-80GB-HBM3"}), ns) == "pass"


# -- unknown facts -----------------------------------------------------------------------------
@pytest.mark.parametrize("pod", [
    _pod({"gpu-placement.io/cuda": "12.2"}),
    _pod(image="nvcr.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04"),
    _pod({"gpu-placement.io/min-driver": "535"}),
], ids=["annotation", "image", "min-driver"])
def test_missing_driver_labels_fail_a_pod_with_a_requirement(pod: dict[str, Any]) -> None:
    message = verdict(_labels(None), pod)
    assert message.startswith("UnknownDriver: ") and "publishes no driver" in message, message


def test_missing_driver_labels_pass_a_pod_without_requirements() -> None:
    assert verdict(_labels(None, compute=None), _pod()) == "pass"


# -- where the requirement comes from ----------------------------------------------------------
def _cuda_of(pod: dict[str, Any], ns: dict[str, Any] | None = None) -> tuple[tuple[int, ...] | None, str]:
    """The pod's explicit CUDA (its annotation or the namespace default)."""
    req = requirements_for(pod, namespace_from_json(ns) if ns else None, CONFIG.is_gpu_resource)
    assert req.error is None, req.error
    return req.cuda, req.cuda_source


def _image_of(pod: dict[str, Any], ns: dict[str, Any] | None = None) -> tuple[tuple[int, ...] | None, str]:
    """What the pod's images need, inferred."""
    req = requirements_for(pod, namespace_from_json(ns) if ns else None, CONFIG.is_gpu_resource)
    assert req.error is None, req.error
    return (req.image_cuda.version, req.image_cuda.source) if req.image_cuda else (None, "")


DIGEST = "sha256:" + "0123456789abcdef" * 4


@pytest.mark.parametrize(("image", "cuda"), [
    ("nvcr.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04", (12, 4, 1)),
    ("docker.io/nvidia/cuda:12.4.1-cudnn-devel-ubuntu22.04", (12, 4, 1)),
    ("nvidia/cuda:13.0.0-devel-ubuntu24.04", (13, 0, 0)),
    ("pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime", (12, 1)),
    ("vllm/vllm-openai:v0.5.0-cuda-12.4", (12, 4)),
    ("localhost:5000/cuda:11.8.0-base", (11, 8, 0)),
    (f"nvcr.io/nvidia/cuda:12.2.0-base-ubuntu22.04@{DIGEST}", (12, 2, 0)),
    (f"localhost:5000/ml/pytorch:2.3.0-cuda12.1-cudnn8-runtime@{DIGEST}", (12, 1)),
    (f"nvcr.io/nvidia/cuda@{DIGEST}", None),
    ("nvcr.io/nvidia/cuda", None),
    ("localhost:5000/cuda", None),
    ("nvidia/cuda:latest", None),
    ("nginx:1.27", None),
    ("registry.example.com:443/team/app:1.2.3", None),
], ids=lambda value: value if isinstance(value, str) else "")
def test_cuda_inferred_from_image_tag(image: str, cuda: tuple[int, ...] | None) -> None:
    found, source = _image_of(_pod(image=image))
    assert found == cuda, image
    if cuda is not None:
        assert source == "image tag of container main"
    assert _cuda_of(_pod(image=image)) == (None, "")  # an image's need is never an explicit annotation


@pytest.mark.parametrize(("image", "cuda"), [
    ("nvcr.io/nvidia/pytorch:24.05-py3", (12, 4, 1)),  # the example: NGC release 24.05 is CUDA 12.4.1
    ("nvcr.io/nvidia/tensorflow:24.05-tf2-py3", (12, 4, 1)),  # one release, one CUDA, every framework
    ("nvcr.io/nvidia/tritonserver:24.05-py3", (12, 4, 1)),
    ("nvcr.io/nvidia/pytorch:23.10-py3", (12, 2, 2)),
    ("nvcr.io/nvidia/pytorch:25.01-py3", (12, 8, 0)),
    ("nvcr.io/nvidia/jax:22.09-py3", (11, 8, 0)),  # the first row, checked against the 22.09 release notes
    ("nvcr.io/nvidia/pytorch:25.10-py3", (13, 0, 2)),  # CUDA 13: these images need R580 or newer
    ("nvcr.io/nvidia/pytorch:19.01-py3", None),  # not in the table: nothing inferred, nothing guessed
    ("docker.io/someone/pytorch:24.05-py3", None),  # not NGC: YY.MM means nothing there
])
def test_ngc_framework_release_maps_to_its_cuda(image: str, cuda: tuple[int, ...] | None) -> None:
    found, source = _image_of(_pod(image=image))
    assert found == cuda, image
    if cuda is not None:
        assert source.startswith("NGC ") and "NGC support matrix" in source


def test_ngc_table_rows_say_where_they_were_checked_and_never_go_back() -> None:
    """A typo in a new row (24.21, 12.4.10, 11.8 after 12.x) shows up here, not as a wrong placement."""
    import json
    from importlib import resources

    raw = json.loads(resources.files("gpu_placement").joinpath("data/ngc-framework-cuda.json").read_text())
    rows = raw["release_cuda"]
    releases = [row["release"] for row in rows]
    assert releases == sorted(releases) and len(set(releases)) == len(releases)
    for row in rows:
        year, month = row["release"].split(".")
        assert len(year) == 2 and 1 <= int(month) <= 12, row
        assert row["source"], row  # where the figure was checked, or "unconfirmed: ..."
    cudas = [tuple(int(part) for part in row["cuda"].split(".")) for row in rows]
    assert all(len(cuda) == 3 for cuda in cudas)
    assert cudas == sorted(cudas), "a later release never ships an older CUDA"


def test_cuda_inferred_from_nvidia_require_cuda() -> None:
    env = [{"name": "PATH", "value": "/usr/bin"},
           {"name": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=12.2 brand=tesla,driver>=470,driver<471"}]
    req = requirements_for(_pod(image="registry.example.com/team/trainer:7", env=env), None, CONFIG.is_gpu_resource)
    assert req.image_cuda is not None and req.image_cuda.version == (12, 2)
    assert req.image_cuda.terms == ((("cuda", ">=", "12.2"),), (("brand", "=", "tesla"), ("driver", ">=", "470"),
                                                                  ("driver", "<", "471")))
    # the env of the image beats its tag: it is what the container runtime itself checks
    assert _image_of(_pod(image="nvcr.io/nvidia/cuda:12.6.0-base-ubuntu22.04", env=env))[0] == (12, 2)
    # ... unless the runtime is told not to check it
    disabled = [*env, {"name": "NVIDIA_DISABLE_REQUIRE", "value": "true"}]
    assert _image_of(_pod(image="nvcr.io/nvidia/cuda:12.6.0-base-ubuntu22.04", env=disabled))[0] == (12, 6, 0)


def test_highest_cuda_of_all_containers_and_init_containers() -> None:
    pod = _pod(image="nvcr.io/nvidia/cuda:12.1.0-base-ubuntu22.04")
    pod["spec"]["initContainers"] = [{"name": "warmup", "image": "nvcr.io/nvidia/cuda:12.6.2-base-ubuntu22.04"}]
    pod["spec"]["containers"].append({"name": "sidecar", "image": "busybox:1.36"})
    need = infer_cuda(pod["spec"])
    assert need is not None and (need.version, need.source) == ((12, 6, 2), "image tag of container warmup")


def test_namespace_default_cuda_and_the_image_need_both_hold() -> None:
    ns = namespace("ml", {"gpu-placement.io/cuda": "12.4"})
    pod = _pod(image="nvcr.io/nvidia/cuda:12.6.0-base-ubuntu22.04")
    assert _cuda_of(pod, ns) == ((12, 4), "namespace default")
    assert _image_of(pod, ns)[0] == (12, 6, 0)
    # R550 (CUDA 12.4): the namespace floor holds, the 12.6 image runs by minor-version compatibility.
    assert verdict(_labels("550.54.15", "12.4"), pod, ns) == "pass"
    # R535 (CUDA 12.2): the image would run, but the namespace's strict floor is not met.
    assert verdict(_labels("535.129.03", "12.2"), pod, ns).startswith("DriverTooOld: ")


def test_pod_annotation_always_wins() -> None:
    ns = namespace("ml", {"gpu-placement.io/cuda": "12.4"})
    pod = _pod({"gpu-placement.io/cuda": "11.8"}, image="nvcr.io/nvidia/cuda:12.6.0-base-ubuntu22.04")
    assert _cuda_of(pod, ns) == ((11, 8), "pod annotation")
    # and it decides: an old driver that runs 11.8 takes the pod although the image says 12.6
    assert verdict(_labels("520.61.05"), pod, ns) == "pass"


# -- broken annotations ------------------------------------------------------------------------
BROKEN = [
    ("gpu-placement.io/cuda", "twelve"),
    ("gpu-placement.io/cuda-compat", "major"),
    ("gpu-placement.io/min-driver", "latest"),
    ("gpu-placement.io/min-compute-capability", "eight"),
    ("gpu-placement.io/gpu-products", " , "),
    ("gpu-placement.io/gpu-memory", "lots"),
    ("gpu-placement.io/sharing", "everything"),
]


def _cluster_filter(pod: dict[str, Any], ns: dict[str, Any] | None = None) -> tuple[list[str], dict[str, str]]:
    view = ClusterView(CONFIG)
    ingest = Ingest(CONFIG)
    if ns is not None:
        view.upsert_namespace(ingest.namespace(ns))
    nodes = {"ready": make_node("ready", "h100"), "down": make_node("down", "h100", ready=False),
             "cpu": make_node("cpu", None), "old": make_node("old", "t4-timeslicing")}
    for name, node in nodes.items():
        view.upsert_node(ingest.node(node))
        view.upsert_pod(ingest.pod(validator_pod(name)))
    result = Placement(view, CONFIG).filter(Placement(view, CONFIG).requirements(pod), list(nodes))
    assert not result.failed  # nothing preemption could fix
    return sorted(result.passed), result.unresolvable  # passed: in no particular order


@pytest.mark.parametrize(("key", "value"), BROKEN, ids=[key.split("/")[1] for key, _ in BROKEN])
def test_broken_pod_annotation_fails_every_node(key: str, value: str) -> None:
    passed, unresolvable = _cluster_filter(_pod({key: value}))
    assert passed == []
    assert sorted(unresolvable) == ["cpu", "down", "old", "ready"]
    for message in unresolvable.values():
        assert message.startswith("BadAnnotation: "), message
        assert f"{key}=\"{value}\"" in message and "pod ml/job" in message


@pytest.mark.parametrize(("key", "value"), [("gpu-placement.io/cuda", "12.x"), ("gpu-placement.io/gpu-memory", "-1Gi"),
                                            ("gpu-placement.io/gpu-products", ",")])
def test_broken_namespace_annotation_fails_every_node_and_names_the_namespace(key: str, value: str) -> None:
    passed, unresolvable = _cluster_filter(_pod(), namespace("ml", {key: value}))
    assert passed == [] and len(unresolvable) == 4
    for message in unresolvable.values():
        assert message.startswith("BadAnnotation: ") and f"{key}=\"{value}\"" in message
        assert "namespace ml" in message


def test_a_good_pod_in_the_same_cluster_passes() -> None:
    passed, unresolvable = _cluster_filter(_pod())
    assert passed == ["ready"]
    # The T4 time-slices without renaming (nvidia.com/gpu.replicas=8): no whole GPU for an exclusive pod.
    assert unresolvable["old"].startswith("SharingMismatch: ")
    assert _cluster_filter(_pod({"gpu-placement.io/sharing": "shared"}))[0] == ["old", "ready"]
    assert unresolvable["down"].startswith("NodeNotReady: ") and unresolvable["cpu"].startswith("NoGPU: ")
