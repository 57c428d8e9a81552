"""Whether a node's DRA devices can serve what a pod asks, counted as kube-scheduler's allocator counts it.

One place for the device accounting the extender's fit and scores, `explain` and the replay read:
the node's devices (its ResourceSlices), which ones allocated claims hold and what they consume of
devices shared by capacity (gpu_placement/view/dra.py `used_on`, `consumed_on`), and the devices
gpu-placement keeps out (a recent XID, a device a pod reports unhealthy: the same devices its
DeviceTaintRules taint, gpu_placement/controllers/dra_taints.py).

A pod's asks are requests, each with its alternatives in order (`exactly`: one; `firstAvailable`: the
allocator takes the first it can satisfy, KEP-4816). For each request the alternatives are tried in
order, and each takes its devices first fit in the order the node publishes them
(k8s.io/dynamic-resource-allocation v0.37.2 structured/internal/incubating/allocator_incubating.go
`allocateOne`): a device passes when

- its class selects it: the `type` the class's CEL asks for (DeviceClass.device_type);
- the alternative's selectors hold, for the forms gpu-placement writes in its templates (MIG profile,
  products, device memory, driver: gpu_placement/decide/claims.py `template_for`); other CEL is the
  allocator's to evaluate, and is taken to hold;
- no NoSchedule/NoExecute taint of the driver's blocks it (`taintPreventsAllocation`; a claim's own
  tolerations are not read here), and gpu-placement does not keep it out;
- it is not in use (`deviceInUse`), or, shared by capacity (`allowMultipleAllocations`), what the
  request consumes of each capacity still fits beside what allocations consume of it already
  (consumable_capacity.go `CmpRequestOverCapacity`, `calculateConsumedCapacity`: the amount asked,
  rounded up by the capacity's requestPolicy; not asked, its default, else all of it).

Requests are served as the allocator serves them, depth first (`allocateOne`): each request's
alternatives in order, each alternative's devices first fit, and when a later request finds nothing,
the earlier ones try their next devices, then their next alternative. So the answer is the
allocator's first solution (the first fit itself whenever that works out), and a pod whose requests
compete for the same few devices fits where a solution exists. The search is bounded
(`SEARCH_LIMIT` devices tried a node; the allocator's own bound is its filter timeout): past it,
the node counts as fitting (kube-scheduler's allocator, which runs before the extender, decides).
Admin-access alternatives (monitors) take nothing and are not counted.

The fill a node would reach with the pod on it (what binpack and spread score) is the share of the
memory of the node's devices of the classes asked that is in use: a held device whole, a shared one by
what allocations consume of its memory (else of its fullest consumable capacity); devices without a
memory capacity count one each.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpu_placement.base.cuda import Version, VersionError, parse_version
from gpu_placement.base.names import BLOCKING_EFFECTS
from gpu_placement.base.quantity import QuantityError, quantity_to_mib
from gpu_placement.facts.dra import Alternative, Capacity, Device, Request, device_product

if TYPE_CHECKING:
    from gpu_placement.view.cluster import ClusterView

__all__ = ["DEVICE_PLUGIN", "DRA", "DraFit", "Selectors", "both_ways_on", "consumption", "excluded_devices",
           "extended_requests", "fit", "fit_on", "matches", "parse_selectors", "served_by", "served_on", "why_not",
           "why_not_on"]

_NONE: Mapping[str, int] = {}
_MIB_MILLI = 2**20 * 1000
_PROFILE = re.compile(r"""\.profile\s*==\s*['"]([^'"]+)['"]""")
_PRODUCTS = re.compile(r"""\.productName\.replace\(\s*' '\s*,\s*'-'\s*\)\s*in\s*\[([^\]]*)\]""")
_MEMORY = re.compile(r"""\.memory\.compareTo\(\s*quantity\(\s*['"]([^'"]+)['"]\s*\)\s*\)\s*>=\s*0""")
_DRIVER = re.compile(r"""\.driverVersion\.compareTo\(\s*semver\(\s*['"]([^'"]+)['"]\s*\)\s*\)\s*>=\s*0""")
_QUOTED = re.compile(r"""['"]([^'"]*)['"]""")


@dataclass(slots=True, frozen=True)
class Selectors:
    """What the CEL selectors gpu-placement writes hold a device to (None: not asked)."""

    profile: str | None = None  # NVIDIA's spelling: 1g.10gb+me
    products: frozenset[str] | None = None  # GPU Feature Discovery's form: spaces as dashes
    memory_mib: int | None = None
    driver: Version | None = None


_NO_SELECTORS = Selectors()
_PARSED: dict[tuple[str, ...], Selectors] = {}


def parse_selectors(expressions: tuple[str, ...]) -> Selectors:
    """The forms of `template_for`'s selectors found in `expressions`; the rest are left to the allocator."""
    if not expressions:
        return _NO_SELECTORS
    found = _PARSED.get(expressions)
    if found is not None:
        return found
    profile = products = memory = driver = None
    for expression in expressions:
        if (m := _PROFILE.search(expression)) is not None:
            profile = m.group(1)
        elif (m := _PRODUCTS.search(expression)) is not None:
            products = frozenset(_QUOTED.findall(m.group(1)))
        elif (m := _MEMORY.search(expression)) is not None:
            try:
                memory = quantity_to_mib(m.group(1))
            except (QuantityError, ValueError):
                memory = None
        elif (m := _DRIVER.search(expression)) is not None:
            try:
                driver = parse_version(m.group(1))
            except VersionError:
                driver = None
    found = Selectors(profile, products, memory, driver)
    if len(_PARSED) < 4096:  # a handful of templates' selectors in practice; bounded whatever arrives
        _PARSED[expressions] = found
    return found


def matches(device: Device, alternative: Alternative, device_type: str | None) -> str | None:
    """Why `device` cannot serve `alternative` by what it is (None: it can), read as its class and the
    selectors gpu-placement writes read it: for the fit and for `explain`."""
    if device_type is not None and device.type != device_type:
        return f"type {device.type}"
    wanted = parse_selectors(alternative.selectors)
    if wanted.profile is not None and device.profile != wanted.profile:
        return f"profile {device.profile or 'none'}"
    if wanted.products is not None and device_product(device) not in wanted.products:
        return f"product {device.product}"
    if wanted.memory_mib is not None and (device.memory_mib or 0) < wanted.memory_mib:
        return f"memory {device.memory_mib} MiB"
    if wanted.driver is not None and (device.driver is None or _pad(device.driver) < _pad(wanted.driver)):
        return f"driver {'.'.join(map(str, device.driver)) if device.driver else 'unknown'}"
    return None


def _consumed_amount(asked: int | None, capacity: Capacity) -> int:
    """`calculateConsumedCapacity`: what one request consumes of one capacity."""
    if asked is None:  # fillEmptyRequest
        return capacity.default if capacity.default is not None else capacity.value
    if capacity.minimum is not None:  # roundUpRange
        if asked < capacity.minimum:
            return capacity.minimum
        if not capacity.step:
            return asked
        steps = -(-(asked - capacity.minimum) // capacity.step)
        return capacity.minimum + steps * capacity.step
    if capacity.valid_values:  # roundUpValidValues
        return next((v for v in capacity.valid_values if asked <= v), asked)
    return asked


def _violates(amount: int, capacity: Capacity) -> bool:
    """`violatesPolicy`."""
    if capacity.default is not None and amount == capacity.default:
        return False
    if capacity.minimum is not None:
        if capacity.maximum is not None and amount > capacity.maximum:
            return True
        return capacity.step is not None and capacity.step != 0 and (amount - capacity.minimum) % capacity.step != 0
    if capacity.valid_values:
        return amount not in capacity.valid_values
    return False


def consumption(device: Device, wants: Mapping[str, int]) -> dict[str, int] | None:
    """What a request asking `wants` (capacity -> milli-units) consumes of each capacity of the device;
    None when the device lacks a capacity asked (`requestsContainNonExistCapacity`) or an amount breaks
    its requestPolicy."""
    if any(device.capacity_of(name) is None for name in wants):
        return None
    amounts = {}
    for capacity in device.capacity:
        amount = _consumed_amount(wants.get(capacity.name), capacity)
        if amount < 0 or _violates(amount, capacity):
            return None
        amounts[capacity.name] = amount
    return amounts


@dataclass(slots=True, frozen=True)
class DraFit:
    """How a pod's DRA asks fit a node: the alternative each request would get, and the node's fill."""

    chosen: tuple[int, ...]  # per request: the index of the alternative the allocator would take
    choices: int  # the most alternatives any request lists (1: no firstAvailable)
    fill: float  # share of the asked classes' device memory in use once the pod is on the node, 0..1
    devices: tuple[str, ...]  # the devices it would take, first fit

    @property
    def rank(self) -> int:
        """0 when every request gets its first choice; else the furthest fallback taken."""
        return max(self.chosen, default=0)


SEARCH_LIMIT = 2_000  # devices tried for one pod on one node (a few ms) before the search gives up (see above)


class _SearchTooLong(Exception):
    pass


def fit(devices: Sequence[Device], held: Mapping[str, int], consumed: Mapping[str, Mapping[str, int]],
        excluded: AbstractSet[str], requests: Sequence[Request], types: Mapping[str, str | None]) -> DraFit | None:
    """Where the pod's `requests` fit the node's `devices` (None: no allocation serves them all).
    `held`: device -> allocated claims holding it; `consumed`: device -> capacity -> milli-units
    allocations consume; `excluded`: devices gpu-placement keeps out; `types`: class -> device type.

    First fit, request by request: the allocator's first try, and its answer whenever it works out.
    When it does not and there are several requests, the allocator's search (`_search`) decides: one
    request that first fit cannot serve has no other allocation (a request's devices do not compete)."""
    taken: set[str] = set()
    taking: dict[str, dict[str, int]] = {}
    chosen: list[int] = []
    names: list[str] = []
    classes: set[str] = set()
    for request in requests:
        for index, alternative in enumerate(request):
            if alternative.admin:
                picked: list[tuple[str, dict[str, int] | None]] | None = []
            else:
                picked = _pick(devices, held, consumed, excluded, alternative, types, taken, taking)
            if picked is None:
                continue
            for name, amounts in picked:
                _take(taken, taking, name, amounts)
                names.append(name)
            chosen.append(index)
            classes.add(alternative.device_class)
            break
        else:
            return _search(devices, held, consumed, excluded, requests, types) if len(requests) > 1 else None
    return DraFit(tuple(chosen), max((len(r) for r in requests), default=1),
                  _fill(devices, held, consumed, taken, taking, classes, types), tuple(names))


def _search(devices: Sequence[Device], held: Mapping[str, int], consumed: Mapping[str, Mapping[str, int]],
            excluded: AbstractSet[str], requests: Sequence[Request], types: Mapping[str, str | None]) -> DraFit | None:
    """`fit` by the allocator's depth-first search (`allocateOne`): each request's alternatives in order,
    each alternative's devices in order, and when a later request finds nothing the earlier ones try their
    next devices, then their next alternative. Bounded by SEARCH_LIMIT devices tried."""
    taken: set[str] = set()
    taking: dict[str, dict[str, int]] = {}
    chosen: list[int] = []
    names: list[str] = []
    classes: list[str] = []
    tried = 0
    # Pruned where no allocation can be left: each request takes at least its smallest alternative's count
    # of distinct devices, and an exclusive device serves one request. (Shared devices serve several: then
    # this count says nothing, and nothing is pruned by it.)
    shares = any(d.shared for d in devices)
    free = sum(1 for d in devices if d.name not in excluded and not held.get(d.name)
               and not any(t.effect in BLOCKING_EFFECTS for t in d.taints))
    needed = [0] * (len(requests) + 1)
    for index in range(len(requests) - 1, -1, -1):
        needed[index] = needed[index + 1] + min((0 if a.admin else max(a.count, 1) for a in requests[index]),
                                                default=0)

    def take(name: str, amounts: dict[str, int] | None) -> None:
        _take(taken, taking, name, amounts)
        names.append(name)

    def give_back(name: str, amounts: dict[str, int] | None) -> None:
        names.pop()
        if amounts is None:
            taken.discard(name)
            return
        mine = taking[name]
        for key, amount in amounts.items():
            mine[key] -= amount
        if not any(mine.values()):
            del taking[name]

    def serve(request: int) -> bool:
        """Requests `request` on, each by its first alternative that leaves the rest a solution."""
        if request == len(requests):
            return True
        if not shares and needed[request] > free - len(taken):
            return False
        for index, alternative in enumerate(requests[request]):
            chosen.append(index)
            classes.append(alternative.device_class)
            if alternative.admin:
                done = serve(request + 1)
            elif alternative.count == 0:
                done = every(request, alternative)
            else:
                done = some(request, alternative, dict(alternative.capacity), 0, alternative.count)
            if done:
                return True
            chosen.pop()
            classes.pop()
        return False

    def every(request: int, alternative: Alternative) -> bool:
        """allocationMode All: every device of the class, or none; no choice to go back on."""
        picked = _pick(devices, held, consumed, excluded, alternative, types, taken, taking)
        if picked is None:
            return False
        for name, amounts in picked:
            take(name, amounts)
        if serve(request + 1):
            return True
        for name, amounts in reversed(picked):
            give_back(name, amounts)
        return False

    def some(request: int, alternative: Alternative, wants: Mapping[str, int], start: int, left: int) -> bool:
        """`left` more devices for this alternative, from device `start` on, then the requests after it."""
        nonlocal tried
        if left == 0:
            return serve(request + 1)
        device_type = types.get(alternative.device_class)
        for index in range(start, len(devices) - left + 1):  # `left` devices must remain to try
            device = devices[index]
            tried += 1
            if tried > SEARCH_LIMIT:
                raise _SearchTooLong
            if matches(device, alternative, device_type) is not None:
                continue
            usable = _usable(device, held, consumed, excluded, wants, taken, taking)
            if not isinstance(usable, dict):
                continue
            amounts = usable if device.shared else None
            take(device.name, amounts)
            if some(request, alternative, wants, index + 1, left - 1):
                return True
            give_back(device.name, amounts)
        return False

    choices = max((len(r) for r in requests), default=1)
    try:
        if not serve(0):
            return None
    except _SearchTooLong:  # no answer within the bound: the allocator's to give; its first choices assumed
        return DraFit((0,) * len(requests), choices, _fill(devices, held, consumed, set(), {}, {
            alternatives[0].device_class for alternatives in requests if alternatives}, types), ())
    return DraFit(tuple(chosen), choices, _fill(devices, held, consumed, taken, taking, set(classes), types),
                  tuple(names))


def _take(taken: set[str], taking: dict[str, dict[str, int]], name: str, amounts: dict[str, int] | None) -> None:
    """The device given to the pod: whole (`amounts` None), or what it consumes of a shared one."""
    if amounts is None:
        taken.add(name)
        return
    mine = taking.setdefault(name, {})
    for key, amount in amounts.items():
        mine[key] = mine.get(key, 0) + amount


def _pick(devices: Sequence[Device], held: Mapping[str, int], consumed: Mapping[str, Mapping[str, int]],
          excluded: AbstractSet[str], alternative: Alternative, types: Mapping[str, str | None], taken: set[str],
          taking: Mapping[str, Mapping[str, int]]) -> list[tuple[str, dict[str, int] | None]] | None:
    """The devices this alternative takes, first fit: (name, what it consumes of a shared one, None
    for a whole one); None when too few pass (allocationMode All: when any device of the class does not)."""
    device_type = types.get(alternative.device_class)
    wants = dict(alternative.capacity)
    picked: list[tuple[str, dict[str, int] | None]] = []
    every = alternative.count == 0
    for device in devices:
        if matches(device, alternative, device_type) is not None:
            continue
        amounts = _usable(device, held, consumed, excluded, wants, taken, taking)
        if not isinstance(amounts, dict):
            if every:
                return None
            continue
        picked.append((device.name, amounts if device.shared else None))
        if not every and len(picked) == alternative.count:
            return picked
    return picked if every and picked else None


def _usable(device: Device, held: Mapping[str, int], consumed: Mapping[str, Mapping[str, int]],
            excluded: AbstractSet[str], wants: Mapping[str, int], taken: AbstractSet[str],
            taking: Mapping[str, Mapping[str, int]]) -> dict[str, int] | bool:
    """What the device gives this request (its consumption), or False."""
    if device.name in excluded or device.name in taken or any(t.effect in BLOCKING_EFFECTS for t in device.taints):
        return False
    if not device.shared and held.get(device.name):
        return False  # deviceInUse
    amounts = consumption(device, wants)
    if amounts is None:
        return False
    if device.shared:
        used, mine = consumed.get(device.name, _NONE), taking.get(device.name, _NONE)
        if any(used.get(c.name, 0) + mine.get(c.name, 0) + amounts[c.name] > c.value for c in device.capacity):
            return False
    return amounts


def why_not(devices: Sequence[Device], held: Mapping[str, int], consumed: Mapping[str, Mapping[str, int]],
            excluded: AbstractSet[str], alternative: Alternative, types: Mapping[str, str | None]) -> dict[str, str]:
    """For `explain`: why each device that cannot serve `alternative` cannot (the others are left out)."""
    reasons: dict[str, str] = {}
    for device in devices:
        why = matches(device, alternative, types.get(alternative.device_class))
        if why is None:
            blocking = [t for t in device.taints if t.effect in BLOCKING_EFFECTS]
            if device.name in excluded:
                why = "kept out by gpu-placement (XID error or reported unhealthy)"
            elif blocking:
                why = f"tainted {blocking[0].text()}"
            elif not device.shared and held.get(device.name):
                why = "held by a claim"
            elif _usable(device, held, consumed, excluded, dict(alternative.capacity), set(), {}) is False:
                why = "not enough of its capacity left" if device.shared else "lacks a capacity asked"
        if why is not None:
            reasons[device.name] = why
    return reasons


def _fill(devices: Sequence[Device], held: Mapping[str, int], consumed: Mapping[str, Mapping[str, int]],
          taken: AbstractSet[str], taking: Mapping[str, Mapping[str, int]], classes: AbstractSet[str],
          types: Mapping[str, str | None]) -> float:
    kinds = {types.get(c) for c in classes}
    total, used = 0, 0.0  # used: a shared device counts by the share in use
    for device in devices:
        if None not in kinds and device.type not in kinds:
            continue
        memory = device.capacity_of("memory")
        size = memory.value if memory is not None else _MIB_MILLI
        total += size
        if device.name in taken or (not device.shared and held.get(device.name)):
            used += size
        elif device.shared:
            used += size * _share_in_use(device, consumed.get(device.name, _NONE), taking.get(device.name, _NONE))
    return min(1.0, used / total) if total else 0.0


def _share_in_use(device: Device, consumed: Mapping[str, int], taking: Mapping[str, int]) -> float:
    """How much of a shared device allocations use, 0..1: by its memory where it publishes one (the
    NVIDIA driver's `--consumable-shares=memory`), else by the fullest of its consumable capacities
    (a driver's own unit of share, as the replay's devices publish `share`)."""
    capacities = [c for c in device.capacity if c.value > 0]
    memory = next((c for c in capacities if c.name == "memory"), None)
    return max((min(1.0, (consumed.get(c.name, 0) + taking.get(c.name, 0)) / c.value)
                for c in ([memory] if memory is not None else capacities)), default=0.0)


def _pad(version: Version) -> Version:
    return (*version, 0, 0, 0)[:3]


def extended_requests(gpus: Sequence[tuple[str, int]], dra_resources: AbstractSet[str],
                      allocatable: Mapping[str, int], extended: Mapping[str, str]) -> tuple[Request, ...]:
    """The requests kube-scheduler's claim for a pod's extended resources asks of a node where they are
    served through DRA (not in its allocatable: extendeddynamicresources.go `filterExtendedResources`):
    per resource, its count of its class's devices (`createRequestsAndMappings`, one request per
    container, the same devices in total)."""
    requests = []
    for resource, count in gpus:
        device_class = extended.get(resource)
        if resource in dra_resources and device_class is not None and not allocatable.get(resource, 0):
            requests.append((Alternative("", device_class, count),))
    return tuple(requests)


def excluded_devices(view: ClusterView, node: str) -> frozenset[str]:
    """The node's devices gpu-placement keeps out, as its DeviceTaintRules do: a recent XID (telemetry,
    by UUID), a pod's report that its device is unhealthy (`allocatedResourcesStatus`), or a launch fence
    on the devices its failed pods named (`ClusterView.fenced_devices`)."""
    reading = view.telemetry.get(node)
    xid = reading.xid_devices if reading is not None else frozenset()
    unhealthy = view.unhealthy_on(node)
    fenced = view.fenced_devices.get(node)
    if not xid and not unhealthy and not fenced:
        return frozenset()
    names = {d.name for d in view.dra.devices_on(node) if d.uuid in xid} if xid else set()
    return frozenset(names | set(unhealthy or ()) | set(fenced or ()))


def fit_on(view: ClusterView, node: str, requests: Sequence[Request]) -> DraFit | None:
    """`fit` against what the view holds of the node now. Call under the view's lock."""
    dra = view.dra
    types = {name: found.device_type for name, found in dra.classes.items()}
    return fit(dra.devices_on(node), dra.used_on(node), dra.consumed_on(node), excluded_devices(view, node),
               requests, types)


def why_not_on(view: ClusterView, node: str, alternative: Alternative) -> dict[str, str]:
    """`why_not` against what the view holds of the node now. Call under the view's lock."""
    dra = view.dra
    types = {name: found.device_type for name, found in dra.classes.items()}
    return why_not(dra.devices_on(node), dra.used_on(node), dra.consumed_on(node), excluded_devices(view, node),
                   alternative, types)


DEVICE_PLUGIN, DRA = "device-plugin", "dra"


def served_by(resource: str, allocatable: Mapping[str, int], devices: Sequence[Device],
              extended: Mapping[str, str], types: Mapping[str, str | None]) -> str | None:
    """How a node serves an extended resource, as kube-scheduler decides it: the device plugin's where its
    allocatable has it (NodeResourcesFit), else through DRA where a class serves it and the node publishes
    devices of that class (extendeddynamicresources.go `filterExtendedResources`: allocatable 0 and a
    class mapped); None: not at all."""
    if allocatable.get(resource, 0):
        return DEVICE_PLUGIN
    device_class = extended.get(resource)
    if device_class is None:
        return None
    return DRA if _of_class(device_class, devices, types) else None


def _of_class(device_class: str, devices: Sequence[Device], types: Mapping[str, str | None]) -> int:
    """How many of `devices` the class selects (by the device type its CEL asks for)."""
    kind = types.get(device_class)
    return sum(1 for d in devices if kind is None or d.type == kind)


def served_on(view: ClusterView, node: str, resources: Sequence[str]) -> dict[str, str]:
    """`served_by` for each resource the node serves either way. Call under the view's lock."""
    facts = view.nodes.get(node)
    dra = view.dra
    types = {name: found.device_type for name, found in dra.classes.items()}
    devices = dra.devices_on(node)
    found = {}
    for resource in resources:
        way = served_by(resource, facts.allocatable if facts else {}, devices, dra.extended, types)
        if way is not None:
            found[resource] = way
    return found


def both_ways_on(view: ClusterView, node: str, resources: Sequence[str]) -> dict[str, tuple[str, int]]:
    """The resources the node serves from the device plugin although it also publishes devices of the class
    that maps them, each with (that class, how many of its devices): kube-scheduler counts such a resource
    against allocatable alone and never takes those devices for it (`filterExtendedResources`); they serve
    claims and the class's implicit name. Call under the view's lock."""
    facts = view.nodes.get(node)
    if facts is None:
        return {}
    dra = view.dra
    types = {name: found.device_type for name, found in dra.classes.items()}
    devices = dra.devices_on(node)
    found = {}
    for resource in resources:
        device_class = dra.extended.get(resource)
        if device_class is not None and facts.allocatable.get(resource, 0):
            count = _of_class(device_class, devices, types)
            if count:
                found[resource] = (device_class, count)
    return found
