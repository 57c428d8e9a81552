"""GPU pods that would go unchecked for CUDA because gpu-placement's NGC table lacks their image's release.

An NGC framework image (`nvcr.io/nvidia/pytorch:26.07-py3`) says its CUDA only through the table
(`data/ngc-framework-cuda.json` plus the configuration's `ngcReleases`). A release the table lacks
infers nothing, and a pod with no other CUDA requirement (no `gpu-placement.io/cuda` on it or its
namespace, no NVIDIA_REQUIRE_CUDA, no other image that names one) is placed with no driver checked
against its images. /validate says so in an admission warning (kubectl prints it; the Events writer
puts it on the pod) and counts it (`gpu_placement_ngc_unchecked_pods_total`), so a table that has
fallen behind shows where it matters. String work on the pod only: no I/O on the webhook's path.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.base.cuda import Version
from gpu_placement.decide.requirements import infer_cuda
from gpu_placement.facts.cudaneed import ngc_unlisted
from gpu_placement.observe.metrics import NGC_UNCHECKED

__all__ = ["Unchecked", "count_unchecked", "unchecked_cuda"]

_WHY = {True: "newer", False: "gap"}
for _why in _WHY.values():  # both series from the start: rate() and alerts need a zero
    NGC_UNCHECKED.labels(_why)


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
    return Unchecked(text, _WHY[first.newer])


def count_unchecked(unchecked: Unchecked) -> None:
    """A pod admitted so (not a dry run): gpu_placement_ngc_unchecked_pods_total."""
    NGC_UNCHECKED.labels(unchecked.why).inc()
