"""How a GPU pod's launch went, read from its status as the kubelet and the container runtime write it.

A bound GPU pod either starts (every app container Running, or the pod Succeeded) or fails to start.
The cause is read where Kubernetes puts it (Kubernetes v1.37.2):

- kubelet admission (`pkg/kubelet/lifecycle/predicate.go`, `Kubelet.rejectPod`): phase `Failed`,
  `status.reason` `UnexpectedAdmissionError` (the device manager's Allocate failed: "Update plugin
  resources failed ...") or `OutOf<resource>`; for a GPU resource both are the device plugin's
  (`device_plugin`), any other reason (`OutOfcpu`, `NodeAffinity`, `Evicted`, ...) the kubelet's
  (`kubelet_rejected`). The status manager sets `status.startTime` on that status too
  (`pkg/kubelet/status/status_manager.go`, updateStatusInternal).
- container create and start (`pkg/kubelet/kuberuntime/kuberuntime_container.go`, startContainer):
  waiting reason `CreateContainerError` or `RunContainerError` with the runtime's message; containerd
  also keeps the failed start as `lastState.terminated` reason `StartError` (exit code 128, startedAt
  1970-01-01), docker as `ContainerCannotRun`. A message from the NVIDIA container toolkit
  (`nvidia-container-cli: initialization error: nvml error: driver not loaded`, the runtime hook, or a
  CDI device it cannot resolve) is `container_toolkit`; any other is `container_runtime`.
- a container that ran less than `START_WINDOW` seconds and exited non-zero: `cuda_init` when its
  termination message holds a CUDA or NVML initialisation error (`Failed to initialize NVML`,
  `CUDA_ERROR_NO_DEVICE`, `no CUDA-capable device is detected`, ...), else `exit_code` (the pod's own).
  The message is what the container wrote to its terminationMessagePath, or with
  `terminationMessagePolicy: FallbackToLogsOnError` the tail of its log.
- a device the pod was given reported unhealthy (`device_unhealthy`): an entry of
  `status.containerStatuses[].allocatedResourcesStatus` with `health: Unhealthy` (KEP-4680,
  ResourceHealthStatus beta and on since 1.36: the kubelet writes it from the DRA driver's or the device
  plugin's health stream, pkg/kubelet/cm/dra/manager.go `UpdateAllocatedResourcesStatus`). It comes
  first: whatever else failed, the device did.
- not the node's: `image_pull` (`ErrImagePull`, `ImagePullBackOff`, `InvalidImageName`,
  `ErrImageNeverPull`: `pkg/kubelet/images/types.go`), `pod_config` (`CreateContainerConfigError`: a
  missing ConfigMap or Secret), `exit_code`.

Node-side failure evidence wins over a pod that runs now (a retry that worked does not make a CUDA
initialisation failure go away); pod-side evidence only counts while the pod is not up.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_placement.base import names as n
from gpu_placement.base.timestamps import parse_time

__all__ = [
    "CAUSES",
    "DEVICE_UNHEALTHY",
    "FAILED",
    "NODE_CAUSES",
    "NOT_STARTED",
    "PENDING",
    "STARTED",
    "START_WINDOW",
    "Launch",
    "classify",
    "launch_of",
    "unhealthy",
]

STARTED, FAILED, PENDING = "started", "failed", "pending"
NONE = "none"  # the cause label of a pod that started
DEVICE_UNHEALTHY = "device_unhealthy"
DEVICE_PLUGIN = "device_plugin"
KUBELET_REJECTED = "kubelet_rejected"
CONTAINER_TOOLKIT = "container_toolkit"
CUDA_INIT = "cuda_init"
CONTAINER_RUNTIME = "container_runtime"
IMAGE_PULL = "image_pull"
POD_CONFIG = "pod_config"
EXIT_CODE = "exit_code"
NOT_STARTED = "not_started"  # bound, no verdict in its status within the horizon (gpu_placement/outcomes/record.py)
# Failed causes, the node's first: when a pod shows several, the first in this order is its cause.
NODE_CAUSES = (DEVICE_UNHEALTHY, DEVICE_PLUGIN, CONTAINER_TOOLKIT, CUDA_INIT, CONTAINER_RUNTIME, KUBELET_REJECTED)
POD_CAUSES = (IMAGE_PULL, POD_CONFIG, EXIT_CODE)
CAUSES = (*NODE_CAUSES, *POD_CAUSES, NOT_STARTED)
START_WINDOW = 60.0  # seconds: a container that exits sooner than this after starting failed to start

_IMAGE = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "ImageInspectError"})
_CREATE = frozenset({"CreateContainerError", "RunContainerError", "PreCreateHookError", "PreStartHookError",
                     "StartError", "ContainerCannotRun"})
_ADMISSION = "UnexpectedAdmissionError"
_OUT_OF = "OutOf"  # lifecycle.InsufficientResourcePrefix
_EPOCH = 86400.0  # a startedAt before this is containerd's zero time: the process never started
_TOOLKIT = re.compile(r"nvidia-container-(cli|runtime|toolkit|runtime-hook)|nvidia-ctk|libnvidia-container"
                      r"|unresolvable CDI devices|CDI device injection failed", re.IGNORECASE)
_CUDA = re.compile(
    r"Failed to initialize NVML|NVML_ERROR_|nvmlInit|NVIDIA-SMI has failed|couldn't communicate with the NVIDIA driver"
    r"|CUDA_ERROR_(NOT_INITIALIZED|NO_DEVICE|INVALID_DEVICE|SYSTEM_DRIVER_MISMATCH|COMPAT_NOT_SUPPORTED_ON_DEVICE"
    r"|SYSTEM_NOT_READY|UNKNOWN)|cudaError(InitializationError|NoDevice|InsufficientDriver|SystemDriverMismatch"
    r"|CompatNotSupportedOnDevice|SystemNotReady|DevicesUnavailable)|no CUDA-capable device is detected"
    r"|CUDA driver version is insufficient|CUDA driver initialization failed|failed call to cuInit"
    r"|CUDA error: (initialization error|unknown error|no CUDA-capable)|No CUDA GPUs are available"
    r"|Found no NVIDIA driver|forward compatibility was attempted on non supported HW"
    r"|unsupported display driver / cuda driver combination|CUDA initialization:", re.IGNORECASE)
_CODE = re.compile(r"\b\d+ ([A-Z][A-Za-z]+):")  # "0/18 nodes are available: 3 NotValidated: ..."
_INSUFFICIENT = re.compile(r"Insufficient (\S+?)[.,]")  # kube-scheduler's NodeResourcesFit


@dataclass(slots=True, frozen=True)
class Launch:
    """What the outcome tracker keeps of a GPU pod (one small record each, GPU pods only)."""

    created: float | None  # metadata.creationTimestamp
    bound: float | None  # PodScheduled True: its lastTransitionTime (the Binding)
    started: float | None  # status.startTime: the kubelet took the pod; never moves after
    state: str  # PENDING, STARTED or FAILED
    cause: str  # NONE, or one of CAUSES
    placed: bool  # admitted by gpu-placement's webhook and scheduled by its profile
    waiting: tuple[str, ...] = ()  # unbound: the reason codes of its PodScheduled=False message

    @property
    def anchor(self) -> float | None:
        """The launch's place in time, which no later change moves: when the kubelet took it, else
        when it was bound (a pod rejected or evicted before the kubelet's first status), else created."""
        return self.started or self.bound or self.created


def launch_of(obj: Mapping[str, Any], is_gpu_resource: Callable[[str], bool], scheduler: str | None) -> Launch:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    state, cause = classify(status, is_gpu_resource) if spec.get("nodeName") else (PENDING, NONE)
    scheduled = _condition(status, "PodScheduled")
    bound = parse_time(scheduled.get("lastTransitionTime")) if scheduled.get("status") == "True" else None
    waiting: tuple[str, ...] = ()
    if not spec.get("nodeName") and scheduled.get("status") == "False":
        waiting = _reasons(scheduled)
    placed = n.ANN_ADMITTED in (meta.get("annotations") or {}) and scheduler is not None \
        and spec.get("schedulerName") == scheduler
    return Launch(parse_time(meta.get("creationTimestamp")), bound if spec.get("nodeName") else None,
                  parse_time(status.get("startTime")), state, cause, placed, waiting)


def classify(status: Mapping[str, Any], is_gpu_resource: Callable[[str], bool] = lambda _: True
             ) -> tuple[str, str]:
    """(state, cause) of a bound pod's status: (STARTED, NONE), (FAILED, cause) or (PENDING, NONE)."""
    phase = status.get("phase")
    apps = [c for c in status.get("containerStatuses") or () if isinstance(c, dict)]
    inits = [c for c in status.get("initContainerStatuses") or () if isinstance(c, dict)]
    found = {cause for c in (*inits, *apps) if (cause := _container_failure(c))}
    if unhealthy(status):
        found.add(DEVICE_UNHEALTHY)
    node_side = next((cause for cause in NODE_CAUSES if cause in found), None)
    if phase == "Succeeded":
        return STARTED, NONE
    if phase == "Failed" and not any(_ran(c) for c in apps):
        reason = str(status.get("reason") or "")
        if reason == _ADMISSION or (reason.startswith(_OUT_OF) and is_gpu_resource(reason[len(_OUT_OF):])):
            return FAILED, DEVICE_PLUGIN
        return FAILED, node_side or (_first(found) if found else KUBELET_REJECTED)
    if node_side:
        return FAILED, node_side
    if apps and all(_up(c) for c in apps):
        return STARTED, NONE
    if found:
        return FAILED, _first(found)
    if phase == "Failed":  # it ran past the start window, then failed: a crash later is not a launch failure
        return STARTED, NONE
    return PENDING, NONE


def unhealthy(status: Mapping[str, Any]) -> tuple[tuple[str, str, str], ...]:
    """(resource name, resourceID, message) of every allocated resource the kubelet reports Unhealthy in
    the pod's container statuses (`allocatedResourcesStatus`: name `claim:<claim>[/<request>]` for DRA,
    the resource name for a device plugin's; resourceID a CDI device ID, or `<driver>/<pool>/<device>`)."""
    found: list[tuple[str, str, str]] = []
    for field in ("initContainerStatuses", "containerStatuses"):
        for container in status.get(field) or ():
            for entry in (container.get("allocatedResourcesStatus") or ()) if isinstance(container, Mapping) else ():
                if not isinstance(entry, Mapping):
                    continue
                for resource in entry.get("resources") or ():
                    if isinstance(resource, Mapping) and resource.get("health") == "Unhealthy":
                        found.append((str(entry.get("name") or ""), str(resource.get("resourceID") or ""),
                                      str(resource.get("message") or "")[:256]))
    return tuple(dict.fromkeys(found))


def _first(found: set[str]) -> str:
    return next(cause for cause in CAUSES if cause in found)


def _container_failure(container: Mapping[str, Any]) -> str | None:
    state = container.get("state") or {}
    waiting = state.get("waiting") or {}
    reason = str(waiting.get("reason") or "")
    if reason in _IMAGE:
        return IMAGE_PULL
    if reason == "CreateContainerConfigError":
        return POD_CONFIG
    if reason in _CREATE:
        return CONTAINER_TOOLKIT if _TOOLKIT.search(str(waiting.get("message") or "")) else CONTAINER_RUNTIME
    if reason == "PostStartHookError":  # the pod's own postStart hook
        return EXIT_CODE
    for terminated in ((state.get("terminated") or {}), ((container.get("lastState") or {}).get("terminated") or {})):
        failure = _terminated_failure(terminated)
        if failure:
            return failure
    return None


def _terminated_failure(terminated: Mapping[str, Any]) -> str | None:
    if not terminated:
        return None
    message = str(terminated.get("message") or "")
    started = parse_time(terminated.get("startedAt"))
    if terminated.get("reason") in _CREATE or (terminated.get("exitCode") == 128 and (started or 0) < _EPOCH):
        return CONTAINER_TOOLKIT if _TOOLKIT.search(message) else CONTAINER_RUNTIME
    code = terminated.get("exitCode")
    finished = parse_time(terminated.get("finishedAt"))
    if not code or started is None or finished is None or finished - started > START_WINDOW:
        return None  # it succeeded, or ran long enough to have started
    return CUDA_INIT if _CUDA.search(message) else EXIT_CODE


def _ran(container: Mapping[str, Any]) -> bool:
    """The container's process started at some point (running now, or terminated after a real start)."""
    state = container.get("state") or {}
    if state.get("running"):
        return True
    for terminated in ((state.get("terminated") or {}), ((container.get("lastState") or {}).get("terminated") or {})):
        started = parse_time(terminated.get("startedAt")) if terminated else None
        if started is not None and started >= _EPOCH:
            return True
    return False


def _up(container: Mapping[str, Any]) -> bool:
    """Running now, or finished without error, or ran past the start window before it stopped."""
    state = container.get("state") or {}
    if state.get("running"):
        return True
    terminated = state.get("terminated") or {}
    if not terminated:
        return False
    started, finished = parse_time(terminated.get("startedAt")), parse_time(terminated.get("finishedAt"))
    return terminated.get("exitCode") == 0 or (started is not None and finished is not None
                                                and started >= _EPOCH and finished - started > START_WINDOW)


def _condition(status: Mapping[str, Any], kind: str) -> Mapping[str, Any]:
    return next((c for c in status.get("conditions") or () if isinstance(c, dict) and c.get("type") == kind), {})


def _reasons(scheduled: Mapping[str, Any]) -> tuple[str, ...]:
    """The reason codes of a PodScheduled=False condition: kube-scheduler writes the extender's codes
    as `N Code: sentence` in its message; `SchedulingGated` is a gate (Kueue's quota, for one)."""
    if scheduled.get("reason") == "SchedulingGated":
        return ("SchedulingGated",)
    message = str(scheduled.get("message") or "")
    codes = list(dict.fromkeys(_CODE.findall(message)))
    codes += [f"Insufficient {r}" for r in dict.fromkeys(_INSUFFICIENT.findall(message))]
    if "didn't match Pod's node affinity/selector" in message:
        codes.append("NodeAffinity")
    return tuple(sys.intern(code) for code in codes)
