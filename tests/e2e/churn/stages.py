"""KWOK Stages (kwok.x-k8s.io/v1alpha1) that play the kubelet of the simulated fleet (pure: manifests).

KWOK matches a Stage against the object alone (a pod's Stage cannot read its node), so what a GPU pod
meets on its node is written into the pod Stages themselves: each names the nodes it applies to in a
`.spec.nodeName` In/NotIn set, and the harness applies them again whenever a node's GPU state changes
(KWOK watches Stage objects with --enable-crds=Stage). A node is in exactly one state, so exactly one
GPU pod Stage matches a pod that waits to start. Statuses are shaped as a v1.37.2 kubelet writes them:

- start (node ok): phase Running, the container running and ready, `startTime`; then Succeeded after
  the pod's `churn.gpu-placement.io/runtime` annotation (its Job's run time).
- plugin (silent GPU loss): `Kubelet.rejectPod` (pkg/kubelet/kubelet.go): phase Failed, reason
  UnexpectedAdmissionError, message "Pod was rejected: Allocate failed due to <the device plugin's
  error>, which is unexpected" (pkg/kubelet/cm/admission/errors.go), `startTime` (the status manager).
- cuda (silent GPU loss): the container started and exited 1 within seconds, its log's last line (the
  pod has terminationMessagePolicy FallbackToLogsOnError) an NVML initialisation error; phase Failed.
- toolkit (kernel update, no driver): containerd's StartError, exit code 128, startedAt the zero time,
  the runc prestart hook's message with `nvidia-container-cli: initialization error: nvml error:
  driver not loaded`; phase Failed.
- down (kubelet down): no Stage: the pod waits, as on a node whose kubelet is down; the harness nudges
  it when the kubelet is back (an annotation: KWOK matches again on the pod's next event).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from tests.e2e.churn.schedule import CUDA, DOWN, OK, PLUGIN, TOOLKIT

__all__ = ["ANNOTATION_RUNTIME", "ANNOTATION_VALIDATION", "CUDA_MESSAGE", "GPU_STAGES", "KUBELET_ANNOTATION",
           "LABEL_WORKLOAD", "NUDGE_ANNOTATION", "PLUGIN_MESSAGE", "TOOLKIT_MESSAGE", "gpu_pod_stages",
           "static_stages"]

Obj = dict[str, Any]
PREFIX = "churn.gpu-placement.io"
LABEL_WORKLOAD = f"{PREFIX}/workload"  # = gpu on the Jobs' pod template
ANNOTATION_RUNTIME = f"{PREFIX}/runtime"  # "183.5s": how long a healthy pod runs
ANNOTATION_VALIDATION = f"{PREFIX}/validation"  # passing | failing, on each validator pod
KUBELET_ANNOTATION = f"{PREFIX}/kubelet"  # up | down, on each node
NUDGE_ANNOTATION = f"{PREFIX}/kubelet-sync"  # the harness's nudge when a kubelet comes back
NONE = "-"  # In/NotIn need at least one value: no node has this name

# The device plugin's Allocate error (k8s-device-plugin: a device ID the plugin no longer knows after the GPU fell
# off the bus) as the kubelet wraps it.
PLUGIN_MESSAGE = ('Pod was rejected: Allocate failed due to rpc error: code = Unknown desc = invalid allocation '
                  'request for "nvidia.com/gpu": unknown device: GPU-5d1c2e0a-77f3-4c1e-9a0b-3e2f6a1d8c44, '
                  'which is unexpected')
CUDA_MESSAGE = ("Traceback (most recent call last):\n  File \"/workspace/train.py\", line 14, in <module>\n"
                "    torch.cuda.init()\nRuntimeError: Failed to initialize NVML: Unknown Error\n")
TOOLKIT_MESSAGE = ("failed to create containerd task: failed to create shim task: OCI runtime create failed: "
                   "runc create failed: unable to start container process: error during container init: "
                   "error running prestart hook #0: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\n"
                   "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown")
GPU_STAGES = ("churn-gpu-pod-start", "churn-gpu-pod-plugin", "churn-gpu-pod-cuda", "churn-gpu-pod-toolkit")


def _stage(name: str, kind: str, expressions: list[Obj], template: str, delay_ms: int = 0, jitter_ms: int = 0,
           delay_from: str | None = None, labels: Mapping[str, str] | None = None, delete: bool = False) -> Obj:
    spec: Obj = {"resourceRef": {"apiGroup": "v1", "kind": kind},
                 "selector": {"matchExpressions": expressions, **({"matchLabels": dict(labels)} if labels else {})}}
    if delay_ms or jitter_ms or delay_from:
        delay: Obj = {"durationMilliseconds": delay_ms}
        if jitter_ms:
            delay["jitterDurationMilliseconds"] = delay_ms + jitter_ms
        if delay_from:
            delay["durationFrom"] = {"expressionFrom": delay_from}
        spec["delay"] = delay
    spec["next"] = {"delete": True} if delete else {"statusTemplate": template}
    return {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": "Stage", "metadata": {"name": name}, "spec": spec}


def _expr(key: str, operator: str, values: list[str] | None = None) -> Obj:
    return {"key": key, "operator": operator, **({"values": values} if values else {})}


LIVE = _expr(".metadata.deletionTimestamp", "DoesNotExist")
WAITING = [LIVE, _expr(".status.phase", "In", ["Pending"]), _expr(".status.startTime", "DoesNotExist")]
GPU = {LABEL_WORKLOAD: "gpu"}
NOW = '{{ $now := Now }}'
# conditions as the status manager writes them; `ready` is "True" or "False"
_CONDITIONS = """
conditions:
- {type: PodReadyToStartContainers, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Ready, status: "READY", lastTransitionTime: {{ $now | Quote }}REASON}
- {type: ContainersReady, status: "READY", lastTransitionTime: {{ $now | Quote }}REASON}
"""


def _conditions(ready: bool, reason: str = "") -> str:
    extra = f", reason: {reason}" if reason else ""
    return _CONDITIONS.replace("READY", "True" if ready else "False").replace("REASON", extra)


def _containers(state: str) -> str:
    return ("containerStatuses:\n{{ range .spec.containers }}\n"
            "- name: {{ .name | Quote }}\n  image: {{ .image | Quote }}\n"
            "  imageID: {{ printf \"%s@sha256:0\" .image | Quote }}\n"
            "  containerID: {{ printf \"containerd://%s\" ( sha256sum ( printf \"%s/%s\" $.metadata.uid .name ) ) "
            "| Quote }}\n" + state + "{{ end }}\n")


_START = NOW + _conditions(True) + _containers(
    "  ready: true\n  started: true\n  restartCount: 0\n  state:\n    running:\n      startedAt: {{ $now | Quote }}\n"
) + "phase: Running\nstartTime: {{ $now | Quote }}\n"
_COMPLETE = NOW + _conditions(False, "PodCompleted") + (
    "containerStatuses:\n{{ range .status.containerStatuses }}\n"
    "- name: {{ .name | Quote }}\n  image: {{ .image | Quote }}\n"
    "  imageID: {{ .imageID | Quote }}\n  containerID: {{ .containerID | Quote }}\n  ready: false\n  started: false\n"
    "  restartCount: 0\n  state:\n    terminated:\n      exitCode: 0\n      reason: Completed\n"
    "      startedAt: {{ .state.running.startedAt | Quote }}\n      finishedAt: {{ $now | Quote }}\n{{ end }}\n"
    "phase: Succeeded\n")
_PLUGIN = NOW + "\nphase: Failed\nreason: UnexpectedAdmissionError\nmessage: " + json.dumps(PLUGIN_MESSAGE) \
    + "\nstartTime: {{ $now | Quote }}\n"
_CUDA = NOW + '{{ $began := dateInZone "2006-01-02T15:04:05Z" (dateModify "-3s" now) "UTC" }}\n' + _conditions(
    False, "PodFailed") + _containers(
    "  ready: false\n  started: false\n  restartCount: 0\n  state:\n    terminated:\n      exitCode: 1\n"
    "      reason: Error\n      message: " + json.dumps(CUDA_MESSAGE) + "\n      startedAt: {{ $began | Quote }}\n"
    "      finishedAt: {{ $now | Quote }}\n") + "phase: Failed\nstartTime: {{ $began | Quote }}\n"
_TOOLKIT = NOW + _conditions(False, "PodFailed") + _containers(
    "  ready: false\n  started: false\n  restartCount: 0\n  state:\n    terminated:\n      exitCode: 128\n"
    "      reason: StartError\n      message: " + json.dumps(TOOLKIT_MESSAGE) + "\n"
    '      startedAt: "1970-01-01T00:00:00Z"\n      finishedAt: {{ $now | Quote }}\n') \
    + "phase: Failed\nstartTime: {{ $now | Quote }}\n"


def gpu_pod_stages(states: Mapping[str, str]) -> list[Obj]:
    """The four GPU pod Stages for the nodes' GPU states (node -> one of schedule.GPU_STATES; absent: ok).
    Exactly one matches a GPU pod bound to a node in any state but `down`, none on a `down` node."""
    by: dict[str, list[str]] = {state: [] for state in (PLUGIN, CUDA, TOOLKIT, DOWN)}
    for node, state in states.items():
        if state != OK:
            by[state].append(node)
    broken = sorted(n for nodes in by.values() for n in nodes) or [NONE]

    def on(state: str) -> list[Obj]:
        return [*WAITING, _expr(".spec.nodeName", "In", sorted(by[state]) or [NONE])]

    return [
        _stage("churn-gpu-pod-start", "Pod", [*WAITING, _expr(".spec.nodeName", "NotIn", broken)], _START,
               1000, 2000, labels=GPU),
        _stage("churn-gpu-pod-plugin", "Pod", on(PLUGIN), _PLUGIN, 300, 700, labels=GPU),
        _stage("churn-gpu-pod-cuda", "Pod", on(CUDA), _CUDA, 3000, 2000, labels=GPU),
        _stage("churn-gpu-pod-toolkit", "Pod", on(TOOLKIT), _TOOLKIT, 1000, 2000, labels=GPU),
    ]


_NODE_READY = """{{ $now := Now }}
conditions:
{{ range NodeConditions }}
- type: {{ .type | Quote }}
  status: {{ .status | Quote }}
  reason: {{ .reason | Quote }}
  message: {{ .message | Quote }}
  lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
{{ end }}
"""
_NODE_DOWN = """{{ $now := Now }}
conditions:
- type: Ready
  status: "False"
  reason: KubeletNotReady
  message: "container runtime is down, PLEG is not healthy: pleg was last seen active 3m0.1s ago; threshold is 3m0s"
  lastHeartbeatTime: {{ $now | Quote }}
  lastTransitionTime: {{ $now | Quote }}
"""
_VALIDATOR_READY = NOW + """
phase: Running
conditions:
- {type: PodReadyToStartContainers, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Initialized, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: Ready, status: "True", lastTransitionTime: {{ $now | Quote }}}
- {type: ContainersReady, status: "True", lastTransitionTime: {{ $now | Quote }}}
initContainerStatuses:
{{ range .spec.initContainers }}
- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, restartCount: 0,
   state: {terminated: {exitCode: 0, reason: Completed, startedAt: {{ $now | Quote }}, finishedAt: {{ $now | Quote }}}}}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: true, started: true, restartCount: 0,
   state: {running: {startedAt: {{ $now | Quote }}}}}
{{ end }}
startTime: {{ or .status.startTime $now | Quote }}
"""
# After a kernel update the validator's driver-validation init container waits for a driver that never loads.
_VALIDATOR_FAILING = NOW + """
phase: Running
conditions:
- {type: Initialized, status: "False", reason: ContainersNotInitialized, lastTransitionTime: {{ $now | Quote }}}
- {type: Ready, status: "False", reason: ContainersNotReady, lastTransitionTime: {{ $now | Quote }}}
- {type: ContainersReady, status: "False", reason: ContainersNotReady, lastTransitionTime: {{ $now | Quote }}}
initContainerStatuses:
{{ range .spec.initContainers }}
- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: false, restartCount: 1,
   state: {running: {startedAt: {{ $now | Quote }}}}}
{{ end }}
containerStatuses:
{{ range .spec.containers }}
- {name: {{ .name | Quote }}, image: {{ .image | Quote }}, ready: false, started: false, restartCount: 0,
   state: {waiting: {reason: PodInitializing}}}
{{ end }}
startTime: {{ or .status.startTime $now | Quote }}
"""
# A pod being deleted: its containers stopped (SIGTERM, exit 143), then the pod removed once terminal.
_TERMINATED = NOW + _conditions(False, "PodFailed") + (
    "containerStatuses:\n{{ range .status.containerStatuses }}\n"
    "- name: {{ .name | Quote }}\n  image: {{ .image | Quote }}\n"
    "  imageID: {{ .imageID | Quote }}\n  containerID: {{ .containerID | Quote }}\n  ready: false\n  started: false\n"
    "  restartCount: 0\n  state:\n    terminated:\n      exitCode: 143\n      reason: Error\n"
    "      startedAt: {{ .state.running.startedAt | Quote }}\n      finishedAt: {{ $now | Quote }}\n{{ end }}\n"
    "phase: Failed\n")


def static_stages() -> list[Obj]:
    """The Stages that read their state from the object itself: nodes (annotation
    churn.gpu-placement.io/kubelet), validators (churn.gpu-placement.io/validation), completion,
    deletion."""
    validator = {"app": "nvidia-operator-validator"}
    ready = ".status.conditions.[] | select( .type == \"Ready\" ) | .status"
    kubelet = f'.metadata.annotations["{KUBELET_ANNOTATION}"]'
    return [
        _stage("churn-node-ready", "Node", [_expr(ready, "NotIn", ["True"]),
                                            _expr(kubelet, "NotIn", ["down"])],
               _NODE_READY, 200, 300),
        _stage("churn-node-kubelet-down", "Node", [_expr(ready, "In", ["True"]),
                                                   _expr(kubelet, "In", ["down"])],
               _NODE_DOWN, 200, 300),
        _stage("churn-validator-ready", "Pod", [LIVE, _expr(ready, "NotIn", ["True"]), _expr(
            f'.metadata.annotations["{ANNOTATION_VALIDATION}"]', "NotIn", ["failing"])], _VALIDATOR_READY, 1000, 2000,
               labels=validator),
        _stage("churn-validator-failing", "Pod", [LIVE, _expr(
            ".status.conditions.[] | select( .type == \"Initialized\" ) | .status", "NotIn", ["False"]), _expr(
            f'.metadata.annotations["{ANNOTATION_VALIDATION}"]', "In", ["failing"])], _VALIDATOR_FAILING, 500, 1000,
               labels=validator),
        _stage("churn-gpu-pod-complete", "Pod", [
            LIVE, _expr(".status.phase", "In", ["Running"]),
            _expr(".status.containerStatuses.[].state.running.startedAt", "Exists")],
               _COMPLETE, delay_from=f'.metadata.annotations["{ANNOTATION_RUNTIME}"]', labels=GPU),
        _stage("churn-pod-terminate", "Pod", [_expr(".metadata.deletionTimestamp", "Exists"),
                                              _expr(".status.phase", "In", ["Running"])], _TERMINATED, 200, 300),
        _stage("churn-pod-delete", "Pod", [_expr(".metadata.deletionTimestamp", "Exists"),
                                           _expr(".status.phase", "NotIn", ["Running"])], "", 100, 200, delete=True),
    ]
