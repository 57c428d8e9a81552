"""A GPU pod's launch read from its status as the kubelet and the runtime write it (gpu_placement/facts/launch.py):
each status below has the shape Kubernetes v1.37.2 gives it (the source lines are in the module's docstring)."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_placement.base.config import Config
from gpu_placement.facts.launch import FAILED, PENDING, STARTED, classify, launch_of
from gpu_placement.view.ingest import Ingest

T0 = "2026-03-02T10:00:00Z"
T5 = "2026-03-02T10:00:05Z"
T10M = "2026-03-02T10:10:00Z"
TOOLKIT = ("failed to create containerd task: failed to create shim task: OCI runtime create failed: runc create "
           "failed: unable to start container process: error during container init: error running hook #0: error "
           "running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\nnvidia-container-cli: "
           "initialization error: nvml error: driver not loaded: unknown")
CDI = "CDI device injection failed: unresolvable CDI devices nvidia.com/gpu=GPU-3f1c"


def running(name: str = "app", started: str = T0, restarts: int = 0, last: dict[str, Any] | None = None
            ) -> dict[str, Any]:
    return {"name": name, "ready": True, "restartCount": restarts, "state": {"running": {"startedAt": started}},
            "lastState": {"terminated": last} if last else {}}


def waiting(reason: str, message: str = "", last: dict[str, Any] | None = None, restarts: int = 0) -> dict[str, Any]:
    return {"name": "app", "ready": False, "restartCount": restarts,
            "state": {"waiting": {"reason": reason, "message": message}},
            "lastState": {"terminated": last} if last else {}}


def terminated(code: int, started: str, finished: str, message: str = "", reason: str = "Error") -> dict[str, Any]:
    return {"exitCode": code, "reason": reason, "message": message, "startedAt": started, "finishedAt": finished}


START_ERROR = terminated(128, "1970-01-01T00:00:00Z", T5, TOOLKIT, "StartError")
CUDA = terminated(1, T0, T5, "RuntimeError: Found no NVIDIA driver on your system. Please check that you have an "
                             "NVIDIA GPU and installed a driver")
NVML = terminated(255, T0, T5, "Failed to initialize NVML: Unknown Error")
QUICK_EXIT = terminated(2, T0, T5, "python: can't open file '/app/train.py': [Errno 2] No such file or directory")
LONG_RUN = terminated(1, T0, T10M, "Failed to initialize NVML: Unknown Error")


@pytest.mark.parametrize(("status", "expected"), [
    # Every app container Running, or the pod Succeeded: it started.
    ({"phase": "Running", "containerStatuses": [running(), running("sidecar")]}, (STARTED, "none")),
    ({"phase": "Succeeded", "containerStatuses": [{"name": "app", "state": {"terminated": terminated(0, T0, T5)}}]},
     (STARTED, "none")),
    # One container still creating: not decided yet.
    ({"phase": "Pending", "containerStatuses": [running(), waiting("ContainerCreating")]}, (PENDING, "none")),
    ({"phase": "Pending"}, (PENDING, "none")),
    # Kubelet admission (Kubelet.rejectPod): the device plugin's Allocate, or too few GPUs on the node.
    ({"phase": "Failed", "reason": "UnexpectedAdmissionError", "message": "Pod was rejected: Allocate failed due to "
      "requested number of devices unavailable for nvidia.com/gpu. Requested: 1, Available: 0, which is unexpected"},
     (FAILED, "device_plugin")),
    ({"phase": "Failed", "reason": "OutOfnvidia.com/gpu", "message": "Pod was rejected: Node didn't have enough "
      "resource: nvidia.com/gpu, requested: 1, used: 8, capacity: 8"}, (FAILED, "device_plugin")),
    ({"phase": "Failed", "reason": "OutOfcpu"}, (FAILED, "kubelet_rejected")),
    ({"phase": "Failed", "reason": "Evicted", "containerStatuses": [waiting("ContainerCreating")]},
     (FAILED, "kubelet_rejected")),
    # The NVIDIA container toolkit, legacy hook (containerd's StartError) or CDI.
    ({"phase": "Running", "containerStatuses": [waiting("CrashLoopBackOff", "back-off 10s", START_ERROR, 1)]},
     (FAILED, "container_toolkit")),
    ({"phase": "Pending", "containerStatuses": [waiting("RunContainerError", TOOLKIT)]}, (FAILED, "container_toolkit")),
    ({"phase": "Pending", "containerStatuses": [waiting("CreateContainerError", CDI)]}, (FAILED, "container_toolkit")),
    ({"phase": "Pending", "containerStatuses": [waiting("CreateContainerError", "context deadline exceeded")]},
     (FAILED, "container_runtime")),
    # CUDA or NVML initialisation failing within seconds of the start: node-side, even once a retry runs.
    ({"phase": "Running", "containerStatuses": [waiting("CrashLoopBackOff", "", CUDA, 1)]}, (FAILED, "cuda_init")),
    ({"phase": "Failed", "containerStatuses": [{"name": "app", "state": {"terminated": NVML}}]}, (FAILED, "cuda_init")),
    ({"phase": "Running", "containerStatuses": [running(restarts=1, last=NVML)]}, (FAILED, "cuda_init")),
    # Not the node's: image pull, a missing Secret, the program's own quick exit.
    ({"phase": "Pending", "containerStatuses": [waiting("ImagePullBackOff", "Back-off pulling image")]},
     (FAILED, "image_pull")),
    ({"phase": "Pending", "containerStatuses": [waiting("CreateContainerConfigError", 'secret "hf-token" not found')]},
     (FAILED, "pod_config")),
    ({"phase": "Failed", "containerStatuses": [{"name": "app", "state": {"terminated": QUICK_EXIT}}]},
     (FAILED, "exit_code")),
    # A pod-side failure that a retry got past: it runs now, so it started.
    ({"phase": "Running", "containerStatuses": [running(restarts=1, last=QUICK_EXIT)]}, (STARTED, "none")),
    # An init container's image: the pod never got to its app containers.
    ({"phase": "Pending", "initContainerStatuses": [waiting("ErrImagePull")],
      "containerStatuses": [waiting("PodInitializing")]}, (FAILED, "image_pull")),
    # It ran for ten minutes before failing: the launch worked; what came after is not a launch failure.
    ({"phase": "Failed", "containerStatuses": [{"name": "app", "state": {"terminated": LONG_RUN}}]},
     (STARTED, "none")),
])
def test_status_to_outcome(status: dict[str, Any], expected: tuple[str, str]) -> None:
    assert classify(status, lambda resource: resource.startswith("nvidia.com/")) == expected


def pod(**spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p", "namespace": "ml", "uid": "u1", "creationTimestamp": "2026-03-02T09:58:00Z",
                         "annotations": {"gpu-placement.io/admitted": "v1"}},
            "spec": {"schedulerName": "gpu-placement", "nodeName": "gpu-1",
                     "containers": [{"name": "app", "resources": {"limits": {"nvidia.com/gpu": 1}}}], **spec},
            "status": {"phase": "Running", "startTime": T0,
                       "conditions": [{"type": "PodScheduled", "status": "True",
                                       "lastTransitionTime": "2026-03-02T09:59:00Z"}],
                       "containerStatuses": [running()]}}


def test_the_launch_record_anchors_at_the_kubelets_start_time_and_says_who_placed_it() -> None:
    gpu = lambda resource: resource == "nvidia.com/gpu"  # noqa: E731
    launch = launch_of(pod(), gpu, "gpu-placement")
    assert (launch.state, launch.cause, launch.placed) == (STARTED, "none", True)
    assert launch.anchor == launch.started == 1772445600.0 and launch.bound == 1772445540.0
    assert not launch_of(pod(schedulerName="default-scheduler"), gpu, "gpu-placement").placed
    unbound = pod(nodeName=None)
    unbound["status"] = {"phase": "Pending", "conditions": [{
        "type": "PodScheduled", "status": "False", "reason": "Unschedulable",
        "message": "0/18 nodes are available: 1 InsufficientGPU: the pod asks 4 nvidia.com/gpu; 3 NotValidated: the "
                   "nvidia-operator-validator pod on the node is not Ready, 14 node(s) didn't match Pod's node "
                   "affinity/selector. preemption: 0/18 nodes are available: 18 Preemption is not helpful."}]}
    launch = launch_of(unbound, gpu, "gpu-placement")
    assert (launch.state, launch.bound, launch.anchor) == (PENDING, None, launch.created)
    assert launch.waiting == ("InsufficientGPU", "NotValidated", "NodeAffinity")


def test_only_gpu_pods_carry_a_launch_record() -> None:
    ingest = Ingest(Config())
    assert ingest.pod(pod()).launch is not None
    plain = pod(containers=[{"name": "web"}])
    assert ingest.pod(plain).launch is None
