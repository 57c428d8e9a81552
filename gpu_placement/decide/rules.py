"""The placement rules: one function per family, one place per reason code.

Every rejection is `Code: sentence`, the sentence naming the fact that failed (of the node's class:
product, driver, CUDA, compute capability, upgrade or MIG state, resource) and what the pod needs,
so that kube-scheduler's `PodScheduled` condition tells a platform engineer what to fix. A sentence
never names its node and holds no per-node figure (free MiB, free units, pod names): kube-scheduler
counts identical strings (`0/1000 nodes are available: 620 DriverTooOld: ...`), so nodes with the
same cause share one string; the per-node figures are `explain`'s. Rules are pure: facts in,
verdict out, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import final

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.base.cuda import Version, driver_table
from gpu_placement.base.cuda import format_version as v
from gpu_placement.decide.requirements import Requirements
from gpu_placement.facts.cudaneed import CudaNeed, Term, brand_of, is_data_center, term_holds
from gpu_placement.facts.fence import DESCRIPTIONS, Fence, stamp
from gpu_placement.facts.nodes import NodeFacts, ValidatorState, charge
from gpu_placement.facts.soak import FAILED, NO_SOAK, Soak

__all__ = [
    "CODES",
    "HELD_FOR_NOMINATED",
    "NO_NEED",
    "RESOLVABLE",
    "Need",
    "NeedItem",
    "Rejection",
    "broken_ask",
    "check_node",
    "cuda_rule",
    "dra_readiness",
    "driver_fit",
    "insufficient_devices",
    "insufficient_memory",
    "insufficient_units",
    "launch_failures",
    "launch_fenced",
    "node_readiness",
    "unknown_node",
]

NODE_NOT_READY = "NodeNotReady"
NO_GPU = "NoGPU"
NOT_VALIDATED = "NotValidated"
DRIVER_UPGRADE = "DriverUpgrade"
MIG_RECONFIGURING = "MIGReconfiguring"
BAD_LABEL = "BadLabel"
UNKNOWN_DRIVER = "UnknownDriver"
DRIVER_TOO_OLD = "DriverTooOld"
COMPUTE_CAPABILITY = "ComputeCapability"
PRODUCT_MISMATCH = "ProductMismatch"
UNKNOWN_GPU_MEMORY = "UnknownGPUMemory"
INSUFFICIENT_GPU_MEMORY = "InsufficientGPUMemory"
INSUFFICIENT_GPU = "InsufficientGPU"
UNKNOWN_NODE = "UnknownNode"
BAD_ANNOTATION = "BadAnnotation"
SHARING_MISMATCH = "SharingMismatch"
UNKNOWN_CLAIM = "UnknownClaim"
DRIVER_SOAKING = "DriverSoaking"
LAUNCH_FAILURES = "LaunchFailures"
CODES = (NODE_NOT_READY, NO_GPU, NOT_VALIDATED, DRIVER_UPGRADE, MIG_RECONFIGURING, LAUNCH_FAILURES, DRIVER_SOAKING,
         SHARING_MISMATCH, BAD_LABEL,
         UNKNOWN_DRIVER, DRIVER_TOO_OLD, COMPUTE_CAPABILITY, PRODUCT_MISMATCH, UNKNOWN_GPU_MEMORY,
         INSUFFICIENT_GPU_MEMORY, INSUFFICIENT_GPU, UNKNOWN_NODE, BAD_ANNOTATION, UNKNOWN_CLAIM)
# A pod's DRA part stands in a Need as this one entry (units: the devices it asks, for people; no memory:
# nothing to reserve, the allocator gives the devices). Placement fits it against the node's devices
# (gpu_placement/decide/dra_fit.py) and scores by the alternative that fits.
DRA_DEVICES = "resource.k8s.io/devices"
# Preemption can free memory and devices on a node; it cannot install a driver, validate a node, or
# make a device bigger than it is. Static rules therefore never reject as resolvable.
RESOLVABLE = frozenset({INSUFFICIENT_GPU_MEMORY, INSUFFICIENT_GPU})


# final: placement tells a verdict's two kinds apart by `type(entry) is Rejection` (as fast as a check can be
# in CPython, and the type checker narrows on it only for classes that cannot be subclassed).
@final
@dataclass(slots=True, frozen=True)
class Rejection:
    code: str
    message: str  # "Code: sentence", as kube-scheduler shows it
    resolvable: bool = False  # preemption could make room (FailedNodes) or not (FailedAndUnresolvableNodes)


# One resource a pod takes: (resource, units, MiB or None when memory is unknown). The view charges a bound
# pod the same triples (ClusterView.charge_of), so preemption adds and takes them away alike.
NeedItem = tuple[str, int, int | None]


@final
@dataclass(slots=True, frozen=True)
class Need:
    """What a passing node must still have free for the pod. Made once per node class and kind of pod
    (placement caches the verdicts), never per request."""

    asks: tuple[NeedItem, ...] = ()
    dra: bool = False  # one ask is DRA_DEVICES: fitted against the node's devices (decide/dra_fit.py)


NO_NEED = Need()  # a pod that asks no GPU

_MIG_SETTLED = "success"
MPS = "mps"  # nvidia.com/gpu.sharing-strategy value of MPS sharing


def _reject(code: str, sentence: str) -> Rejection:
    return Rejection(code, f"{code}: {sentence}")


def broken_ask(error: str) -> Rejection:
    """Every node's verdict for a pod whose own ask is broken (`Requirements.error`): the same on each."""
    code = error.split(":", 1)[0]
    return Rejection(code if code in CODES else BAD_ANNOTATION, error)


def check_node(node: NodeFacts, validator: ValidatorState, req: Requirements, config: Config,
               soak: Soak = NO_SOAK, fences: tuple[Fence, ...] = ()) -> Rejection | Need:
    """The verdict that does not depend on what else runs on the node: readiness, its launch fences, the
    driver's soak, compatibility, and whether one device can ever hold the ask. Otherwise, what the pod
    will take (`Need`). `fences`: the node's closed launch fences (gpu_placement/decide/fences.py)."""
    if req.error is not None:
        return broken_ask(req.error)
    if req.claims or req.dra_resources:
        plugin = tuple((res, count) for res, count in req.gpus if not _served_by_dra(node, req, res))
        if req.claims or len(plugin) < len(req.gpus):
            return _check_dra(node, validator, req, replace(req, gpus=plugin), config, soak, fences)
    return (_readiness(node, validator, req, config) or launch_fenced(req, fences) or _soaking(node, soak, req, config)
            or _sharing_fit(node, req, config) or _image_cuda_fit(node, req) or _compatibility(node, req)
            or _label_problems(node, req) or _device_fit(node, req))


def _served_by_dra(node: NodeFacts, req: Requirements, resource: str) -> bool:
    """DRAExtendedResource: a resource a DeviceClass maps is allocated through DRA on a node whose
    allocatable lacks it (kube-scheduler, dynamicresources/extendeddynamicresources.go filterExtendedResources)."""
    return resource in req.dra_resources and node.allocatable.get(resource, 0) == 0


def _check_dra(node: NodeFacts, validator: ValidatorState, req: Requirements, plugin: Requirements,
               config: Config, soak: Soak, fences: tuple[Fence, ...] = ()) -> Rejection | Need:
    """A pod that takes devices through DRA here: the node rules, the driver's soak and what its images
    need, never unit or memory fit (the DRA allocator owns devices); its device-plugin part, if any, as
    always."""
    plugin_part = plugin.gpus and (_readiness(node, validator, plugin, config) or launch_fenced(plugin, fences)
                                   or _sharing_fit(node, plugin, config))
    rejection = (dra_readiness(node, validator, config) or plugin_part or launch_fenced(req, fences, dra=True)
                 or _soaking(node, soak, req, config)
                 or _image_cuda_fit(node, req) or _compatibility(node, req) or _label_problems(node, req))
    if rejection:
        return rejection
    fit = _device_fit(node, plugin) if plugin.gpus else NO_NEED
    if type(fit) is Rejection:
        return fit
    served = sum(count for resource, count in req.gpus if _served_by_dra(node, req, resource))
    asked = served + sum(request[0].count for request in req.dra_requests)
    return Need((*fit.asks, (DRA_DEVICES, asked, None)), dra=True)


def dra_readiness(node: NodeFacts, validator: ValidatorState, config: Config) -> Rejection | None:
    """Whether the node can give any device through DRA: the node-level rules, with its devices
    counted from its ResourceSlices instead of the device plugin's allocatable."""
    return (_node_up(node) or (None if node.dra_devices else _reject(
        NO_GPU, f"no ResourceSlice of {config.dra.driver} publishes devices for the node (its DRA kubelet plugin "
                "is not running, or found no GPU)")) or _gpu_stack(node, validator, config))


def node_readiness(node: NodeFacts, validator: ValidatorState, config: Config) -> Rejection | None:
    """Whether the node can take any GPU pod at all: the readiness rules for its own GPU resources."""
    offered = tuple((res, 1) for res, count in sorted(node.allocatable.items()) if count > 0)
    if not offered and node.dra_devices:  # a node whose GPUs only DRA gives
        return dra_readiness(node, validator, config)
    return _readiness(node, validator, Requirements(gpus=offered or (("nvidia.com/gpu", 1),)), config)


def _readiness(node: NodeFacts, validator: ValidatorState, req: Requirements, config: Config) -> Rejection | None:
    rejection = _node_up(node)
    if rejection:
        return rejection
    if not node.gpu_present:
        return _reject(NO_GPU, f"no {n.GPU_PRESENT}=true label on the node (GPU Feature Discovery found no GPU)")
    for resource, _count in req.gpus:
        if node.allocatable.get(resource, 0) == 0:
            return _reject(NO_GPU, _no_resource(node, resource))
    return _gpu_stack(node, validator, config)


def _node_up(node: NodeFacts) -> Rejection | None:
    if not node.ready:
        whose = "the node's " if node.ready_message.startswith("Ready") else "the node "
        return _reject(NODE_NOT_READY, whose + node.ready_message)
    if node.unschedulable:
        return _reject(NODE_NOT_READY, "the node is cordoned (spec.unschedulable); uncordon it when it is healthy")
    return None


def _gpu_stack(node: NodeFacts, validator: ValidatorState, config: Config) -> Rejection | None:
    """The GPU Operator's word on the node: validated, no driver upgrade, no MIG change under way."""
    if config.validator.required:
        where = f"(namespace {config.validator.namespace}, {config.validator.selector.text})"
        if validator.pod is None:
            return _reject(NOT_VALIDATED, f"no nvidia-operator-validator pod on the node {where}")
        if not validator.ready:
            return _reject(NOT_VALIDATED, f"the nvidia-operator-validator pod on the node is not Ready {where}")
    if node.upgrade_state not in (None, n.UPGRADE_DONE, n.UPGRADE_REQUIRED):
        return _reject(DRIVER_UPGRADE, f"the node is in a driver upgrade "
                                       f"({n.DRIVER_UPGRADE_STATE}={node.upgrade_state})")
    if node.paused:
        return _reject(DRIVER_UPGRADE, f"the node has {node.paused}: GPU Operator components are paused")
    if node.mig_config_state not in (None, _MIG_SETTLED):
        return _reject(MIG_RECONFIGURING, f"the node is applying a MIG layout "
                                          f"({n.MIG_CONFIG_STATE}={node.mig_config_state})")
    return None


def launch_fenced(req: Requirements, fences: tuple[Fence, ...], dra: bool = False) -> Rejection | None:
    """LaunchFailures: GPU pods of a resource the pod asks failed to start on the node for the node's
    reasons, in a row (the rule: gpu_placement/facts/fence.py). The sentence names the cause, how many and
    since when: the time is the node's own, so fenced nodes do not share one string (they are few).
    `dra`: the pod takes devices through DRA: claim pods' fence (DRA_DEVICES) refuses the node when the
    failures did not name their devices; naming them, it keeps only those out (decide/dra_fit.py)."""
    for fence in fences:
        if any(resource == fence.resource for resource, _ in req.gpus) or (
                dra and fence.resource == DRA_DEVICES and not fence.devices):
            return launch_failures(fence)
    return None


def launch_failures(fence: Fence) -> Rejection:
    """A fence's reason: the cause, the count, since when, what lifts it and when its probe opens."""
    cause = f"{fence.cause}: {DESCRIPTIONS.get(fence.cause, fence.cause)}"
    pods = "GPU pods with DRA claims" if fence.resource == DRA_DEVICES else f"{fence.resource} pods"
    return _reject(LAUNCH_FAILURES, f"{fence.count} {pods} in a row failed to start on the node for "
                                    f"the node's reasons ({cause}) since {stamp(fence.since)}; lifts when the GPU "
                                    "Operator revalidates the node, its device plugin or driver restarts, the node "
                                    f"reboots, or a probe pod starts (one goes through from {stamp(fence.probe_at)})")


def _soaking(node: NodeFacts, soak: Soak, req: Requirements, config: Config) -> Rejection | None:
    """`rollout.soak: strict`: a driver new on the node, not yet run `soakMinutes` there (or failed its
    soak), runs canary namespaces' pods only. With `prefer` the score says it instead (placement). A driver
    pod reinstalled with the node's settled driver is not new (facts/soak.py)."""
    if not soak.avoided or req.canary or config.rollout.soak != "strict":
        return None
    driver = f"driver {v(node.driver)}" if node.driver else "the node's driver"
    minutes = f"{config.rollout.soak_minutes:g} minutes"
    allow = f"only pods of namespaces annotated {n.ANN_CANARY}=\"true\" run on it"
    if soak.state == FAILED:
        return _reject(DRIVER_SOAKING, f"{driver} failed its {minutes} soak on the node (an XID error, a driver or "
                                       f"validator restart, or upgrade-failed; see gpu-placement rollout): {allow} "
                                       "until the driver is replaced or rolled back (rollout.soak: strict)")
    return _reject(DRIVER_SOAKING, f"{driver} is new on the node and is soaking: {allow} until it has run "
                                   f"{minutes} there without an XID error or a validator restart "
                                   "(rollout.soak: strict)")


def _no_resource(node: NodeFacts, resource: str) -> str:
    """Why a node with GPUs has none of this resource: three different fixes."""
    offered = sorted(res for res, count in node.allocatable.items() if count > 0)
    if node.capacity.get(resource, 0) > 0:
        return f"0 allocatable {resource} on the node (capacity > 0): the device plugin marked them unhealthy"
    if offered:
        return f"the node offers no {resource} (it offers {', '.join(offered)})"
    return (f"0 allocatable {resource} on the node: the device plugin has not registered its GPUs "
            "(driver or container toolkit validation failed)")


def _compatibility(node: NodeFacts, req: Requirements) -> Rejection | None:
    if req.cuda is not None:
        need = f"the pod needs CUDA >= {v(req.cuda)} ({req.cuda_source})"
        table = driver_table()
        if req.cuda[0] >= 13 and node.compute is not None and node.compute < table.cuda13_min_compute:
            return _reject(COMPUTE_CAPABILITY, f"the node's GPU ({node.product}) has compute capability "
                                               f"{v(node.compute)}; CUDA 13 needs >= {v(table.cuda13_min_compute)}")
        if node.max_cuda is None and node.driver is not None:
            floor = table.min_driver(req.cuda)
            needs = f" (CUDA {v(req.cuda)} needs >= {v(floor)})" if floor else ""
            return _reject(DRIVER_TOO_OLD, f"driver {v(node.driver)} is older than every CUDA release in "
                                           f"the driver table{needs}; {need}")
        if node.max_cuda is None:
            return _reject(UNKNOWN_DRIVER, f"the node publishes no driver or CUDA version labels "
                                           f"({n.DRIVER_FULL}, {n.CUDA_RUNTIME[0]}); {need}")
        driver = f"driver {v(node.driver)}" if node.driver else "the node's driver"
        if req.cuda_compat:
            floor = table.compat_floor.get(req.cuda[0])
            if node.max_cuda[0] < req.cuda[0]:
                return _reject(DRIVER_TOO_OLD, f"{driver} supports CUDA up to {v(node.max_cuda)}, "
                                               f"below CUDA {req.cuda[0]}.x even with minor-version "
                                               f"compatibility; {need}")
            if node.max_cuda[0] == req.cuda[0] and node.driver is not None and floor and node.driver < floor:
                return _reject(DRIVER_TOO_OLD, f"driver {v(node.driver)} is below {v(floor)}, the floor of "
                                               f"CUDA {req.cuda[0]}.x minor-version compatibility; {need}")
        elif node.max_cuda < req.cuda[:2]:
            return _reject(DRIVER_TOO_OLD, f"{driver} supports CUDA up to {v(node.max_cuda)}; {need}")
        elif len(req.cuda) > 2 and node.driver is not None:
            floor = table.min_driver(req.cuda)
            if floor is not None and node.driver < floor:
                return _reject(DRIVER_TOO_OLD, f"driver {v(node.driver)} is below {v(floor)}, the "
                                               f"minimum for CUDA {v(req.cuda)}; {need}")
    if req.min_driver is not None:
        if node.driver is None:
            return _reject(UNKNOWN_DRIVER, f"the node publishes no driver version ({n.DRIVER_FULL}); "
                                           f"the pod needs driver >= {v(req.min_driver)}")
        if node.driver < req.min_driver:
            return _reject(DRIVER_TOO_OLD, f"driver {v(node.driver)} is older than "
                                           f"{v(req.min_driver)} ({n.ANN_MIN_DRIVER})")
    if req.min_compute is not None:
        if node.compute is None:
            return _reject(UNKNOWN_DRIVER, f"the node publishes no compute capability ({n.COMPUTE_MAJOR}); "
                                           f"the pod needs >= {v(req.min_compute)}")
        if node.compute < req.min_compute:
            return _reject(COMPUTE_CAPABILITY, f"the node's GPU ({node.product}) has compute capability "
                                               f"{v(node.compute)}; the pod needs >= {v(req.min_compute)} "
                                               f"({n.ANN_MIN_COMPUTE})")
    if req.products is not None and not _product_matches(node.product, req.products, req.sharing):
        return _reject(PRODUCT_MISMATCH, f"the node has {node.product or 'no ' + n.GPU_PRODUCT + ' label'}; "
                                         f"the pod accepts {', '.join(sorted(req.products))} ({n.ANN_PRODUCTS})")
    return None


def _product_matches(product: str | None, accepted: frozenset[str], sharing: str = "exclusive") -> bool:
    """Time-slicing without renaming calls the product `<name>-SHARED` and MIG single strategy
    `<name>-MIG-<profile>`: that is still the named GPU only for a pod that asked for that level."""
    if product is None:
        return False
    if product in accepted:
        return True
    name, level = product, "exclusive"
    if name.endswith("-SHARED"):
        name, level = name.removesuffix("-SHARED"), "shared"
    base = name
    if "-MIG-" in name:
        base, profile = name.rsplit("-MIG-", 1)
        level = level if level == "shared" else f"mig-{profile}"
    return sharing == level and (name in accepted or base in accepted)


def _sharing_fit(node: NodeFacts, req: Requirements, config: Config) -> Rejection | None:
    """An exclusive pod asking for whole GPUs must not get a replica of a shared GPU (time-slicing or MPS
    without a renamed resource) or a MIG slice advertised as `nvidia.com/gpu` (strategy single)."""
    if req.sharing != "exclusive":
        return None
    for resource, _count in req.gpus:
        if resource == config.shared_resource or resource.startswith(n.MIG_RESOURCE_PREFIX):
            continue  # the pod asked for a share or a slice by name
        if node.is_shared(resource):
            return _reject(SHARING_MISMATCH, f"the pod's sharing level is exclusive (whole GPUs), but {resource} "
                                             f"here is a replica of a shared GPU ({n.GPU_REPLICAS} > 1, "
                                             "time-slicing or MPS); to accept a share, set "
                                             f"{n.ANN_SHARING}=shared on the pod (allowed in any namespace)")
        profile = node.mig_single_profile
        if profile is not None:
            return _reject(SHARING_MISMATCH, f"the pod's sharing level is exclusive (whole GPUs), but {resource} "
                                             f"here is a MIG {profile} slice ({n.MIG_STRATEGY}=single); to accept "
                                             f"that slice, set {n.ANN_SHARING}=mig-{profile} on the pod")
    return None


def _image_cuda_fit(node: NodeFacts, req: Requirements) -> Rejection | None:
    """What the images need, judged as the node will judge it: `NVIDIA_REQUIRE_CUDA` alternatives as the
    container runtime asserts them; a version from a tag with minor-version compatibility (same CUDA
    major, driver at or above that major's floor) unless the pod set cuda-compat: none; and the
    images' CUDA compatibility package (forward compatibility) on the driver branches it serves, on
    data-center GPUs only."""
    return _image_cuda(node, req)[1]


def driver_fit(node: NodeFacts, req: Requirements) -> Rejection | None:
    """Whether the node's driver gives what the pod needs, readiness and fit aside: what the images
    need, then the pod's CUDA, driver, compute and product requirements (the survey asks this of every
    GPU workload against every node it selects)."""
    return _image_cuda_fit(node, req) or _compatibility(node, req)


def cuda_rule(node: NodeFacts, req: Requirements) -> str | None:
    """For `explain`: how a node that passes meets what the images need, when it is not plainly by the
    driver's own CUDA version."""
    return _image_cuda(node, req)[0]


def _image_cuda(node: NodeFacts, req: Requirements) -> tuple[str | None, Rejection | None]:
    """(the rule that lets the node run the images, when it is not the driver's own CUDA; the rejection)."""
    need = req.image_cuda
    if need is None:
        return None, None
    table = driver_table()
    if need.version[0] >= 13 and node.compute is not None and node.compute < table.cuda13_min_compute:
        return None, _reject(COMPUTE_CAPABILITY, f"compute capability {v(node.compute)} is below "
                                                 f"{v(table.cuda13_min_compute)}, which CUDA 13 needs; the image needs "
                                                 f"CUDA {v(need.version)} ({need.source})")
    if node.max_cuda is None and node.driver is None:
        return None, _reject(UNKNOWN_DRIVER, f"the node publishes no driver or CUDA version labels "
                                             f"({n.DRIVER_FULL}, {n.CUDA_RUNTIME[0]}); the image needs CUDA "
                                             f"{v(need.version)} ({need.source})")
    driver = f"driver {v(node.driver)}" if node.driver else "the driver"
    supports = f"supports CUDA up to {v(node.max_cuda)}" if node.max_cuda else "is older than every CUDA release"
    if need.terms is not None:
        return _require_cuda(node, need.source, need.terms, f"{driver} {supports}")
    if node.max_cuda is not None and node.max_cuda >= need.version[:2]:
        return None, None
    wanted = f"the image needs CUDA {v(need.version)} ({need.source})"
    if not need.compat:
        return None, _reject(DRIVER_TOO_OLD, f"{driver} {supports}; {wanted} and the pod sets "
                                             f"{n.ANN_CUDA_COMPAT}=none")
    floor = table.compat_floor.get(need.version[0])
    if node.max_cuda is not None and node.max_cuda[0] == need.version[0] and floor is not None \
            and (node.driver is None or node.driver >= floor):  # same major, at or above the floor: it runs
        return (f"CUDA {v(need.version)} by minor-version compatibility (the driver supports CUDA "
                f"{v(node.max_cuda)})"), None
    if _forward_compatible(node, need):
        return f"forward compatibility ({need.forward_source})", None
    if node.max_cuda is None or node.max_cuda[0] != need.version[0] or floor is None:
        why = f"{driver} {supports}; {wanted}, and minor-version compatibility stays within CUDA {need.version[0]}.x"
    else:
        why = (f"{driver} is below {v(floor)}, the floor of CUDA {need.version[0]}.x minor-version compatibility; "
               f"{wanted}")
    return None, _reject(DRIVER_TOO_OLD, why + _forward_missed(node, need))


def _forward_compatible(node: NodeFacts, need: CudaNeed) -> bool:
    """CUDA forward compatibility: the image's compatibility package serves the node's driver branch (at
    or above that branch's lowest driver), and the GPU is a data-center GPU."""
    return node.driver is not None and is_data_center(node.product) and any(
        node.driver[0] == branch and node.driver >= lowest for branch, lowest in need.forward)


def _forward_missed(node: NodeFacts, need: CudaNeed) -> str:
    """Why forward compatibility does not help either, when the image has it."""
    if not need.forward:
        return ""
    if not is_data_center(node.product):
        return (f"; forward compatibility ({need.forward_source}: {need.branches()}) works on data-center GPUs only, "
                f"and {node.product or 'a GPU without a product label'} is not one")
    return f"; forward compatibility ({need.forward_source}) covers {need.branches()} only"


def _require_cuda(node: NodeFacts, source: str, terms: tuple[Term, ...], driver: str
                  ) -> tuple[str | None, Rejection | None]:
    """`NVIDIA_REQUIRE_CUDA` as the container runtime asserts it: any alternative that holds. One without
    a `cuda` factor (`brand=tesla,driver>=470,driver<471`) admits an older driver branch through the
    image's compatibility package, which works on data-center GPUs only."""
    facts = _runtime_facts(node)
    held = [term for term in terms if term_holds(term, facts)]
    usable = [term for term in held if any(f[0] == "cuda" for f in term) or is_data_center(node.product)]
    if usable:
        return f"{source}: {','.join(''.join(f) for f in usable[0])} holds", None
    if held:
        return None, _reject(DRIVER_TOO_OLD, f"{driver}; only a forward-compatibility alternative of {source} holds "
                                             f"({','.join(''.join(f) for f in held[0])}), and forward compatibility "
                                             f"works on data-center GPUs only: {node.product or 'the GPU'} is not one")
    return None, _reject(DRIVER_TOO_OLD, f"{driver} and meets no alternative of {source}, so the container runtime "
                                         "would refuse to start it; use a node with a newer driver")


def _runtime_facts(node: NodeFacts) -> dict[str, Version | str | None]:
    """The properties NVIDIA's container runtime checks NVIDIA_REQUIRE_* against, from the node's labels."""
    return {"cuda": node.max_cuda, "driver": node.driver, "arch": node.compute, "brand": brand_of(node.product)}


def _label_problems(node: NodeFacts, req: Requirements) -> Rejection | None:
    if not node.problems:
        return None
    relevant = {n.GPU_MEMORY, n.GPU_REPLICAS, "status.allocatable", "status.capacity"}
    relevant.update(f"{n.MIG_PREFIX}{res[len(n.MIG_RESOURCE_PREFIX):]}.memory" for res, _ in req.gpus)
    if req.cuda is not None or req.min_driver is not None or req.image_cuda is not None:
        relevant.update((n.DRIVER_FULL, n.DRIVER_PARTS[0], n.DRIVER_PARTS_OLD[0], n.CUDA_RUNTIME[0],
                         n.CUDA_RUNTIME_OLD[0]))
    if req.min_compute is not None or req.cuda is not None or req.image_cuda is not None:
        relevant.add(n.COMPUTE_MAJOR)
    for label in sorted(relevant & node.problems.keys()):
        return _reject(BAD_LABEL, f"{node.problems[label]}; fix GPU Feature Discovery on the node")
    return None


def _device_fit(node: NodeFacts, req: Requirements) -> Rejection | Need:
    need: list[NeedItem] = []
    for resource, count in req.gpus:
        device = node.device_memory(resource)
        if req.memory_mib is not None:
            if device is None:
                return _reject(UNKNOWN_GPU_MEMORY, f"the node publishes no {n.GPU_MEMORY} label; the pod asks "
                                                   f"{req.memory_mib} MiB per device ({req.memory_source})")
            if req.memory_mib > device:
                return _reject(INSUFFICIENT_GPU_MEMORY, f"the pod asks {req.memory_mib} MiB per device "
                                                        f"({req.memory_source}); each {resource} on the node "
                                                        f"has {device} MiB ({node.product or 'unknown product'})")
            mps = _mps_cap(node, resource, req.memory_mib)
            if mps is not None:
                return mps
        need.append((resource, count, charge(node, resource, count, req.memory_mib)))
    return Need(tuple(need))


def _mps_cap(node: NodeFacts, resource: str, ask_mib: int) -> Rejection | None:
    """MPS: the device plugin's control daemon sets each device's default pinned-memory limit to device
    memory / replicas (k8s-device-plugin, cmd/mps-control-daemon/mps/daemon.go), so a client that asks for
    more dies of CUDA OOM at that cap. Preemption cannot raise it: unresolvable."""
    if node.sharing != MPS or not node.is_shared(resource) or node.device_memory_mib is None:
        return None
    if ask_mib <= node.device_memory_mib // node.replicas:
        return None
    return _reject(INSUFFICIENT_GPU_MEMORY, f"the pod asks {ask_mib} MiB per device; MPS splits each device's "
                                            f"memory evenly between its replicas ({n.GPU_MEMORY} / "
                                            f"{n.GPU_REPLICAS}) and caps every client there, so the ask cannot fit "
                                            f"a share: lower {n.ANN_GPU_MEMORY} or use a node with fewer replicas")


def insufficient_memory(resource: str, need: int) -> str:
    return (f"{INSUFFICIENT_GPU_MEMORY}: the pod needs {need} MiB of {resource} memory free and the node has "
            "less (per-node figures: gpu-placement explain)")


# Added to a shortfall on a node where pods nominated there (preemption made room for them) hold part of
# what is free: /filter keeps that room for them (gpu_placement/decide/nominated.py).
HELD_FOR_NOMINATED = ("; part of what is free there is held for a pod of equal or higher priority that preemption "
                      "made room for (status.nominatedNodeName)")


def insufficient_units(resource: str, need: int) -> str:
    return f"{INSUFFICIENT_GPU}: the pod needs {need} {resource} free and the node has fewer"


def insufficient_devices(classes: str) -> str:
    """No alternative of some request of the pod fits the node's free DRA devices. Unresolvable:
    kube-scheduler does not preempt for DRA devices (its DynamicResources plugin answers
    UnschedulableAndUnresolvable and has no PreFilterExtensions to simulate victims, v1.37.2
    dynamicresources.go; KEP-5690 is not merged)."""
    return (f"{INSUFFICIENT_GPU}: no free DRA device of {classes} on the node serves what the pod's claims ask "
            "(held by other claims, kept out by a taint, or not of the product, profile, memory or driver asked; "
            "per-device figures: gpu-placement explain); kube-scheduler does not preempt for DRA devices")


UNKNOWN_NODE_MESSAGE = (f"{UNKNOWN_NODE}: the node is not in gpu-placement's view of the cluster "
                        "(not listed yet, or deleted)")


def unknown_node() -> str:
    return UNKNOWN_NODE_MESSAGE
