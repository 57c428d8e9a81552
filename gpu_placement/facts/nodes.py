"""A node's GPU facts, parsed once per node change from what the GPU Operator publishes.

Sources: GPU Feature Discovery labels (current and deprecated names), `status.capacity` and
`allocatable`, the Ready condition and `spec.unschedulable`. A label with a junk value is kept as a
problem on that node only; it never raises.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpu_placement.base import names as n
from gpu_placement.base.cuda import Version, VersionError, driver_table, parse_version
from gpu_placement.base.quantity import QuantityError, cpu_to_milli, quantity_to_int
from gpu_placement.base.timestamps import parse_time

__all__ = ["MigProfile", "NodeFacts", "ValidatorState", "charge", "node_from_json"]

_BYTES_THRESHOLD = 10_000_000  # old GFD (v0.6.0/v0.6.1) wrote gpu.memory in bytes, current GFD in MiB
_MIB = 2**20


@dataclass(slots=True, frozen=True)
class MigProfile:
    count: int
    memory_mib: int | None


@dataclass(slots=True, frozen=True)
class NodeFacts:
    name: str
    ready: bool
    ready_message: str  # why not ready, for the reason sentence
    unschedulable: bool
    gpu_present: bool
    product: str | None
    count: int | None
    device_memory_mib: int | None
    replicas: int
    sharing: str
    mig_strategy: str | None
    mig: dict[str, MigProfile]
    driver: Version | None
    max_cuda: Version | None
    max_cuda_source: str  # which labels max_cuda came from, for `explain`
    compute: Version | None
    upgrade_state: str | None
    paused: str | None  # "nvidia.com/gpu.deploy.driver=paused-for-driver-upgrade"
    mig_config_state: str | None
    capacity: dict[str, int]
    allocatable: dict[str, int]
    problems: dict[str, str]  # label -> what is wrong with its value
    pool: str | None = None  # the first configured pool whose nodeSelector the node's labels match
    dra_devices: int = 0  # devices the DRA driver publishes for the node (its ResourceSlices), see gpu_placement.dra
    created: float | None = None  # metadata.creationTimestamp (Unix s): tells a new node's first driver from a change
    ready_since: float | None = None  # Ready condition lastTransitionTime: when `ready` last changed (outcomes.py)
    cpu_milli: int | None = None  # allocatable CPU (milli): the fragmentation score weighs GPUs left without CPU
    # gpu-placement.io/settled-driver: the driver version the node last ran settled (facts/soak.py); a value
    # that is not a version reads as none (the rollout leader writes it again).
    settled_driver: Version | None = None
    # status.nodeInfo.bootID (changes when the node reboots) and gpu-placement.io/launch-fence as written
    # (parsed by facts/fence.py): the launch fence reads both, placement through the fence alone.
    boot_id: str = ""
    launch_fence: str | None = None
    refused: str | None = None  # gpu-placement.io/refused as the node carries it (controllers/refused_nodes.py)

    def unit_memory(self, resource: str) -> int | None:
        """MiB that one unit of `resource` stands for on this node (a whole GPU, a share, a MIG slice)."""
        if resource.startswith(n.MIG_RESOURCE_PREFIX):
            profile = self.mig.get(resource[len(n.MIG_RESOURCE_PREFIX):])
            return profile.memory_mib if profile else None
        if self.device_memory_mib is None:
            return None
        return self.device_memory_mib // self.replicas if self.replicas > 1 else self.device_memory_mib

    def device_memory(self, resource: str) -> int | None:
        """Memory of the device a unit of `resource` lives on: the per-device ceiling of any ask."""
        if resource.startswith(n.MIG_RESOURCE_PREFIX):
            return self.unit_memory(resource)
        return self.device_memory_mib

    def is_shared(self, resource: str) -> bool:
        return not resource.startswith(n.MIG_RESOURCE_PREFIX) and self.replicas > 1

    @property
    def mig_single_profile(self) -> str | None:
        """MIG `single` strategy with MIG on: `nvidia.com/gpu` units are slices, and GFD names the product
        `<GPU>-MIG-<profile>` (k8s-device-plugin internal/lm/resource.go). The profile, else None."""
        if self.mig_strategy != "single" or not self.product or "-MIG-" not in self.product:
            return None
        return self.product.rsplit("-MIG-", 1)[1]

    @property
    def unhealthy_devices(self) -> int:
        """Devices the device plugin dropped from allocatable (capacity > allocatable)."""
        return sum(max(0, cap - self.allocatable.get(res, 0)) for res, cap in self.capacity.items())


def node_from_json(obj: Mapping[str, Any], pool_of: Callable[[Mapping[str, str]], str | None] | None = None
                   ) -> NodeFacts:
    meta = obj.get("metadata") or {}
    labels: Mapping[str, str] = meta.get("labels") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    problems: dict[str, str] = {}
    ready, ready_message = _ready(status)
    driver = _driver(labels, problems)
    max_cuda, source = _max_cuda(labels, driver, problems)
    paused = next((f"{k}={v}" for k, v in labels.items()
                   if k.startswith(n.DEPLOY_PREFIX) and str(v).startswith("paused-")), None)
    return NodeFacts(
        name=str(meta.get("name", "")),
        ready=ready,
        ready_message=ready_message,
        unschedulable=bool(spec.get("unschedulable")),
        gpu_present=labels.get(n.GPU_PRESENT) == "true",
        product=labels.get(n.GPU_PRODUCT) or None,
        count=_int_label(labels, n.GPU_COUNT, problems),
        device_memory_mib=_memory_label(labels, n.GPU_MEMORY, problems),
        replicas=_replicas(labels, problems),
        sharing=labels.get(n.GPU_SHARING_STRATEGY) or "none",
        mig_strategy=labels.get(n.MIG_STRATEGY),
        mig=_mig_profiles(labels, problems),
        driver=driver,
        max_cuda=max_cuda,
        max_cuda_source=source,
        compute=_version_pair(labels, (n.COMPUTE_MAJOR, n.COMPUTE_MINOR), problems),
        upgrade_state=labels.get(n.DRIVER_UPGRADE_STATE) or None,
        paused=paused,
        mig_config_state=labels.get(n.MIG_CONFIG_STATE),
        capacity=_gpu_resources(status.get("capacity"), problems, "capacity"),
        allocatable=_gpu_resources(status.get("allocatable"), problems, "allocatable"),
        problems=problems,
        pool=pool_of(labels) if pool_of is not None else None,
        created=parse_time(meta.get("creationTimestamp")),
        ready_since=_ready_since(status),
        cpu_milli=_cpu_milli((status.get("allocatable") or {}).get("cpu")),
        settled_driver=_settled((meta.get("annotations") or {}).get(n.ANN_SETTLED_DRIVER)),
        boot_id=str((status.get("nodeInfo") or {}).get("bootID") or ""),
        launch_fence=_text((meta.get("annotations") or {}).get(n.ANN_LAUNCH_FENCE)),
        refused=labels.get(n.LABEL_REFUSED) or None,
    )


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


def _settled(value: Any) -> Version | None:
    try:
        return parse_version(value) if isinstance(value, str) else None
    except VersionError:
        return None


def _cpu_milli(value: Any) -> int | None:
    try:
        return cpu_to_milli(value) if value is not None else None
    except QuantityError:
        return None


def _ready(status: Mapping[str, Any]) -> tuple[bool, str]:
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready":
            if condition.get("status") == "True":
                return True, ""
            reason = condition.get("reason") or "no reason given"
            return False, f"Ready condition is {condition.get('status', 'Unknown')} ({reason})"
    return False, "has no Ready condition"


def _ready_since(status: Mapping[str, Any]) -> float | None:
    for condition in status.get("conditions") or ():
        if condition.get("type") == "Ready":
            return parse_time(condition.get("lastTransitionTime"))
    return None


def _int_label(labels: Mapping[str, str], key: str, problems: dict[str, str]) -> int | None:
    raw = labels.get(key)
    if raw is None or raw == "":
        return None
    try:
        value = int(raw)
    except ValueError:
        problems[key] = f"{key}={raw!r} is not a whole number"
        return None
    if value < 0:
        problems[key] = f"{key}={raw!r} is negative"
        return None
    return value


def _memory_label(labels: Mapping[str, str], key: str, problems: dict[str, str]) -> int | None:
    value = _int_label(labels, key, problems)
    if value is None:
        return None
    return value // _MIB if value > _BYTES_THRESHOLD else value


def _replicas(labels: Mapping[str, str], problems: dict[str, str]) -> int:
    value = _int_label(labels, n.GPU_REPLICAS, problems)
    return 1 if value is None else value  # 0 on a MIG-mixed GPU: no whole-GPU units


def _version_pair(labels: Mapping[str, str], keys: tuple[str, str], problems: dict[str, str]) -> Version | None:
    major, minor = labels.get(keys[0]), labels.get(keys[1])
    if major is None:
        return None
    text = f"{major}.{minor or 0}"
    try:
        return parse_version(text)
    except VersionError:
        problems[keys[0]] = f"{keys[0]}={major!r} / {keys[1]}={minor!r} is not a version"
        return None


def _driver(labels: Mapping[str, str], problems: dict[str, str]) -> Version | None:
    full = labels.get(n.DRIVER_FULL)
    if full:
        try:
            return parse_version(full)
        except VersionError:
            problems[n.DRIVER_FULL] = f"{n.DRIVER_FULL}={full!r} is not a driver version"
    for keys in (n.DRIVER_PARTS, n.DRIVER_PARTS_OLD):
        parts = [labels.get(key) for key in keys]
        if parts[0] is None:
            continue
        text = ".".join(part for part in parts if part)
        try:
            return parse_version(text)
        except VersionError:
            problems[keys[0]] = f"{keys[0]}={parts[0]!r} (with minor/revision) is not a driver version"
    return None


def _max_cuda(labels: Mapping[str, str], driver: Version | None, problems: dict[str, str]
              ) -> tuple[Version | None, str]:
    for keys in (n.CUDA_RUNTIME, n.CUDA_RUNTIME_OLD):
        version = _version_pair(labels, keys, problems)
        if version is not None:
            return version, keys[0].rsplit(".", 1)[0]
    if driver is not None:
        return driver_table().max_cuda(driver), "driver table"
    return None, "unknown"


def _mig_profiles(labels: Mapping[str, str], problems: dict[str, str]) -> dict[str, MigProfile]:
    profiles: dict[str, MigProfile] = {}
    for key in labels:
        if key.startswith(n.MIG_PREFIX) and key.endswith(".count"):
            profile = key[len(n.MIG_PREFIX):-len(".count")]
            count = _int_label(labels, key, problems)
            memory = _memory_label(labels, f"{n.MIG_PREFIX}{profile}.memory", problems)
            if count is not None:
                profiles[profile] = MigProfile(count, memory)
    return profiles


def _gpu_resources(resources: Mapping[str, Any] | None, problems: dict[str, str], where: str) -> dict[str, int]:
    counts: dict[str, int] = {}
    for name, value in (resources or {}).items():
        if not name.startswith("nvidia.com/"):
            continue
        try:
            counts[name] = quantity_to_int(value)
        except QuantityError:
            problems[f"status.{where}"] = f"status.{where}[{name}]={value!r} is not a quantity"
    return counts


@dataclass(slots=True, frozen=True)
class ValidatorState:
    """The GPU Operator's validator pod on a node, as the view finds it."""

    pod: str | None  # the validator pod on the node, None when there is none
    ready: bool


def charge(node: NodeFacts, resource: str, count: int, ask_mib: int | None) -> int | None:
    """MiB a pod holds on `node` for `count` units: a whole device is held whole whatever the pod
    says it uses; a share or a MIG slice holds the pod's ask, else its unit's memory."""
    unit = node.unit_memory(resource)
    if unit is None:
        return None
    if ask_mib is None or not node.is_shared(resource):
        return unit * count
    return ask_mib * count
