"""A node's driver rollout state, read from what the GPU Operator itself keeps in the cluster.

When did the node's driver change? Nothing in the Node says: the GPU Operator's upgrade controller
(NVIDIA/k8s-operator-libs, pkg/upgrade) moves `nvidia.com/gpu-driver-upgrade-state` through its
states to `upgrade-done` and removes every timing annotation it used on the way, and GPU Feature
Discovery's `nvidia.com/cuda.driver-version.*` labels carry no time. The driver's own pod does:
the driver DaemonSet (`updateStrategy: OnDelete`, pods labelled
`app.kubernetes.io/component=nvidia-driver`) gets a new pod on the node for every driver change,
the upgrade controller deleting the old one once the node is drained, and that pod's `Ready`
condition turns True when its startup probe finds the new driver loaded (assets/state-driver). So
the soak starts at the `lastTransitionTime` of the Ready condition of the node's driver pod: stored
in etcd, read again after any restart of this service, the same on every replica.

What counts as a change: the driver pod runs a version other than the one the node last ran
settled, which the rollout leader keeps on the Node (`gpu-placement.io/settled-driver`, written once the
node is past its soak or excused from it: `settled_version`). A driver pod of that same version is a
reinstall (an operator upgrade that rolls the DaemonSet for another reason, a ClusterPolicy edit,
`kubectl delete pod`): it does not soak. Every replica reads the annotation from the same Node, a
restart reads it again, and writing it changes no verdict (it is written only for a node already
settled on that version). A node without the annotation (gpu-placement just installed, or the
leader not yet past it) is judged by its driver pod alone, as a change.

What else does not count as a change: a driver container that restarted inside its pod (a node
reboot, a crash: the pod's `restartCount`) keeps the soak anchored at the pod's `startTime`, which does
not move; a new node's first driver pod (created within `NEW_NODE_SECONDS` of the Node) does not
soak when other nodes already run that version past their soak (an autoscaled node is not a
rollout), and does when none does (the first nodes of a new version). A node soaks only while its
labels show the version its driver pod runs (the image tag, `driver:550.54.15-ubuntu22.04`):
between the pod turning Ready and GFD relabelling the node, the node is still upgrading.

A soaking node fails, rather than ending its soak, when during the soak its driver container
restarts, its validator pod restarts (the validator's checks wait in a loop, so a restart is a
failed check: cmd/nvidia-validator), or DCGM reports an XID error on it (`xid_at`, from telemetry).
The restart counts stay on the pods, so a restart of this service finds the failure again.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_placement.base import names as n
from gpu_placement.base.config import Rollout
from gpu_placement.base.cuda import Version, VersionError, format_version, parse_version
from gpu_placement.base.timestamps import parse_time
from gpu_placement.facts.nodes import NodeFacts

__all__ = ["DONE", "FAILED", "NO_SOAK", "PENDING", "SOAKING", "STATES", "UPGRADING", "OperatorPod", "Soak",
           "first_driver", "node_soak", "operator_pod_from_json", "reinstalled", "settled_version"]

DONE, PENDING, UPGRADING, SOAKING, FAILED = "done", "pending", "upgrading", "soaking", "failed"
STATES = (DONE, PENDING, UPGRADING, SOAKING, FAILED)
# The upgrade controller's states between upgrade-required and upgrade-done (pkg/upgrade/consts.go).
IN_PROGRESS = frozenset({"cordon-required", "wait-for-jobs-required", "pod-deletion-required", "drain-required",
                         "node-maintenance-required", "post-maintenance-required", "pod-restart-required",
                         "validation-required", "uncordon-required"})
NEW_NODE_SECONDS = 1800.0  # a driver pod this close to its Node's creation is the node's first driver
DRIVER_CONTAINER = "nvidia-driver-ctr"  # the driver container of the operator's DaemonSet
_TAG_VERSION = re.compile(r":(\d+\.\d+(?:\.\d+)?)(?:-[^:@/]*)?$")  # driver:550.54.15-ubuntu22.04


@dataclass(slots=True, frozen=True)
class OperatorPod:
    """What the rollout reads of a GPU Operator pod (the driver's or the validator's)."""

    uid: str
    created: float | None  # metadata.creationTimestamp, Unix seconds
    started: float | None  # status.startTime: does not move when a container restarts
    ready_since: float | None  # lastTransitionTime of Ready when it is True, else None
    restarts: int  # restartCount over containers and init containers
    last_restart: float | None  # the latest lastState.terminated.finishedAt
    version: str | None  # the driver version in the driver container's image tag, when it has one
    ready_changed: float | None = None  # lastTransitionTime of Ready, True or not (outcomes.py: when it went unready)
    plugin: bool = False  # the device plugin's pod, not the driver's: read by the launch fence only (facts/fence.py)


def operator_pod_from_json(obj: Mapping[str, Any], plugin: bool = False) -> OperatorPod:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    ready_since = ready_changed = None
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready":
            ready_changed = parse_time(condition.get("lastTransitionTime"))
            ready_since = ready_changed if condition.get("status") == "True" else None
    restarts, last = 0, None
    for container in [*(status.get("initContainerStatuses") or ()), *(status.get("containerStatuses") or ())]:
        count = container.get("restartCount")
        restarts += count if isinstance(count, int) and count > 0 else 0
        finished = parse_time(((container.get("lastState") or {}).get("terminated") or {}).get("finishedAt"))
        if finished is not None and (last is None or finished > last):
            last = finished
    return OperatorPod(str(meta.get("uid") or ""), parse_time(meta.get("creationTimestamp")),
                       parse_time(status.get("startTime")), ready_since, restarts, last,
                       None if plugin else _image_version(spec), ready_changed, plugin)


def _image_version(spec: Mapping[str, Any]) -> str | None:
    containers = [c for c in spec.get("containers") or () if isinstance(c, dict)]
    driver = next((c for c in containers if c.get("name") == DRIVER_CONTAINER), containers[0] if containers else {})
    found = _TAG_VERSION.search(str(driver.get("image") or ""))  # a digest or a precompiled tag: None
    return found.group(1) if found else None


@dataclass(slots=True, frozen=True)
class Soak:
    """A node's place in a driver rollout. Only `state` (and the node's own driver version) may
    enter a reason; the times are for `gpu-placement rollout` and `explain`."""

    state: str
    version: str | None = None  # the node's driver, from its labels
    since: float | None = None  # the soak's start: the driver pod's Ready transition
    until: float | None = None  # when the state changes by the clock alone (the soak's end), else None
    why: str = ""  # upgrading or failed: what was seen; soaking: the driver it ran before, when recorded

    @property
    def avoided(self) -> bool:
        """Soaking or failed: the states placement treats differently."""
        return self.state in (SOAKING, FAILED)


NO_SOAK = Soak(DONE)


def node_soak(facts: NodeFacts, driver: OperatorPod | None, validator: OperatorPod | None, xid_at: float | None,
              established: bool, now: float, rollout: Rollout) -> Soak:
    """The node's rollout state at `now`. `driver`, `validator`: the node's newest such pods;
    `xid_at`: when telemetry first showed an XID on the node under this driver pod; `established`:
    another node runs this version past its soak."""
    version = format_version(facts.driver) if facts.driver is not None else None
    label = facts.upgrade_state
    if label == n.UPGRADE_FAILED:
        return Soak(FAILED, version, why=f"the GPU Operator marked the upgrade failed ({n.DRIVER_UPGRADE_STATE}="
                                         f"{label})")
    if label in IN_PROGRESS or facts.paused:
        return Soak(UPGRADING, version, why=f"{n.DRIVER_UPGRADE_STATE}={label}" if label in IN_PROGRESS
                    else str(facts.paused))
    settled = Soak(PENDING if label == n.UPGRADE_REQUIRED else DONE, version)
    if driver is None or rollout.soak_minutes <= 0:
        return settled  # drivers not installed by the operator: nothing to time
    start = driver.ready_since if driver.restarts == 0 else (driver.started or driver.ready_since)
    if start is None:
        return Soak(UPGRADING, version, why="the driver pod is not Ready yet (installing the driver)")
    same = reinstalled(facts, driver)
    if not same and established and first_driver(facts, driver):
        return Soak(settled.state, version, start)
    end = start + rollout.soak_minutes * 60
    failure = "" if same else _failure(driver, validator, xid_at, start, end)
    if failure:
        return Soak(FAILED, version, start, None, failure)
    if driver.ready_since is None:
        return Soak(UPGRADING, version, start, why="the driver pod is not Ready")
    if driver.version is not None and not _same(driver.version, facts):
        return Soak(UPGRADING, version, start, why=f"the driver pod runs {driver.version}; the node's labels still "
                                                   "show the old driver (GPU Feature Discovery relabels it)")
    if not same and now < end:
        before = f"new on the node: it ran {format_version(facts.settled_driver)} before" if facts.settled_driver \
            else ""
        return Soak(SOAKING, version, start, end, before)
    return Soak(settled.state, version, start)


def reinstalled(facts: NodeFacts, driver: OperatorPod) -> bool:
    """The driver pod runs the version the node last ran settled (`gpu-placement.io/settled-driver`): a
    reinstall of the same driver, not a change. The pod's image tag says its version; where it names
    none (a digest, a precompiled tag), the node's labels do."""
    if facts.settled_driver is None:
        return False
    try:
        running = parse_version(driver.version) if driver.version is not None else facts.driver
    except VersionError:
        running = facts.driver
    return running == facts.settled_driver


def settled_version(facts: NodeFacts, driver: OperatorPod | None, soak: Soak) -> Version | None:
    """What the rollout leader writes into the node's `gpu-placement.io/settled-driver`: the version it runs
    settled (done or pending: past its soak, excused from it, or a reinstall), with its driver pod Ready
    and its labels showing the version the pod runs; None when nothing is settled to record."""
    if driver is None or driver.ready_since is None or facts.driver is None or soak.state not in (DONE, PENDING):
        return None
    if driver.version is not None and not _same(driver.version, facts):
        return None
    return facts.driver


def first_driver(facts: NodeFacts, driver: OperatorPod) -> bool:
    """The node's first driver pod, made as the node joined: its driver did not change."""
    return facts.created is not None and driver.created is not None and \
        driver.created - facts.created < NEW_NODE_SECONDS


def _failure(driver: OperatorPod, validator: OperatorPod | None, xid_at: float | None, start: float,
             end: float) -> str:
    if driver.restarts and driver.last_restart is not None and start <= driver.last_restart < end:
        return "the driver container restarted during the soak"
    if validator is not None and validator.restarts and validator.last_restart is not None \
            and start <= validator.last_restart < end:
        return "the nvidia-operator-validator pod restarted during the soak (a validation failed)"
    if xid_at is not None and start <= xid_at < end:
        return "DCGM reported an XID error during the soak"
    return ""


def _same(image_version: str, facts: NodeFacts) -> bool:
    try:
        return facts.driver is not None and parse_version(image_version) == facts.driver
    except VersionError:
        return True  # a tag we cannot read says nothing against the labels
