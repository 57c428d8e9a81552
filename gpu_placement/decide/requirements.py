"""What a pod needs from a node: GPU resources, memory per device, CUDA, driver, compute, product.

Each comes from the pod's annotation, else its namespace's default; CUDA also from what the images
need (`NVIDIA_REQUIRE_CUDA`, an NGC framework release, a CUDA image tag: see `cudaneed`), unless the
pod's own `gpu-placement.io/cuda` says otherwise. A `Requirements` is hashable: the placement cache keys on
it, so pods that need the same thing share one precomputed verdict per node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.base.cuda import NgcTable, Version, format_version, parse_version
from gpu_placement.base.quantity import QuantityError, quantity_to_mib
from gpu_placement.base.text import MAX_ANNOTATION_VALUE, quoted
from gpu_placement.facts.cudaneed import CudaNeed, container_need, ngc_unlisted
from gpu_placement.facts.dra import Ask, Request
from gpu_placement.facts.namespaces import NamespaceRecord
from gpu_placement.facts.pods import GpuRequests, effective_gpu_requests
from gpu_placement.facts.sharing import EXCLUSIVE, Sharing, narrowed, parse_sharing

if TYPE_CHECKING:
    from gpu_placement.view.dra import DraState

__all__ = ["AnnotationError", "Requirements", "Unchecked", "infer_cuda", "parse_memory", "requirements_for",
           "unchecked_cuda"]


class AnnotationError(ValueError):
    """An annotation whose value does not parse; the message names annotation, value and owner."""


@dataclass(slots=True, frozen=True)
class Requirements:
    gpus: GpuRequests = ()
    memory_mib: int | None = None
    memory_source: str = ""
    cuda: Version | None = None
    cuda_source: str = ""
    cuda_compat: bool = False
    min_driver: Version | None = None
    min_compute: Version | None = None
    products: frozenset[str] | None = None
    sharing: str = "exclusive"  # the pod's sharing level (namespace's, narrowed by the pod): exclusive, shared, mig-<p>
    image_cuda: CudaNeed | None = None  # what the images need, as the container runtime reads it
    error: str | None = None  # a broken annotation or request: no node can be chosen until it is fixed
    claims: tuple[str, ...] = ()  # GPU device classes its ResourceClaims request (DRA: gpu_placement.dra)
    dra_resources: frozenset[str] = frozenset()  # of `gpus`, those a DeviceClass serves where a node lacks them
    canary: bool = False  # its namespace has gpu-placement.io/canary: "true": takes soaking drivers first
    # Its claims' requests the allocator has yet to serve (alternatives in order): the DRA fit
    # (gpu_placement/decide/dra_fit.py) and the score by the first alternative that fits.
    dra_requests: tuple[Request, ...] = ()
    cpu_milli: int = 0  # CPU asked, rounded up (gpu_placement.decide.fragmentation); 0 unless that strategy scores

    @property
    def dra_asks(self) -> tuple[Ask, ...]:
        """What the allocator will take, as the fragmentation score foresees it: each request's first
        alternative (a `firstAvailable` list's later ones are tried only where the first fails)."""
        return tuple(request[0].ask for request in self.dra_requests if request)

    @property
    def wants_gpu(self) -> bool:
        return bool(self.gpus) or bool(self.claims) or self.error is not None

    def describe(self) -> str:
        asked = [f"{count}x {res}" + (" (or DRA)" if res in self.dra_resources else "") for res, count in self.gpus]
        asked += [f"a ResourceClaim for {cls}" for cls in self.claims]
        parts = [", ".join(asked) or "no GPU"]
        if self.memory_mib is not None:
            parts.append(f"{self.memory_mib} MiB per device ({self.memory_source})")
        if self.cuda is not None:
            parts.append(f"CUDA >= {format_version(self.cuda)} ({self.cuda_source}, "
                         f"{'minor-version compatible' if self.cuda_compat else 'strict'})")
        if self.image_cuda is not None:
            parts.append(self.image_cuda.describe())
        if self.min_driver is not None:
            parts.append(f"driver >= {format_version(self.min_driver)}")
        if self.min_compute is not None:
            parts.append(f"compute capability >= {format_version(self.min_compute)}")
        if self.products:
            parts.append("product in " + ",".join(sorted(self.products)))
        parts.append(f"sharing {self.sharing}")
        if self.canary:
            parts.append("canary (takes new drivers first)")
        return "; ".join(parts)


def requirements_for(pod: Mapping[str, Any], namespace: NamespaceRecord | None,
                     is_gpu_resource: Callable[[str], bool], dra: DraState | None = None,
                     ngc: NgcTable | None = None) -> Requirements:
    """`ngc`: the NGC releases known (the built-in table when None; the configuration's adds ngcReleases)."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    where = f"pod {meta.get('namespace') or 'default'}/{meta.get('name') or meta.get('generateName') or '?'}"
    try:
        gpus = effective_gpu_requests(spec, is_gpu_resource)
    except QuantityError as exc:
        return Requirements(error=f"BadRequest: a GPU request of {where} is not a quantity: {exc}")
    claims: tuple[str, ...] = ()
    dra_requests: tuple[Request, ...] = ()
    dra_resources: frozenset[str] = frozenset()
    if dra is not None:
        if spec.get("resourceClaims"):
            found = dra.pod_claims(str(meta.get("namespace") or "default"), spec)
            if found.missing is not None:
                return Requirements(gpus, error=f"UnknownClaim: {where} uses {found.missing}, which is not in "
                                                "gpu-placement's view yet (just created, or deleted); kube-scheduler "
                                                "retries the pod")
            claims, dra_requests = found.classes, found.requests
        if gpus:
            dra_resources = dra.backed(res for res, _ in gpus)
    if not gpus and not claims:
        return Requirements()
    pod_ann: Mapping[str, str] = meta.get("annotations") or {}
    ns_ann: Mapping[str, str] = namespace.annotations if namespace else {}
    ns_where = f"namespace {namespace.name}" if namespace else ""
    try:
        memory, memory_source = _first(pod_ann, ns_ann, n.ANN_GPU_MEMORY, where, ns_where, parse_memory)
        compat = pod_ann.get(n.ANN_CUDA_COMPAT, "")
        if compat not in ("", "minor", "none"):
            raise AnnotationError(f"{n.ANN_CUDA_COMPAT}={quoted(compat)} on {where}: use \"minor\" or remove it")
        # The pod's own annotation decides alone (strict unless cuda-compat: minor). Otherwise the
        # namespace default is a strict floor and the images' own need holds beside it.
        cuda, cuda_source = _first(pod_ann, ns_ann, n.ANN_CUDA, where, ns_where, parse_version)
        image_cuda = infer_cuda(spec, compat != "none", ngc) if cuda_source != "pod annotation" else None
        min_driver, _ = _first(pod_ann, {}, n.ANN_MIN_DRIVER, where, "", parse_version)
        min_compute, _ = _first(pod_ann, {}, n.ANN_MIN_COMPUTE, where, "", parse_version)
        products, _ = _first(pod_ann, ns_ann, n.ANN_PRODUCTS, where, ns_where, _parse_products)
        level, _ = _first({}, ns_ann, n.ANN_SHARING, where, ns_where, _parse_sharing)
        asked, _ = _first(pod_ann, {}, n.ANN_SHARING, where, "", _parse_sharing)
    except AnnotationError as exc:
        return Requirements(gpus=gpus, error=f"BadAnnotation: {exc}", claims=claims)
    level = narrowed(level or EXCLUSIVE, asked)
    return Requirements(gpus, memory, memory_source, cuda, cuda_source, compat == "minor",
                        min_driver, min_compute, products, level.text, image_cuda, None, claims, dra_resources,
                        canary=ns_ann.get(n.ANN_CANARY) == "true", dra_requests=dra_requests)


def _first(pod_ann: Mapping[str, str], ns_ann: Mapping[str, str], key: str, where: str, ns_where: str,
           parse: Callable[[str], Any]) -> tuple[Any, str]:
    for given, owner, source in ((pod_ann, where, "pod annotation"),
                                       (ns_ann, ns_where, "namespace default")):
        raw = given.get(key)
        if raw is not None:
            # The one place annotation text enters a reason: quoted and cut here (every node repeats
            # it), the parsers' own messages quote through the same helper.
            if len(raw) > MAX_ANNOTATION_VALUE:
                raise AnnotationError(f"{key}={quoted(raw)} on {owner}: the value is {len(raw)} characters long; "
                                      f"keep it under {MAX_ANNOTATION_VALUE}")
            try:
                return parse(raw), source
            except (ValueError, QuantityError) as exc:
                raise AnnotationError(f"{key}={quoted(raw)} on {owner}: {exc}") from None
    return None, ""


def parse_memory(text: str) -> int:
    return quantity_to_mib(text)


def _parse_sharing(text: str) -> Sharing:
    return parse_sharing(text.strip())


def _parse_products(text: str) -> frozenset[str]:
    products = frozenset(p.strip() for p in text.split(",") if p.strip())
    if not products:
        raise ValueError("list at least one product, e.g. NVIDIA-H100-80GB-HBM3")
    return products


def infer_cuda(spec: Mapping[str, Any], compat: bool = True, ngc: NgcTable | None = None) -> CudaNeed | None:
    """What the pod's images need: the container with the highest CUDA (init containers included)."""
    best: CudaNeed | None = None
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        if isinstance(container, dict):
            found = container_need(container, compat, ngc)
            if found is not None and (best is None or found.version > best.version):
                best = found
    return best


# GPU pods that would go unchecked for CUDA because gpu-placement's NGC table lacks their image's release.
# An NGC framework image (`nvcr.io/nvidia/pytorch:26.07-py3`) says its CUDA only through the table
# (`data/ngc-framework-cuda.json` plus the configuration's `ngcReleases`). A release the table lacks infers
# nothing, and a pod with no other CUDA requirement (no `gpu-placement.io/cuda` on it or its namespace, no
# NVIDIA_REQUIRE_CUDA, no other image that names one) is placed with no driver checked against its images.
# /validate says so in an admission warning and counts it (`gpu_placement_ngc_unchecked_pods_total`), so a
# table that has fallen behind shows where it matters. String work on the pod only: no I/O on the webhook's path.


_UNCHECKED_WHY = {True: "newer", False: "gap"}


@dataclass(slots=True, frozen=True)
class Unchecked:
    text: str  # the admission warning
    why: str  # newer | gap: the metric's label


def unchecked_cuda(pod: Mapping[str, Any], where: str, namespace_cuda: Version | None,
                   config: Config) -> Unchecked | None:
    """The warning for a GPU pod whose only CUDA source is an NGC image of a release the table lacks;
    None for every other pod (most: one pass over the container images)."""
    spec = pod.get("spec") or {}
    unlisted = ngc_unlisted(spec, config.ngc)
    if not unlisted:
        return None
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    if n.ANN_CUDA in annotations or namespace_cuda is not None or infer_cuda(spec, True, config.ngc) is not None:
        return None  # a CUDA requirement from elsewhere is checked
    first, ngc = unlisted[0], config.ngc
    which = (f"newer than gpu-placement's table of NGC releases (its last is {ngc.newest})" if first.newer
             else f"one gpu-placement's table of NGC releases lacks ({ngc.first} to {ngc.newest})")
    more = f" (and {len(unlisted) - 1} more such image{'s' if len(unlisted) > 2 else ''})" if len(unlisted) > 1 else ""
    text = (f"{where}: no CUDA check applies: image {first.image} is NGC release {first.release}, {which}{more}, so "
            "no node's driver is checked against its CUDA and the pod may land on a driver too old for it: set "
            f"{n.ANN_CUDA} on the pod or its namespace (the CUDA of release {first.release}, from its release notes, "
            f"e.g. \"13.0\"), or have the platform team add release {first.release} to ngcReleases in gpu-placement's "
            "configuration (docs/rules.md, CUDA compatibility)")
    return Unchecked(text, _UNCHECKED_WHY[first.newer])
