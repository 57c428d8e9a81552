"""Namespace annotations → `NamespacePolicy`, parsed once per namespace change.

Each annotation that does not parse gives one sentence naming the annotation, its value, the
namespace, what is wrong and how to write it; the rest of the policy still holds what did parse.

Sharing levels (`Sharing`, `parse_sharing`) live in the core module `gpu_placement.facts.sharing`, so the
extender reads a pod's level with the same parser.
"""

from __future__ import annotations

import difflib
import re
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.base.cuda import Version, parse_version
from gpu_placement.base.quantity import QuantityProblem, to_count, to_mib
from gpu_placement.base.text import MAX_ANNOTATION_VALUE, first_non_ascii, quoted
from gpu_placement.facts.annotation_keys import NAMESPACE_KEYS, unread_namespace_keys
from gpu_placement.facts.namespaces import NamespaceRecord, label_problem
from gpu_placement.facts.sharing import EXCLUSIVE, Sharing, parse_sharing, sharing_of_resource

__all__ = [
    "NAMESPACE_ANNOTATIONS",
    "NamespacePolicy",
    "PolicyCache",
    "Sharing",
    "parse_policy",
    "parse_sharing",
    "pod_annotation_problems",
    "sharing_of_resource",
]

NAMESPACE_ANNOTATIONS = NAMESPACE_KEYS
_MAX_VALUE = MAX_ANNOTATION_VALUE  # our annotations are short lists; the extender refuses the same lengths
_LABEL_VALUE = re.compile(r"[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?", re.ASCII)
_T = TypeVar("_T")
_EXAMPLES = {
    n.ANN_SHARING: "exclusive, shared or mig-1g.10gb",
    n.ANN_QUOTA: "nvidia.com/gpu=4,nvidia.com/gpu.shared=16",
    n.ANN_GPU_MEMORY: "20Gi",
    n.ANN_PRODUCTS: "NVIDIA-H100-80GB-HBM3,NVIDIA-A100-SXM4-80GB",
    n.ANN_CUDA: "12.4",
    n.ANN_MIN_DRIVER: "550.54.15",
    n.ANN_MIN_COMPUTE: "8.0",
    n.ANN_CUDA_COMPAT: "minor",
    n.ANN_ALLOCATION: "device-plugin or dra",
}


@dataclass(slots=True, frozen=True)
class NamespacePolicy:
    namespace: str
    sharing: Sharing = EXCLUSIVE
    quota: Mapping[str, int] | None = None  # None: no quota annotation
    pools: tuple[str, ...] = ()
    gpu_memory: str | None = None  # the namespace default as written (the extender parses the same text)
    gpu_memory_mib: int | None = None
    products: frozenset[str] | None = None
    product_order: tuple[str, ...] = ()  # the products as written: the order of a DRA claim's alternatives
    cuda: Version | None = None
    errors: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # annotation -> sentence
    warnings: tuple[str, ...] = ()
    annotated: bool = False  # any of NAMESPACE_ANNOTATIONS is set (parsed or not): the namespace has a GPU policy
    allocation: str | None = None  # device-plugin or dra as annotated; None: the configuration's dra.allocation

    def mode(self, config: Config) -> str:
        """How GPU pods here get devices: `dra` (ResourceClaims, webhook/dra_claims.py) or `device-plugin`."""
        return self.allocation or config.dra.allocation

    def entitled(self, config: Config) -> bool:
        """May GPU pods run here at all? A quota says yes (up to it); no quota: the default policy."""
        return self.quota is not None or n.ANN_QUOTA in self.errors or config.default_namespace_policy == "allow"

    @property
    def shapes_ok(self) -> bool:
        """The annotations that decide how pods are shaped parsed: /mutate may change pods."""
        errors = self.errors
        return not errors or not _SHAPING & errors.keys()


_SHAPING = frozenset({n.ANN_SHARING, n.ANN_POOLS, n.ANN_ALLOCATION})  # the annotations shapes_ok needs parsed


def parse_policy(record: NamespaceRecord | None, name: str, config: Config) -> NamespacePolicy:
    annotations = record.annotations if record is not None else {}
    where = f"namespace {name}"
    errors: dict[str, str] = {}
    warnings: list[str] = []

    def parsed(key: str, parse: Callable[[str], _T]) -> _T | None:
        """The annotation under `key` parsed; None when absent, or when it does not parse (`errors` says why)."""
        raw = annotations.get(key)
        if raw is None:
            return None
        try:
            return parse(_plain(raw))
        except ValueError as exc:
            errors[key] = _sentence(key, raw, where, exc)
            return None

    # One call each, in this order (the order of `errors`).
    sharing = parsed(n.ANN_SHARING, parse_sharing) or EXCLUSIVE  # a Sharing is never falsy
    quota = parsed(n.ANN_QUOTA, lambda text: _parse_quota(text, config))
    pools = parsed(n.ANN_POOLS, lambda text: _parse_pools(text, config))
    memory = parsed(n.ANN_GPU_MEMORY, _parse_memory)
    products = parsed(n.ANN_PRODUCTS, _parse_products)
    cuda = parsed(n.ANN_CUDA, parse_version)
    allocation = parsed(n.ANN_ALLOCATION, _parse_allocation)
    canary = annotations.get(n.ANN_CANARY)  # read by the extender (docs/rollouts.md); only "true" counts
    if canary is not None and canary not in ("true", "false"):
        warnings.append(f"{n.ANN_CANARY} on {where} is {quoted(canary)}: only \"true\" makes it a canary namespace "
                        "(its pods take new GPU drivers first); write \"true\" or remove it")
    warnings += unread_namespace_keys(annotations, name)  # with the closest key read there
    if record is not None:
        label = label_problem(name, record.labels, config)
        if label is not None:
            warnings.append(label)
    if quota is not None and sharing.kind != "exclusive" and n.GPU_RESOURCE in quota:
        warnings.append(f"{n.ANN_QUOTA} on {where} limits {n.GPU_RESOURCE}, but this namespace's pods ask for "
                        f"{sharing.resource(config)} once rewritten ({n.ANN_SHARING}={sharing.text}): "
                        f"quota {sharing.resource(config)} instead")
    return NamespacePolicy(
        namespace=name, sharing=sharing, quota=quota, pools=pools if pools is not None else (),
        gpu_memory=annotations.get(n.ANN_GPU_MEMORY) if memory is not None else None,
        gpu_memory_mib=memory,
        products=frozenset(products) if products is not None else None,
        product_order=products if products is not None else (), cuda=cuda,
        errors=MappingProxyType(errors), warnings=tuple(warnings),
        annotated=any(key in annotations for key in NAMESPACE_ANNOTATIONS),
        allocation=allocation)


class PolicyCache:
    """Policies by namespace, reparsed only when the view holds a different record for it: the view
    replaces a record on every change, so an identity check is enough on the hot path.

    Namespaces with a record (in the view, or read from the API server: they exist) are kept up to
    `limit`. Names without one cost nothing to parse again and come from whoever reaches the webhook
    (it listens on every interface: a stream of reviews naming random namespaces), so at most
    `unknown_limit` of them are kept, the least recently used going first: that bound does not grow
    with hostile input, and it never pushes out the namespaces that exist."""

    def __init__(self, config: Config, limit: int = 100_000, unknown_limit: int = 1024) -> None:
        self.config = config
        self.limit = limit
        self.unknown_limit = unknown_limit
        self._cache: dict[str, tuple[NamespaceRecord, NamespacePolicy]] = {}
        self._unknown: OrderedDict[str, NamespacePolicy] = OrderedDict()
        self.parses = 0  # for tests and benchmarks: how often we really parsed

    def get(self, name: str, record: NamespaceRecord | None) -> NamespacePolicy:
        if record is None:
            return self._without_record(name)
        cached = self._cache.get(name)
        if cached is not None and (cached[0] is record or cached[0] == record):
            return cached[1]
        policy = parse_policy(record, name, self.config)
        self.parses += 1
        if len(self._cache) >= self.limit:  # namespaces come and go; never grow without bound
            self._cache.clear()
        self._cache[name] = (record, policy)
        self._unknown.pop(name, None)
        return policy

    def __len__(self) -> int:
        return len(self._cache) + len(self._unknown)

    def _without_record(self, name: str) -> NamespacePolicy:
        policy = self._unknown.get(name)
        if policy is not None:
            self._unknown.move_to_end(name)
            return policy
        policy = self._unknown[name] = parse_policy(None, name, self.config)
        self.parses += 1
        if len(self._unknown) > self.unknown_limit:
            self._unknown.popitem(last=False)
        return policy


# -- pod annotations ---------------------------------------------------------------------------------

def pod_annotation_problems(annotations: Mapping[str, str], where: str) -> tuple[Sharing | None, list[str]]:
    """The pod's own sharing ask (None when it sets none or it is broken) and one sentence per pod
    annotation that does not parse. Checked here first, so the core parsers never see hostile text."""
    problems: list[str] = []
    sharing: Sharing | None = None
    raw = annotations.get(n.ANN_SHARING)
    if raw is not None:
        try:
            sharing = parse_sharing(_plain(raw))
        except ValueError as exc:
            problems.append(_sentence(n.ANN_SHARING, raw, where, exc))
    if not annotations:  # most pods: nothing to parse
        return sharing, problems
    for key, parse in _POD_CHECKS:
        raw = annotations.get(key)
        if raw is not None:
            try:
                parse(_plain(raw))
            except ValueError as exc:
                problems.append(_sentence(key, raw, where, exc))
    return sharing, problems


# -- one parser per annotation; each raises ValueError with a phrase ----------------------------------

def _plain(text: str) -> str:
    if len(text) > _MAX_VALUE:
        raise ValueError(f"the value is {len(text)} characters long; keep it under {_MAX_VALUE}")
    odd = first_non_ascii(text)
    if odd:
        raise ValueError(f"it contains {odd}, which is not plain ASCII")
    return text.strip()


def _parse_quota(text: str, config: Config) -> Mapping[str, int]:
    quota: dict[str, int] = {}
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise ValueError("it lists no resource")
    for item in items:
        if not item:
            continue
        resource, equals, amount = (part.strip() for part in item.partition("="))
        if not equals or not resource:
            raise ValueError(f"{quoted(item)} is not resource=count")
        if not config.is_gpu_resource(resource):
            known = ", ".join((*config.gpu_resources, config.shared_resource, "nvidia.com/mig-<profile>"))
            raise ValueError(f"{quoted(resource)} is not a GPU resource (GPU resources: {known})")
        if resource in quota:
            raise ValueError(f"{resource} is listed twice")
        try:
            quota[resource] = to_count(amount)
        except QuantityProblem as exc:
            raise ValueError(str(exc)) from None
    return MappingProxyType(quota)


def _parse_pools(text: str, config: Config) -> tuple[str, ...]:
    """The pools named; the sentence's fix names only pools the configuration has (the closest one to
    a misspelt name), or says to define one when it has none."""
    pools = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    known = sorted(config.pools)
    if not known:
        fix = "define the pool under pools in gpu-placement's configuration, or remove the annotation"
    if not pools:
        raise ValueError(f"it names no pool; {f'write it as {known[0]}' if known else fix}")
    unknown = [pool for pool in pools if pool not in config.pools]
    if unknown:
        named = ", ".join(quoted(p) for p in unknown)
        if not known:
            raise ValueError(f"no pool named {named} in the configuration (the configuration defines no pools); {fix}")
        closest = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f"write it as {closest[0]}" if closest else f"write it as one or more of {', '.join(known)}"
        raise ValueError(f"no pool named {named} in the configuration (pools: {', '.join(known)}); {hint}")
    return pools


def _parse_memory(text: str) -> int:
    try:
        return to_mib(text)  # refuses less than 1Mi: plain numbers are bytes, and "16384" is a trap
    except QuantityProblem as exc:
        raise ValueError(str(exc)) from None


def _parse_products(text: str) -> tuple[str, ...]:
    """The products in the order written, each once (a DRA namespace's claims try them in that order)."""
    products = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    if not products:
        raise ValueError("it lists no product")
    for product in products:
        if not _LABEL_VALUE.fullmatch(product):
            raise ValueError(f"{quoted(product)} is not an nvidia.com/gpu.product label value")
    return products


def _parse_allocation(text: str) -> str:
    if text not in ("device-plugin", "dra"):
        raise ValueError(f"{quoted(text)} is not device-plugin or dra")
    return text


def _parse_compat(text: str) -> str:
    if text not in ("", "minor", "none"):
        raise ValueError(f"{quoted(text)} is not minor or none")
    return text


# The pod annotations pod_annotation_problems parses beside the sharing ask, each with its parser, in that order.
_POD_CHECKS: tuple[tuple[str, Callable[[str], object]], ...] = (
    (n.ANN_GPU_MEMORY, _parse_memory), (n.ANN_PRODUCTS, _parse_products), (n.ANN_CUDA, parse_version),
    (n.ANN_MIN_DRIVER, parse_version), (n.ANN_MIN_COMPUTE, parse_version), (n.ANN_CUDA_COMPAT, _parse_compat))


def _sentence(key: str, raw: str, where: str, exc: Exception) -> str:
    example = _EXAMPLES.get(key)
    fix = f"; write it as {example}" if example else ""
    return f"{key}={quoted(raw)} on {where}: {exc}{fix}"
