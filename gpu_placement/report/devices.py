"""DRA devices for people: `nodes` lists each node's devices with their taints (the driver's own and
the one gpu-placement keeps), `explain` which devices a pod's claims could take on the nodes that pass.

"Could take" is what the allocator checks that the view knows: the device's type is the one its
class selects, no NoSchedule/NoExecute taint the claim does not tolerate, not held by another claim
(unless the claim has admin access). CEL selectors of the claim itself are the allocator's to
evaluate; the row says when there are some.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from gpu_placement.base.config import Config
from gpu_placement.base.cuda import format_version
from gpu_placement.controllers.dra_taints import TAINT_KEY, desired_rules
from gpu_placement.decide.requirements import Requirements
from gpu_placement.facts.dra import Claim, Device, Taint
from gpu_placement.view.cluster import ClusterView

__all__ = ["CANDIDATE_HEADER", "DEVICE_HEADER", "candidate_rows", "device_rows"]

DEVICE_HEADER = ["NODE", "DEVICE", "TYPE", "PRODUCT", "DRIVER", "MEM MiB", "HELD", "TAINTS"]
CANDIDATE_HEADER = ["NODE", "COULD TAKE", "WHY NOT THE OTHERS"]


def device_rows(view: ClusterView, config: Config) -> list[list[str]]:
    """One row per device of the configured driver; TAINTS: the driver's own, then gpu-placement's
    (what its controller keeps for the node now)."""
    rows = []
    with view.lock:
        for node in view.dra.nodes():
            ours: dict[str | None, Taint] = {}
            rules, held = desired_rules(view, config, node)
            for rule in rules:
                ours[rule.device] = Taint(TAINT_KEY, rule.reason, rule.effect)
            used = view.dra.used_on(node)
            for device in view.dra.devices_on(node):
                taints = [t.text() for t in device.taints]
                mine = ours.get(device.name) or ours.get(None)
                if mine is not None:
                    taints.append(f"{mine.text()} (gpu-placement)")
                elif held:
                    taints.append("none from gpu-placement while the validator waits for a device")
                rows.append([node, device.name, device.profile or device.type or "-", device.product or "-",
                             format_version(device.driver) if device.driver else "-",
                             str(device.memory_mib) if device.memory_mib is not None else "-",
                             str(used.get(device.name, 0)), ", ".join(taints) or "-"])
    return rows


def _tolerated(taint: Taint, claims: Iterable[Claim]) -> bool:
    for claim in claims:
        for key, operator, value, effect in claim.tolerations:  # resourceclaim.ToleratesTaint's rule
            if effect not in ("", taint.effect) or key not in ("", taint.key):
                continue
            if operator == "Exists" or (key == taint.key and value == taint.value):
                return True
    return False


def _why_not(device: Device, types: set[str | None], held: int, claims: Sequence[Claim],
             ours: Taint | None) -> str | None:
    if types and device.type not in types:
        return f"type {device.type}"
    blocking = [t for t in (*device.taints, *((ours,) if ours else ())) if t.blocks and not _tolerated(t, claims)]
    if blocking:
        return f"tainted {blocking[0].text()}"
    if held and not any(c.admin for c in claims):
        return "held by another claim"
    return None


def candidate_rows(view: ClusterView, config: Config, req: Requirements, namespace: str, spec: dict[str, Any],
                   nodes: Sequence[str]) -> list[list[str]]:
    """For a DRA pod: on each node given (those that pass), the devices its claims could take."""
    if not req.claims:
        return []
    rows = []
    with view.lock:
        claims = [c for c in (_claim_of(view, namespace, entry) for entry in spec.get("resourceClaims") or ())
                  if c is not None]
        types = {view.dra.classes[name].device_type for name in req.claims if name in view.dra.classes}
        types.discard(None)
        selectors = sum(c.selectors for c in claims)
        for node in nodes:
            rules, _ = desired_rules(view, config, node)
            ours = {rule.device: Taint(TAINT_KEY, rule.reason, rule.effect) for rule in rules}
            used = view.dra.used_on(node)
            could, reasons = [], []
            for device in view.dra.devices_on(node):
                why = _why_not(device, types, used.get(device.name, 0), claims, ours.get(device.name) or ours.get(None))
                if why is None:
                    could.append(device.name)
                else:
                    reasons.append(f"{device.name}: {why}")
            extra = f" (then the claim's {selectors} CEL selector(s))" if selectors and could else ""
            rows.append([node, (", ".join(could) or "none") + extra, "; ".join(reasons) or "-"])
    return rows


def _claim_of(view: ClusterView, namespace: str, entry: object) -> Claim | None:
    if not isinstance(entry, dict):
        return None
    if entry.get("resourceClaimName"):
        return view.dra.claims.get(f"{namespace}/{entry['resourceClaimName']}")
    if entry.get("resourceClaimTemplateName"):
        return view.dra.templates.get(f"{namespace}/{entry['resourceClaimTemplateName']}")
    return None
