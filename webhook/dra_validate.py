"""ResourceClaims and ResourceClaimTemplates written by hand in a namespace with a GPU policy, held to
the policy the namespace's own templates carry (gpu_placement/controllers/templates.py): the device class its
sharing allows, its products, and no more devices in one claim than its quota gives.

Each problem names the field (`spec.devices.requests[0].exactly.deviceClassName`) and what to write
instead. Selectors are CEL, which is not evaluated here: a namespace with `gpu-placement.io/gpu-products`
requires each request (each `firstAvailable` alternative) to carry a products selector of the form its
templates carry (`productName.replace(' ', '-') in [...]`) listing only products the namespace allows,
so the allocator is the one that holds the line. Claims the resourceclaim controller makes from a
template were checked when the template was written, and pass the same way.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import orjson

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.decide.claims import claim_policy, device_hard, product_selector, template_for
from gpu_placement.decide.dra_fit import parse_selectors
from gpu_placement.facts.dra import DeviceClass
from gpu_placement.facts.policy import NamespacePolicy
from gpu_placement.facts.sharing import SHARED

__all__ = ["CLAIM_KINDS", "CLAIM_OUTSIDE_POLICY", "claim_problems"]

CLAIM_OUTSIDE_POLICY = "ClaimOutsidePolicy"
CLAIM_KINDS = {"resourceclaims": "ResourceClaim", "resourceclaimtemplates": "ResourceClaimTemplate"}
_ALL_DEVICES = 32  # resourceapi.AllocationResultsMaxSize: what quota charges allocationMode All


def claim_problems(obj: Mapping[str, Any], resource: str, policy: NamespacePolicy, config: Config,
                   classes: Mapping[str, DeviceClass] | None = None) -> list[str]:
    """What in a claim (or a template's claim) the namespace's policy does not allow; [] when it may.
    `classes`: the view's DeviceClasses (a class's two names are one count in the quota)."""
    spec = obj.get("spec") if isinstance(obj, Mapping) else None
    if resource == "resourceclaimtemplates":
        spec = spec.get("spec") if isinstance(spec, Mapping) else None
        prefix = "spec.spec.devices.requests"
    else:
        prefix = "spec.devices.requests"
    meta = obj.get("metadata") or {}
    where = f"{CLAIM_KINDS[resource]} {policy.namespace}/{meta.get('name') or meta.get('generateName') or ''}"
    gpu_classes = set(config.dra.device_classes)
    level = policy.sharing
    products = claim_policy(policy)
    # The selector to suggest: the namespace's products, the form its templates carry.
    wanted_products = product_selector(config.dra.driver, products.products) if products.products else None
    quota = device_hard(policy.quota, config, classes) if policy.quota is not None else None
    # `shared` through DRA: the GPU class with the opaque GpuConfig the namespace's shared template carries.
    shared = template_for(policy.namespace, SHARED, products, config)
    shared_config = {"driver": config.dra.driver, "parameters": dict(shared.config or {})}
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    configs = [c.get("opaque") for c in (devices.get("config") or () if isinstance(devices, Mapping) else ())
               if isinstance(c, Mapping)]
    problems: list[str] = []
    for path, request in _requests(spec, prefix):
        device_class = request.get("deviceClassName")
        if device_class not in gpu_classes or request.get("adminAccess") is True:
            continue  # a monitor's admin access takes no device: its charge has room of its own (dra_quota.py)
        if level.kind != "exclusive" and not (level.kind == "mig" and device_class == config.dra.mig_class) and not (
                level == SHARED and device_class == config.dra.gpu_class and shared_config in configs):
            fix = ("add the opaque configuration of namespace's shared level: {driver: "
                   f"{config.dra.driver}, parameters: {orjson.dumps(shared.config).decode()}}}, or use a template of "
                   "gpu-placement's in this namespace") if level == SHARED else (
                f"ask {config.dra.mig_class} with profile {level.profile}")
            problems.append(f"{where}: {path}.deviceClassName is {device_class}, more than namespace "
                            f"{policy.namespace} gives ({n.ANN_SHARING}={level.text}): {fix}")
        expressions = tuple(str((s.get("cel") or {}).get("expression") or "") for s in request.get("selectors") or ()
                            if isinstance(s, Mapping))
        named = parse_selectors(expressions).products
        if wanted_products is not None and (named is None or not named <= set(products.products)):
            problems.append(f"{where}: {path}.selectors lacks the products selector of namespace "
                            f"{policy.namespace} ({n.ANN_PRODUCTS}={','.join(products.products)}): add "
                            f"{{cel: {{expression: \"{wanted_products}\"}}}} (or one listing fewer of them)")
        key = f"{device_class}.deviceclass.resource.k8s.io/devices"
        if quota is not None:
            allowed = int(quota.get(key, "0"))
            asked = _ALL_DEVICES if request.get("allocationMode") == "All" else int(request.get("count") or 1)
            if asked > allowed:
                field = "allocationMode" if request.get("allocationMode") == "All" else "count"
                problems.append(f"{where}: {path}.{field} asks {asked} devices of {device_class}, more than namespace "
                                f"{policy.namespace}'s quota of {allowed} ({n.ANN_QUOTA}): ask for at most {allowed}")
    return problems


def _requests(spec: Any, prefix: str) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(field path, request or alternative) for every device request, v1 and v1beta2 shapes."""
    devices = spec.get("devices") if isinstance(spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    for i, request in enumerate(requests if isinstance(requests, list) else ()):
        if not isinstance(request, Mapping):
            continue
        if isinstance(request.get("exactly"), Mapping):
            yield f"{prefix}[{i}].exactly", request["exactly"]
        for j, alternative in enumerate(request.get("firstAvailable") or ()):
            if isinstance(alternative, Mapping):
                yield f"{prefix}[{i}].firstAvailable[{j}]", alternative
