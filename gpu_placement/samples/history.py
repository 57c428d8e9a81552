"""A day of a GPU cluster's life as the API server stores it: node and pod objects changing, each
change stamped with the time it happened, for `demo` and the outcome tests.

Nodes join and are prepared, one never gets verified, a validator fails and is replaced, a node
goes NotReady and comes back; GPU pods are created, wait, are bound, and start or fail to start the
ways the kubelet and the runtime report (gpu_placement/facts/launch.py). The object timestamps are what
the outcome figures are computed from; `Truth` holds the figures they should come to, worked out
here from the story, independently of the code that counts them.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpu_placement.base.names import ANN_ADMITTED
from gpu_placement.base.timestamps import format_time
from gpu_placement.facts.launch import (
    CONTAINER_TOOLKIT,
    CUDA_INIT,
    DEVICE_PLUGIN,
    EXIT_CODE,
    FAILED,
    IMAGE_PULL,
    NONE,
    NOT_STARTED,
    STARTED,
)
from gpu_placement.samples.cluster import make_node, make_pod, namespace, validator_pod

__all__ = ["CONFIG", "Change", "Story", "Truth", "day"]

Obj = dict[str, Any]
H, M = 3600.0, 60.0
CONFIG: dict[str, Any] = {"pools": {"training": {"nodeSelector": {"pool": "training"}},
                                    "batch": {"nodeSelector": {"pool": "batch"}}}}
H100, A100 = "NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB"
_A100 = {"nvidia.com/gpu.product": A100, "nvidia.com/gpu.memory": "81920"}
_TOOLKIT_MESSAGE = ("failed to create containerd task: failed to create shim task: OCI runtime create failed: runc "
                    "create failed: unable to start container process: error during container init: error running "
                    "hook #0: error running hook: exit status 1, stdout: , stderr: Auto-detected mode as 'legacy'\n"
                    "nvidia-container-cli: initialization error: nvml error: driver not loaded: unknown")
_CUDA_MESSAGE = "RuntimeError: CUDA error: no CUDA-capable device is detected"


@dataclass(slots=True, frozen=True)
class Change:
    """One write to the API server at `at`: the object as stored, or as it was when `deleted`."""

    at: float
    obj: Obj
    deleted: bool = False

    @property
    def kind(self) -> str:
        return str(self.obj.get("kind"))

    @property
    def key(self) -> tuple[str, str | None, str]:
        meta = self.obj.get("metadata") or {}
        return self.kind, meta.get("namespace"), str(meta.get("name"))


@dataclass
class Truth:
    """What the outcome metrics must show for the story, worked out from it."""

    starts: Counter[tuple[str, str, str, str]] = field(default_factory=Counter)  # (outcome, cause, pool, placed)
    ready: list[tuple[str, str, float]] = field(default_factory=list)  # (pool, product, seconds)
    recovery: list[tuple[str, str, str, float]] = field(default_factory=list)  # (pool, product, reason, seconds)
    exclusion: list[tuple[str, str, str, float]] = field(default_factory=list)
    waits: list[tuple[str, str, float]] = field(default_factory=list)  # (reason, pool, seconds)
    preparing: dict[str, float] = field(default_factory=dict)  # node never verified -> created


class Story:
    """A story told as the API server stores it: each write with its time, and the figures it comes to."""

    def __init__(self, start: float) -> None:
        self.start = start
        self.changes: list[Change] = []
        self.last: dict[tuple[str, str | None, str], Obj] = {}
        self.truth = Truth()
        self.pools: dict[str, tuple[str, str]] = {}  # node -> (pool, product)

    def put(self, at: float, obj: Obj) -> Obj:
        change = Change(self.start + at, copy.deepcopy(obj))
        self.changes.append(change)
        self.last[change.key] = change.obj
        return obj

    def drop(self, at: float, kind: str, namespace_: str | None, name: str) -> None:
        self.changes.append(Change(self.start + at, self.last[(kind, namespace_, name)], deleted=True))

    # -- nodes -----------------------------------------------------------------------------------
    def node(self, name: str, pool: str, product: str, created: float, ready_at: float | None = None) -> Obj:
        labels = {"pool": pool, **(_A100 if product == A100 else {})}
        node = make_node(name, "h100x8", labels=labels, created=self.start + created)
        self._ready(node, True, ready_at if ready_at is not None else created + 60)
        self.pools[name] = (pool, product)
        return node

    def _ready(self, node: Obj, ready: bool, at: float) -> Obj:
        condition = node["status"]["conditions"][0]
        condition.update({"status": "True" if ready else "False", "lastTransitionTime": format_time(self.start + at),
                          "reason": "KubeletReady" if ready else "NodeStatusUnknown",
                          "message": "kubelet is posting ready status" if ready else
                          "Kubelet stopped posting node status."})
        return node

    def validator(self, node: str, created: float, ready_at: float | None, suffix: str = "") -> Obj:
        pod = validator_pod(node, ready_at is not None)
        meta = pod["metadata"]
        meta["name"] += suffix
        meta["uid"] += suffix
        meta["creationTimestamp"] = format_time(self.start + created)
        pod["status"]["startTime"] = format_time(self.start + created + 2)
        pod["status"]["conditions"] = [{"type": "Ready", "status": "True" if ready_at is not None else "False",
                                        "lastTransitionTime": format_time(self.start + (ready_at or created + 2))}]
        return pod

    def unready(self, pod: Obj, at: float) -> Obj:
        pod = copy.deepcopy(pod)
        pod["status"]["phase"] = "Running"
        pod["status"]["conditions"] = [{"type": "Ready", "status": "False",
                                        "lastTransitionTime": format_time(self.start + at)}]
        return pod

    # -- GPU pods ----------------------------------------------------------------------------------
    def pod(self, index: int, created: float, placed: bool = True, gpus: int = 1) -> Obj:
        pod = make_pod("ml", f"job-{index:03d}", gpus={"nvidia.com/gpu": gpus}, uid=f"uid-job-{index:03d}",
                       annotations={ANN_ADMITTED: "v1"} if placed else {})
        pod["spec"]["schedulerName"] = "gpu-placement" if placed else "default-scheduler"
        pod["metadata"]["creationTimestamp"] = format_time(self.start + created)
        pod["status"] = {"phase": "Pending"}
        return pod

    def launch(self, index: int, created: float, node: str, *, wait: float = 3.0, codes: str = "",
               story: str = "start", placed: bool = True, gone_after: float | None = None, gpus: int = 1,
               taken_after: float = 2.0) -> None:
        """A GPU pod's life: created, maybe unschedulable for `wait` seconds, bound to `node`, taken by
        the kubelet `taken_after` seconds later (status.startTime), then `story`; the truth it adds."""
        pod = self.pod(index, created, placed, gpus)
        pool, _ = self.pools[node]
        self.put(created, pod)
        if codes:
            pod = copy.deepcopy(pod)
            pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                            "lastTransitionTime": format_time(self.start + created + 1),
                                            "message": f"0/9 nodes are available: {codes}. preemption: not helpful."}]
            self.put(created + 1, pod)
        bound = created + wait
        pod = copy.deepcopy(pod)
        pod["spec"]["nodeName"] = node
        pod["status"]["conditions"] = [{"type": "PodScheduled", "status": "True",
                                        "lastTransitionTime": format_time(self.start + bound)}]
        self.put(bound, pod)
        reason = codes.split(":", 1)[0].split(" ", 1)[1] if codes else "none"
        self.truth.waits.append((reason, pool, wait))
        taken = bound + taken_after
        pod = copy.deepcopy(pod)
        pod["status"].update({"startTime": format_time(self.start + taken), "containerStatuses": [
            _container({"waiting": {"reason": "ContainerCreating"}})]})
        self.put(taken, pod)
        outcome, cause = self._story(pod, story, taken)
        if outcome:
            self.truth.starts[(outcome, cause, pool, "true" if placed else "false")] += 1
        if gone_after is not None:
            self.drop(taken + gone_after, "Pod", "ml", f"job-{index:03d}")

    def _story(self, pod: Obj, story: str, taken: float) -> tuple[str, str]:
        t = self.start + taken
        status = copy.deepcopy(pod["status"])
        if story in ("start", "slow_start", "big_image"):  # the image is there, or takes 90 s or 20 min to pull
            pull = {"start": 25.0, "slow_start": 90.0, "big_image": 20 * M}[story]
            status.update({"phase": "Running", "containerStatuses": [_container({"running": {
                "startedAt": format_time(t + pull)}}, ready=True)]})
            self.put(taken + pull + 1, {**pod, "status": status})
            done = copy.deepcopy(status)  # the job ends 90 minutes later and frees its GPU
            done.update({"phase": "Succeeded", "containerStatuses": [_container({"terminated": {
                "exitCode": 0, "reason": "Completed", "startedAt": format_time(t + pull),
                "finishedAt": format_time(t + pull + 90 * M)}})]})
            self.put(taken + pull + 90 * M, {**pod, "status": done})
            return STARTED, NONE
        if story == "device_plugin":
            status = {"phase": "Failed", "reason": "UnexpectedAdmissionError", "startTime": status["startTime"],
                      "conditions": pod["status"]["conditions"],
                      "message": "Pod was rejected: Allocate failed due to rpc error: code = Unknown desc = device "
                                 "GPU-5c1f unhealthy, which is unexpected"}
            self.put(taken + 1, {**pod, "status": status})
            return FAILED, DEVICE_PLUGIN
        if story == "toolkit":
            status.update({"phase": "Pending", "containerStatuses": [_container(
                {"waiting": {"reason": "RunContainerError", "message": _TOOLKIT_MESSAGE}}, last={
                    "exitCode": 128, "reason": "StartError", "message": _TOOLKIT_MESSAGE,
                    "startedAt": "1970-01-01T00:00:00Z", "finishedAt": format_time(t + 30)}, restarts=1)]})
            self.put(taken + 31, {**pod, "status": status})
            return FAILED, CONTAINER_TOOLKIT
        if story == "cuda":
            status.update({"phase": "Running", "containerStatuses": [_container(
                {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off 10s restarting failed container"}},
                last={"exitCode": 1, "reason": "Error", "message": _CUDA_MESSAGE,
                      "startedAt": format_time(t + 20), "finishedAt": format_time(t + 24)}, restarts=1)]})
            self.put(taken + 25, {**pod, "status": status})
            return FAILED, CUDA_INIT
        if story in ("image", "image_then_start"):
            pulling = 'Back-off pulling image "registry.example.com/ml/train:9"'
            status.update({"containerStatuses": [_container({"waiting": {"reason": "ImagePullBackOff",
                                                                         "message": pulling}})]})
            self.put(taken + 30, {**pod, "status": status})
            if story == "image":
                return FAILED, IMAGE_PULL
            later = copy.deepcopy(status)  # the registry came back within the minute: it started after all
            later.update({"phase": "Running", "containerStatuses": [_container({"running": {
                "startedAt": format_time(t + 70)}}, ready=True)]})
            self.put(taken + 71, {**pod, "status": later})
            return STARTED, NONE
        if story == "exit":
            status.update({"phase": "Failed", "containerStatuses": [_container({"terminated": {
                "exitCode": 2, "reason": "Error", "message": "train.py: error: unrecognized arguments: --lr",
                "startedAt": format_time(t + 20), "finishedAt": format_time(t + 23)}})]})
            self.put(taken + 24, {**pod, "status": status})
            return FAILED, EXIT_CODE
        if story == "stuck":  # ContainerCreating for ever (a volume that never mounts): not_started at the horizon
            return FAILED, NOT_STARTED
        if story == "cancelled":  # deleted while still being created: no launch
            self.drop(taken + 40, "Pod", "ml", pod["metadata"]["name"])
            return "", ""
        raise ValueError(story)


def _container(state: Obj, ready: bool = False, last: Obj | None = None, restarts: int = 0) -> Obj:
    return {"name": "main", "ready": ready, "restartCount": restarts, "state": state,
            "lastState": {"terminated": last} if last else {}}


# (minute of the day, node, wait seconds, PodScheduled codes, story, placed, deleted after seconds, GPUs)
Plan = tuple[float, str, float, str, str, bool, float | None, int]


def _pods() -> list[Plan]:
    plan: list[Plan] = []
    nodes = ["train-1", "train-2", "batch-1", "train-3", "batch-2"]
    for index in range(96):  # one every 15 minutes, round the long-running nodes
        minute = 2 + index * 15
        if 600 <= minute < 606:  # the restart window of the tests stays quiet (gpu_placement.samples.history docs)
            continue
        node = nodes[index % len(nodes)]
        if (node == "train-3" and 480 <= minute < 525) or (node == "batch-2" and 720 <= minute < 840):
            node = "train-1"  # kept off while it is unusable, as the extender would
        plan.append((minute, node, 3.0, "", "start", index % 7 != 3, None, 1))
    unschedulable = ("4 InsufficientGPU: the pod needs 8 nvidia.com/gpu free and the node has fewer, 5 NotValidated: "
                     "the nvidia-operator-validator pod on the node is not Ready")
    plan += [(95, "train-1", 18 * M, unschedulable, "start", True, None, 8),  # a whole node, none free in one piece
             (110, "batch-1", 19 * M, unschedulable, "start", True, None, 8)]
    plan += [(*p, 1) for p in [
        (130, "batch-1", 12 * M, "9 NotValidated: the nvidia-operator-validator pod on the node is not Ready",
         "start", True, None),
        (185, "batch-1", 3.0, "", "toolkit", True, None),
        (188, "batch-1", 3.0, "", "toolkit", False, None),
        (475, "train-3", 3.0, "", "cuda", True, None),
        (478, "train-3", 3.0, "", "cuda", True, 5 * M),  # a DaemonSet-like controller deletes it: still counted
        (705, "batch-2", 3.0, "", "device_plugin", True, None),
        (708, "batch-2", 3.0, "", "device_plugin", True, 30.0),
        (711, "batch-2", 3.0, "", "device_plugin", False, None),
        (300, "train-2", 3.0, "", "image", True, None),
        (305, "train-2", 3.0, "", "image", True, None),
        (310, "train-2", 3.0, "", "image_then_start", True, None),
        (900, "train-1", 3.0, "", "exit", True, None),
        (960, "batch-1", 3.0, "", "exit", False, None),
        (1020, "batch-1", 3.0, "", "stuck", True, None),
        (1090, "train-2", 3.0, "", "cancelled", True, None),
        (597.45, "train-2", 3.0, "", "slow_start", True, None),  # starts at 09:59, in the quiet window
    ]]
    return plan


def day(start: float) -> tuple[list[Change], Truth]:
    """The day from `start` (Unix s), in the order the API server stores it, and its figures. Between
    minutes 598 and 606 (the tests restart a replica there) one job ends and one pod starts (09:59);
    nothing else changes."""
    story = Story(start)
    story.put(-2 * H, namespace("ml"))
    story.put(-2 * H, namespace("gpu-operator"))
    old = -30 * 86400.0
    for name, pool, product in (("train-1", "training", H100), ("train-2", "training", H100),
                                ("train-3", "training", H100), ("batch-1", "batch", A100),
                                ("batch-2", "batch", A100)):
        story.put(-2 * H, story.node(name, pool, product, old))
        story.put(-2 * H, story.validator(name, old + 120, old + 600))
    # Two nodes join and are prepared: 11 and 7 minutes from creation to the first verified verdict.
    for name, pool, product, at, took in (("train-4", "training", H100, 2 * H, 11 * M),
                                          ("batch-3", "batch", A100, 6 * H, 7 * M)):
        story.put(at, story.node(name, pool, product, at, ready_at=at + 60))
        validator = story.validator(name, at + 90, None)
        story.put(at + 90, validator)
        story.put(at + took, story.validator(name, at + 90, at + took))
        story.truth.ready.append((pool, product, took))
    # One joins at 22:00 and is never verified: the alert's node stuck in preparation.
    stuck = story.node("batch-4", "batch", A100, 22 * H, ready_at=22 * H + 60)
    story.put(22 * H, stuck)
    story.put(22 * H + 90, story.validator("batch-4", 22 * H + 90, None))
    story.truth.preparing["batch-4"] = start + 22 * H
    # train-3's validator turns unready at 08:00 (seen 20 s later), is replaced, Ready at 08:45.
    validator = story.validator("train-3", old + 120, old + 600)
    story.put(8 * H + 20, story.unready(validator, 8 * H))
    story.drop(8 * H + 30 * M, "Pod", "gpu-operator", validator["metadata"]["name"])
    story.put(8 * H + 30 * M, story.validator("train-3", 8 * H + 30 * M, None, "-2"))
    story.put(8 * H + 45 * M, story.validator("train-3", 8 * H + 30 * M, 8 * H + 45 * M, "-2"))
    story.truth.exclusion.append(("training", H100, "NotValidated", 20.0))
    story.truth.recovery.append(("training", H100, "NotValidated", 45 * M))
    # batch-2 goes NotReady at 12:00 (seen 45 s later) and is Ready again at 14:00 (seen 10 s later).
    story.put(12 * H + 45, story._ready(story.node("batch-2", "batch", A100, old), False, 12 * H))
    story.put(14 * H + 10, story._ready(story.node("batch-2", "batch", A100, old), True, 14 * H))
    story.truth.exclusion.append(("batch", A100, "NodeNotReady", 45.0))
    story.truth.recovery.append(("batch", A100, "NodeNotReady", 2 * H))
    for index, (minute, node, wait, codes, what, placed, gone, gpus) in enumerate(sorted(_pods())):
        story.launch(index, minute * M, node, wait=wait, codes=codes, story=what, placed=placed, gone_after=gone,
                     gpus=gpus)
    changes = sorted(story.changes, key=lambda c: c.at)  # stable: a step's own order is kept
    return changes, story.truth
