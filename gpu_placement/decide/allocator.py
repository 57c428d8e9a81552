"""Which devices of one node kube-scheduler's DRA allocator gives a claim: its choice, foreseen.

gpu-placement picks the node; inside it the allocator picks the devices, and it does so first fit.
This is the allocator of k8s.io/dynamic-resource-allocation v0.37.2 (Kubernetes 1.37), variant
`incubating` (structured/internal/incubating/allocator_incubating.go): with the default feature gates
of 1.37 (DRAConsumableCapacity and DRAFractionalCapacityRange beta and on, no alpha DRA gate) it is the
first of stable/incubating/experimental whose `SupportedFeatures` cover the enabled ones
(structured/allocator.go `NewAllocator`). What it does, as followed here:

- `allocateOne` walks pools sorted by driver and pool name (pools_incubating.go `GatherPools`,
  `sortPoolsByID`), their slices sorted by name (`buildPool`, `sortSlicesByName`), and each slice's
  devices in the order the slice lists them; the first device that passes is taken, then the search for
  the request's next device starts after it. Requests are served in the claim's order; when a later one
  cannot be served, the earlier ones are tried on their next devices (backtracking).
- A device passes when it is not in use (`deviceInUse`: an allocated claim or this claim holds it;
  never for an `allowMultipleAllocations` device, which is shared by capacity instead), its class
  selects it (here: the class's device `type`, as `DeviceClass.device_type` reads its CEL selector),
  no NoSchedule/NoExecute taint blocks it (`taintPreventsAllocation`; tolerations are not foreseen),
  and its capacity holds the request (`CmpRequestOverCapacity`, consumable_capacity.go): every
  capacity the request names must exist on the device; each capacity consumes the amount asked,
  rounded up by the capacity's requestPolicy (`calculateConsumedCapacity`: validRange min/step,
  validValues), or, when not asked, the policy's default, else all of it (`fillEmptyRequest`); the
  amount must obey the policy (`violatesPolicy`) and, added to what allocated claims and this claim
  already consume (`AggregatedCapacity`, `allocatingCapacity`), stay within the capacity.

Not modelled: CEL selectors of the claim or class beyond the device type, match-attribute constraints,
firstAvailable subrequests, admin access, partitionable devices' counters, binding conditions. The
replay's claims use none of them; `gpu-placement explain` names a claim's own selectors.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpu_placement.base.names import BLOCKING_EFFECTS
from gpu_placement.decide.dra_fit import consumption
from gpu_placement.facts.dra import Ask, Device

__all__ = ["Allocation", "consumption", "first_fit"]  # consumption: dra_fit.py's, the one count of capacity

_NONE: Mapping[str, int] = {}
_NO_TYPES: Mapping[str, str | None] = {}


@dataclass(slots=True, frozen=True)
class Allocation:
    """One device given to one request: its name and what it consumes there (shareable devices only)."""

    request: int  # index of the request in the claim's asks
    device: str
    consumed: tuple[tuple[str, int], ...] = ()


def _fits(device: Device, amounts: Mapping[str, int], used: Mapping[str, int], taking: Mapping[str, int]) -> bool:
    return all(used.get(c.name, 0) + taking.get(c.name, 0) + amounts[c.name] <= c.value for c in device.capacity)


def first_fit(devices: Sequence[Device], held: Mapping[str, int], consumed: Mapping[str, Mapping[str, int]],
              asks: Sequence[Ask], types: Mapping[str, str | None] = _NO_TYPES) -> list[Allocation] | None:
    """The devices the allocator gives a claim with these `asks` on a node whose devices, in allocation
    order, are `devices`; `held`: device -> allocated claims holding it; `consumed`: device -> capacity ->
    milli-units allocated claims consume; `types`: class -> the device type it selects. None: the claim
    does not fit the node."""
    taken: dict[str, int] = {}  # non-shareable devices this claim holds
    taking: dict[str, dict[str, int]] = {}  # shareable devices: what this claim consumes so far
    result: list[Allocation] = []

    def take(request: int, device: Device, wants: Mapping[str, int]) -> bool:
        """allocateDevice: the device for this request, if it passes; recorded in `result`."""
        kind = types.get(asks[request][0])
        if (kind is not None and device.type != kind) or any(t.effect in BLOCKING_EFFECTS for t in device.taints):
            return False
        if not device.shared and (held.get(device.name, 0) or taken.get(device.name)):
            return False  # deviceInUse
        amounts = consumption(device, wants)
        mine = taking.get(device.name, _NONE)
        if amounts is None or not _fits(device, amounts, consumed.get(device.name, _NONE) if device.shared else _NONE,
                                        mine):
            return False
        if device.shared:
            taking[device.name] = {n: mine.get(n, 0) + amounts.get(n, 0) for n in amounts}
        else:
            taken[device.name] = 1
        result.append(Allocation(request, device.name, tuple(sorted(amounts.items())) if device.shared else ()))
        return True

    def give_back() -> None:
        allocation = result.pop()
        if allocation.consumed:
            mine = taking[allocation.device]
            for name, amount in allocation.consumed:
                mine[name] -= amount
            if not any(mine.values()):
                del taking[allocation.device]
        else:
            taken.pop(allocation.device, None)

    def place(request: int, start: int, left: int) -> bool:
        """allocateOne: device `left` more of request `request`, searching from device index `start`."""
        if request >= len(asks):
            return True
        device_class, count, wanted = asks[request]
        wants = dict(wanted)
        if count == 0:  # allocationMode All: every device of the class, or nothing
            chosen = [d for d in devices if types.get(device_class) in (None, d.type)]
            done = 0
            for device in chosen:
                if not take(request, device, wants):
                    break
                done += 1
            if chosen and done == len(chosen) and place(request + 1, 0, _count(asks, request + 1)):
                return True
            for _ in range(done):
                give_back()
            return False
        if left == 0:
            return place(request + 1, 0, _count(asks, request + 1))
        for index in range(start, len(devices)):
            if not take(request, devices[index], wants):
                continue
            if place(request, index + 1, left - 1):
                return True
            give_back()  # backtrack: what follows found nothing with this device
        return False

    return result if place(0, 0, _count(asks, 0)) else None


def _count(asks: Sequence[Ask], request: int) -> int:
    return asks[request][1] if request < len(asks) else 0
