"""A GPU pod of a `dra` namespace (gpu-placement.io/allocation: dra) turned into a pod with ResourceClaims.

The pod is written the usual way (`nvidia.com/gpu: 2`, maybe `gpu-placement.io/sharing: shared`);
/mutate removes every GPU resource from its containers and gives each container claims from the
ResourceClaimTemplates the service keeps in the namespace (gpu_placement/controllers/templates.py,
gpu_placement/decide/claims.py), one claim per device, so the namespace's policy (class, products,
driver for its CUDA, device memory, sharing) travels in the template, not in the tenant's manifest.

Admission writes nothing: a template that is not in the view yet (a namespace switched to `dra` a
moment ago) leaves the pod as it is, and /validate refuses it with a retriable 503
(`TemplatePending`). The patch is idempotent: a converted pod asks for no GPU resource, and its
claims name our templates, which /mutate's claim route records with the same `admitted` value.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpu_placement.base import names as n
from gpu_placement.base.config import Config, Pool
from gpu_placement.decide.claims import (
    ClaimPlan,
    Template,
    claim_policy,
    dra_level,
    level_of,
    plan,
    template_for,
)
from gpu_placement.facts.dra import Claim
from gpu_placement.facts.pods import GpuRequests
from gpu_placement.facts.policy import NamespacePolicy
from gpu_placement.facts.sharing import Sharing, standin_of
from webhook.patches import Patch, claim_patch, escape

__all__ = ["TEMPLATE_PENDING", "Conversion", "convert", "missing_sentence", "template_claims"]

TEMPLATE_PENDING = "TemplatePending"
_IMPLICIT_EXTENDED = n.IMPLICIT_CLASS_PREFIX  # every DeviceClass's implicit extended resource


@dataclass(slots=True, frozen=True)
class Conversion:
    """What /mutate does to a GPU pod of a `dra` namespace: `ops`, or (`missing` set) nothing yet."""

    ops: Patch
    plan: ClaimPlan | None
    missing: tuple[Template, ...] = ()  # templates the pod needs that the view does not hold (yet)


def convert(pod: Mapping[str, Any], gpus: GpuRequests, level: Sharing, policy: NamespacePolicy, pools: Sequence[Pool],
            templates: Mapping[str, Claim], config: Config, keep_scheduler: bool = False,
            mapped: frozenset[str] | None = None, shares: bool = False) -> Conversion:
    """The patch that gives a GPU pod claims instead of GPU resources. `level`: the pod's sharing (its
    own narrower ask or the namespace's); `templates`: the view's, by namespace/name. `mapped`: the
    extended resources DeviceClasses name; not None where the pod is to carry stand-ins (`_standins`).
    `shares`: some device is shared by memory (the `shared` template asks a share of one)."""
    spec: Mapping[str, Any] = pod.get("spec") or {}
    namespace = policy.namespace
    wanted = claim_policy(policy, shares)
    levels = {resource: template_for(namespace, dra_level(level_of(resource, level, config), policy.sharing), wanted,
                                     config)
              for resource, _ in gpus}
    missing = tuple(t for t in {t.name: t for t in levels.values()}.values()
                    if (found := templates.get(f"{namespace}/{t.name}")) is None or found.digest != t.digest)
    if missing:
        return Conversion([], None, missing)
    taken = [str(entry.get("name")) for entry in spec.get("resourceClaims") or () if isinstance(entry, Mapping)]
    claims = plan(spec, levels, config.is_gpu_resource, taken)
    ops: Patch = []
    _remove_resources(spec, config, ops)
    for field, index, names in claims.containers:
        _add_claims(spec, field, index, names, ops)
    entries = [{"name": name, "resourceClaimTemplateName": template.name} for name, template in claims.claims]
    if "resourceClaims" in spec:
        ops.extend({"op": "add", "path": "/spec/resourceClaims/-", "value": entry} for entry in entries)
    else:
        ops.append({"op": "add", "path": "/spec/resourceClaims", "value": entries})
    if mapped is not None and _carries_standins(spec, config, keep_scheduler, mapped):
        counts: dict[str, int] = {}
        for _, template in claims.claims:
            counts[standin_of(template.level)] = counts.get(standin_of(template.level), 0) + 1
        _add_standins(spec, counts, ops)
    classes = sorted({template.device_class for _, template in claims.claims})
    # The same route and record /mutate gives a pod with claims (patches.claim_patch), so that a second
    # call on the converted pod, which then takes that route, patches nothing.
    ops += claim_patch(pod, classes, pools, config, keep_scheduler)
    return Conversion(ops, claims)


def missing_sentence(missing: Iterable[Template], where: str) -> str:
    names = ", ".join(f"{t.namespace}/{t.name} ({t.level.text})" for t in missing)
    return (f"{where} is in a namespace whose GPUs are claimed through DRA ({n.ANN_ALLOCATION}=dra), and the "
            f"ResourceClaimTemplate it needs is not there yet ({names}): gpu-placement creates it from the namespace's "
            "annotations within seconds of a change; create the pod again in a few seconds")


def template_claims(spec: Mapping[str, Any]) -> int:
    """How many claims kube-controller-manager makes for the pod: one per entry naming a template."""
    return sum(1 for entry in spec.get("resourceClaims") or ()
               if isinstance(entry, Mapping) and entry.get("resourceClaimTemplateName"))


def _remove_resources(spec: Mapping[str, Any], config: Config, ops: Patch) -> None:
    for field in ("initContainers", "containers"):
        for index, container in enumerate(spec.get(field) or ()):
            resources: Mapping[str, Any] = container.get("resources") or {}
            for section in ("requests", "limits"):
                values: Mapping[str, Any] = resources.get(section) or {}
                for resource in sorted(values):
                    if config.is_gpu_resource(resource):
                        ops.append({"op": "remove",
                                    "path": f"/spec/{field}/{index}/resources/{section}/{escape(resource)}"})


def _add_claims(spec: Mapping[str, Any], field: str, index: int, names: Sequence[str], ops: Patch) -> None:
    container: Mapping[str, Any] = spec[field][index]
    entries = [{"name": name} for name in names]
    base = f"/spec/{field}/{index}/resources"
    resources = container.get("resources")
    if resources is None:
        ops.append({"op": "add", "path": base, "value": {"claims": entries}})
    elif resources.get("claims") is None:
        ops.append({"op": "add", "path": f"{base}/claims", "value": entries})
    else:
        ops.extend({"op": "add", "path": f"{base}/claims/-", "value": entry} for entry in entries)


def _carries_standins(spec: Mapping[str, Any], config: Config, keep_scheduler: bool, mapped: frozenset[str]) -> bool:
    """Stand-ins go only on a pod of gpu-placement's scheduler, whose profile ignores them for node fit
    (another scheduler would find no node with them), and only when the pod asks for no extended
    resource a DeviceClass names: kube-scheduler's DynamicResources plugin then checks every extended
    resource of the pod and finds no node or class for a stand-in (extendeddynamicresources.go
    `filterExtendedResources`, v1.37.2)."""
    scheduler = spec.get("schedulerName") or ""
    if scheduler != config.scheduler_name and (keep_scheduler or scheduler not in ("", "default-scheduler")):
        return False
    for field in ("initContainers", "containers"):
        for container in spec.get(field) or ():
            resources: Mapping[str, Any] = container.get("resources") or {}
            for section in ("requests", "limits"):
                for resource in resources.get(section) or {}:  # its GPU resources go (`_remove_resources`)
                    if not config.is_gpu_resource(resource) and (resource in mapped or
                                                                 resource.startswith(_IMPLICIT_EXTENDED)):
                        return False
    return bool(spec.get("containers"))


def _add_standins(spec: Mapping[str, Any], counts: Mapping[str, int], ops: Patch) -> None:
    """The stand-ins on the first app container, in requests and limits (an extended resource takes no
    overcommit: core validation wants both, equal), after the ops that removed its GPU resources and
    gave it claims (which may have created its `resources`)."""
    wanted = {standin: str(count) for standin, count in sorted(counts.items())}
    base = "/spec/containers/0/resources"
    resources = spec["containers"][0].get("resources")
    if resources is None and not any(op["path"] == base for op in ops):
        ops.append({"op": "add", "path": base, "value": {"requests": dict(wanted), "limits": dict(wanted)}})
        return
    for section in ("requests", "limits"):
        values = (resources or {}).get(section)
        if values is None:
            ops.append({"op": "add", "path": f"{base}/{section}", "value": dict(wanted)})
            continue
        ops.extend({"op": "replace" if standin in values else "add", "path": f"{base}/{section}/{escape(standin)}",
                    "value": value} for standin, value in wanted.items())
