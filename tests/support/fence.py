"""Launch-fence helpers shared by its tests (tests/test_launch_fence*.py): GPU pods as the kubelet reports
their launches, nodes with a boot ID and the fence annotation, a validator turning Ready at a given time."""

from __future__ import annotations

from typing import Any

from gpu_placement.base.timestamps import format_time
from gpu_placement.samples.cluster import make_node, make_pod, validator_pod

__all__ = ["ADMISSION", "GPU", "MIG", "NODES", "NOW", "bound", "cuda_failed", "failed", "gpu_pod", "image_pull",
           "node", "ready_validator", "sentence", "started"]

NOW = 1_800_000_000.0
GPU = "nvidia.com/gpu"
MIG = "nvidia.com/mig-1g.10gb"
NODES = ["gpu-1", "gpu-2"]
ADMISSION = ("Pod was rejected: Allocate failed due to requested number of devices unavailable for nvidia.com/gpu. "
             "Requested: 1, Available: 0, which is unexpected")


def sentence(count: int, since: float, probe: float, cause: str = "device_plugin") -> str:
    what = {"device_plugin": "the kubelet's device manager could not allocate the GPUs, UnexpectedAdmissionError",
            "cuda_init": "CUDA or NVML failed to initialise in the container"}[cause]
    return (f"LaunchFailures: {count} nvidia.com/gpu pods in a row failed to start on the node for the node's "
            f"reasons ({cause}: {what}) since {format_time(since)}; lifts when the GPU Operator revalidates the node, "
            "its device plugin or driver restarts, the node reboots, or a probe pod starts (one goes through from "
            f"{format_time(probe)})")


def node(name: str, boot: str = "boot-1", note: str | None = None) -> dict[str, Any]:
    obj = make_node(name, "h100x8", created=NOW - 86400)
    obj["status"]["nodeInfo"] = {"bootID": boot}
    if note is not None:
        obj["metadata"]["annotations"] = {"gpu-placement.io/launch-fence": note}
    return obj


def gpu_pod(name: str, where: str, at: float, status: dict[str, Any], resource: str = GPU) -> dict[str, Any]:
    pod = make_pod("team", name, gpus={resource: 1}, node=where)
    pod["status"] = {"startTime": format_time(at), **status}
    return pod


def failed(name: str, at: float, where: str = "gpu-1", resource: str = GPU) -> dict[str, Any]:
    """Refused by the kubelet's admission: the device plugin could not allocate (Kubelet.rejectPod)."""
    return gpu_pod(name, where, at, {"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": ADMISSION},
                   resource)


def cuda_failed(name: str, at: float, where: str = "gpu-1") -> dict[str, Any]:
    started, finished = format_time(at + 1), format_time(at + 3)
    return gpu_pod(name, where, at, {"phase": "Failed", "containerStatuses": [
        {"name": "main", "state": {"terminated": {"exitCode": 1, "startedAt": started, "finishedAt": finished,
                                                  "message": "Failed to initialize NVML: Unknown Error"}}}]})


def started(name: str, at: float, where: str = "gpu-1", resource: str = GPU) -> dict[str, Any]:
    return gpu_pod(name, where, at, {"phase": "Running", "containerStatuses": [
        {"name": "main", "ready": True, "state": {"running": {"startedAt": format_time(at + 2)}}}]}, resource)


def image_pull(name: str, at: float, where: str = "gpu-1") -> dict[str, Any]:
    return gpu_pod(name, where, at, {"phase": "Pending", "containerStatuses": [
        {"name": "main", "state": {"waiting": {"reason": "ImagePullBackOff", "message": "Back-off pulling image"}}}]})


def bound(name: str, at: float, where: str = "gpu-1") -> dict[str, Any]:
    """Bound, the kubelet took it, no container status yet: its launch is not decided."""
    return gpu_pod(name, where, at, {"phase": "Pending"})


def ready_validator(where: str, since: float) -> dict[str, Any]:
    pod = validator_pod(where)
    pod["metadata"]["name"] += "-2"
    pod["metadata"]["uid"] += "-2"
    pod["status"]["conditions"] = [{"type": "Ready", "status": "True", "lastTransitionTime": format_time(since)}]
    return pod
