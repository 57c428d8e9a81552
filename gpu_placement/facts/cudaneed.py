"""What a pod's images need from the driver, read the way the GPU stack reads it.

Three sources, per container, best first:
- `NVIDIA_REQUIRE_CUDA` in the container's env: NVIDIA's container runtime asserts it before the
  container starts. Space-separated terms are alternatives, comma-separated factors inside a term all
  hold (nvidia-container-toolkit internal/requirements/constraints/factory.go); factors compare the
  properties `cuda` (the highest CUDA the driver supports), `driver`, `arch` (compute capability) and
  `brand`; a factor on any other property is skipped, as the runtime skips it.
- an NGC framework tag (`nvcr.io/nvidia/pytorch:24.05-py3`): the release's CUDA from
  `data/ngc-framework-cuda.json` (NGC support matrix; each row names the release notes it was checked
  against, or says it is unconfirmed), plus the configuration's `ngcReleases` (releases newer than the
  table, fed without a new gpu-placement release). A release in neither infers nothing: `ngc_unlisted`
  names such images, for the webhook's warning and `explain`.
- a CUDA version in the image tag (`nvidia/cuda:12.4.1-runtime-...`, `...-cuda12.4-...`).
A version from a tag is minor-version compatible: the toolkit's runtime and the framework wheels run on
any driver of the same CUDA major at or above that major's floor. NGC framework images and the
nvidia/cuda images also carry NVIDIA's CUDA compatibility package, which runs them on older driver
branches on data-center GPUs (forward compatibility): the branches come from each NGC release's own
notes, or from the NVIDIA_REQUIRE_CUDA alternatives an nvidia/cuda tag is built with
(`data/forward-compat.json`, which also says which products are data-center GPUs).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from typing import Any

from gpu_placement.base.cuda import NgcTable, Version, VersionError, ngc_table, parse_version
from gpu_placement.base.cuda import format_version as v

__all__ = ["CudaNeed", "Factor", "Forward", "Unlisted", "brand_of", "container_need", "is_data_center",
           "ngc_releases", "ngc_unlisted", "parse_require_cuda", "term_holds", "why_no_cuda"]

Factor = tuple[str, str, str]  # (property, operator, value) as written: ("driver", ">=", "535")
Term = tuple[Factor, ...]
Forward = tuple[tuple[int, Version], ...]  # forward compatibility: (driver branch, its lowest driver), ...
_PROPERTIES = ("cuda", "driver", "arch", "brand")  # what the container runtime knows; others are skipped
_OPERATORS = ("!=", "<=", ">=", "=", "<", ">")  # the runtime's order: longest first
_CUDA_IMAGE_TAG = re.compile(r"^(\d+\.\d+(?:\.\d+)?)(?:[-_.]|$)")
_CUDA_IN_TAG = re.compile(r"(?:^|[-_.])cuda-?(\d+\.\d+(?:\.\d+)?)(?=[-_.]|$)")
# PyTorch's wheel and image naming, which vLLM's CUDA variants follow (`v0.11.0-cu130`): cu128 is CUDA 12.8.
_CU_IN_TAG = re.compile(r"(?:^|[-_.+])cu(1\d)(\d)(?=[-_.]|$)")
_NGC_RELEASE = re.compile(r"^(\d{2}\.\d{2})(?:-|$)")


@dataclass(slots=True, frozen=True)
class CudaNeed:
    """The CUDA an image needs. `terms` set: NVIDIA_REQUIRE_CUDA alternatives, which decide alone;
    else `version` with minor-version compatibility when `compat`."""

    version: Version
    source: str  # "image tag of container main", for sentences and `explain`
    compat: bool = True
    terms: tuple[Term, ...] | None = None
    forward: Forward = ()  # driver branches its CUDA compatibility package serves on data-center GPUs
    forward_source: str = ""  # "NGC 24.05 release notes", where `forward` comes from

    def describe(self) -> str:
        if self.terms is not None:
            return (f"{self.source}: any of {len(self.terms)} alternatives "
                    f"({' | '.join(','.join(''.join(f) for f in term) for term in self.terms[:3])}"
                    f"{' | ...' if len(self.terms) > 3 else ''}), as the container runtime checks it")
        rule = "minor-version compatible" if self.compat else "strict"
        forward = f", or forward compatibility on data-center GPUs with {self.branches()} ({self.forward_source})" \
            if self.forward and self.compat else ""
        return f"CUDA >= {v(self.version)} ({self.source}, {rule}{forward})"

    def branches(self) -> str:
        """`R470 470.57+, R525 525.85+`: the forward-compatible driver branches, for sentences."""
        return ", ".join(f"R{branch} {v(floor)}+" if len(floor) > 1 else f"R{branch}" for branch, floor in self.forward)


def parse_require_cuda(value: str) -> tuple[Term, ...]:
    """Alternatives of an `NVIDIA_REQUIRE_CUDA` value; factors the runtime would skip are dropped."""
    terms: list[Term] = []
    for text in value.split():
        factors = [factor for part in text.split(",") if (factor := _factor(part)) is not None]
        if factors:
            terms.append(tuple(factors))
    return tuple(terms)


def _factor(text: str) -> Factor | None:
    end = next((i for i, ch in enumerate(text) if ch in "<>=!"), -1)
    if end <= 0 or text[:end] not in _PROPERTIES:
        return None
    rest = text[end:]
    op = next((o for o in _OPERATORS if rest.startswith(o)), None)
    value = rest[len(op):] if op else ""
    if op is None or not value:
        return None
    if text[:end] != "brand":
        try:
            parse_version(value)
        except VersionError:
            return None  # the runtime refuses such a value; we cannot weigh it either
    return text[:end], op, value


def term_holds(term: Term, facts: Mapping[str, Version | str | None]) -> bool:
    """All factors hold; a factor on a fact the node does not publish does not."""
    return all(_holds(factor, facts.get(factor[0])) for factor in term)


def _holds(factor: Factor, fact: Version | str | None) -> bool:
    if fact is None:
        return False
    _, op, value = factor
    if isinstance(fact, str):
        left: Any = fact
        right: Any = value
    else:
        width = max(len(fact), value.count(".") + 1)
        left, right = _pad(fact, width), _pad(parse_version(value), width)
    holds: bool = {"!=": left != right, "<=": left <= right, ">=": left >= right, "=": left == right,
                   "<": left < right, ">": left > right}[op]
    return holds


def _pad(version: Version, width: int) -> Version:
    return (*version, *(0,) * (width - len(version)))


# Brands as NVML reports them (nvmlBrandType), which the runtime compares with `brand=`. GFD publishes no
# brand label, so it is read off the product name; data-center boards without a brand in their name
# (H100, A100, L4, ...) report NVIDIA, older Tesla boards (T4, V100) Tesla.
_BRANDS = (("GeForce-RTX", "geforcertx"), ("GeForce", "geforce"), ("TITAN-RTX", "titanrtx"), ("TITAN", "titan"),
           ("Quadro-RTX", "quadrortx"), ("Quadro", "quadro"), ("Tesla", "tesla"), ("NVIDIA-RTX", "nvidiartx"),
           ("RTX", "nvidiartx"), ("GRID", "vcs"))


def is_data_center(product: str | None) -> bool:
    """Whether forward compatibility works on this product: a data-center GPU by NVIDIA's own lists
    (`data/forward-compat.json`); GeForce, Quadro, TITAN and RTX workstation boards are not."""
    if not product:
        return False
    words = product.removesuffix("-SHARED").split("-MIG-", 1)[0].split("-")
    if words[0] == "Tesla":
        return True
    return words[0] == "NVIDIA" and len(words) > 1 and words[1] in _forward_data()[0]


def brand_of(product: str | None) -> str | None:
    if not product:
        return None
    for marker, brand in _BRANDS:
        if marker in product:
            return brand
    return "nvidia"


# -- inference from a container ------------------------------------------------------------------
def container_need(container: Mapping[str, Any], compat: bool, ngc: NgcTable | None = None) -> CudaNeed | None:
    """`ngc`: the NGC releases known (the built-in table when None)."""
    ngc = ngc or ngc_table()
    name = container.get("name", "?")
    env = {e.get("name"): str(e.get("value") or "") for e in container.get("env") or () if isinstance(e, dict)}
    require = env.get("NVIDIA_REQUIRE_CUDA")
    if require and env.get("NVIDIA_DISABLE_REQUIRE", "").lower() not in ("1", "true", "yes"):
        terms = parse_require_cuda(require)
        floors = [_version(f[2]) for term in terms for f in term if f[0] == "cuda" and f[1] in (">=", ">", "=")]
        known = [floor for floor in floors if floor is not None]
        if terms and known:
            return CudaNeed(max(known), f"NVIDIA_REQUIRE_CUDA of container {name}", False, terms)
    image = str(container.get("image") or "").split("@", 1)[0]  # a digest names content, not a version
    repository, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "")
    last = repository.rsplit("/", 1)[-1]
    tagged = _NGC_RELEASE.match(tag)
    if tagged and repository.startswith(ngc.registry) and last in ngc.frameworks:
        row = ngc.releases.get(tagged.group(1))
        if row is None:
            return None
        forward = tuple((floor[0], floor) for floor in row.forward)
        where = "ngcReleases in gpu-placement's configuration" if row.configured else "the NGC support matrix"
        notes = f"NGC {row.release} release notes" + (" (ngcReleases)" if row.configured else "")
        return CudaNeed(row.cuda, f"NGC {last} {row.release} of container {name}, CUDA {v(row.cuda)} by {where}",
                        compat, None, forward, notes if forward else "")
    base = _CUDA_IMAGE_TAG.match(tag) if last == "cuda" else None
    match = base or _CUDA_IN_TAG.search(tag)
    version = _version(match.group(1)) if match else None
    if match is None or version is None:
        short = _CU_IN_TAG.search(tag)
        if short is None:
            return None
        return CudaNeed((int(short.group(1)), int(short.group(2))), f"image tag of container {name} "
                        f"(cu{short.group(1)}{short.group(2)})", compat)
    forward = _forward_data()[1].get(match.group(1), ()) if base else ()  # only nvidia/cuda's own tags
    return CudaNeed(version, f"image tag of container {name}", compat, None, forward,
                    f"nvidia/cuda {match.group(1)}'s NVIDIA_REQUIRE_CUDA" if forward else "")


def _version(text: str) -> Version | None:
    try:
        return parse_version(text)
    except VersionError:
        return None


@cache
def _forward_data() -> tuple[frozenset[str], dict[str, Forward]]:
    """Data-center GPU models, and the forward-compatible branches of nvidia/cuda tags by CUDA version."""
    raw = json.loads(resources.files("gpu_placement").joinpath("data/forward-compat.json").read_text())
    images = {version: _branches(row["branches"]) for version, row in raw["cuda_images"]["branches"].items()}
    return frozenset(raw["data_center_models"]["models"]), images


def _branches(drivers: list[str]) -> Forward:
    """["470.57", "535"] -> ((470, (470, 57)), (535, (535,))): each branch with its lowest driver."""
    return tuple((parse_version(d)[0], parse_version(d)) for d in drivers)


def ngc_releases(ngc: NgcTable | None = None) -> tuple[str, str]:
    """The first and last NGC release the table lists, for sentences."""
    ngc = ngc or ngc_table()
    return ngc.first, ngc.newest


@dataclass(slots=True, frozen=True)
class Unlisted:
    """An NGC framework image whose release gpu-placement's table lacks: nothing is inferred from it."""

    image: str
    release: str
    newer: bool  # after the table's last release (the table is behind), not a gap in it


def ngc_unlisted(spec: Mapping[str, Any], ngc: NgcTable | None = None) -> list[Unlisted]:
    """The pod's NGC framework images (`nvcr.io/nvidia/pytorch:26.07-py3`) whose YY.MM release the table
    lacks, each once. String work only: no I/O (the webhook calls it for every GPU pod)."""
    ngc = ngc or ngc_table()
    found: dict[str, Unlisted] = {}
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        image = str(container.get("image") or "") if isinstance(container, dict) else ""
        plain = image.split("@", 1)[0]
        if not plain.startswith(ngc.registry) or ":" not in plain.rsplit("/", 1)[-1]:
            continue
        repository, _, tag = plain.rpartition(":")
        tagged = _NGC_RELEASE.match(tag)
        if tagged and repository.rsplit("/", 1)[-1] in ngc.frameworks and tagged.group(1) not in ngc.releases:
            found.setdefault(image, Unlisted(image, tagged.group(1), tagged.group(1) > ngc.newest))
    return list(found.values())


def why_no_cuda(spec: Mapping[str, Any], ngc: NgcTable | None = None) -> str:
    """A pod asking for GPUs with no CUDA requirement from annotation, env or image: the sentence that says
    why nothing was inferred from each image, and what to set. No requirement means the driver is not
    checked against the images: a node with too old a driver is chosen, and the container fails there."""
    reasons: list[str] = []
    for container in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())]:
        if not isinstance(container, dict):
            continue
        image = str(container.get("image") or "")
        if image:
            reasons.append(f"{image}: {_why_not(image, ngc or ngc_table())}")
    what = "; ".join(reasons[:3]) + ("; ..." if len(reasons) > 3 else "") if reasons else "no container names an image"
    return (f"no CUDA requirement inferred ({what}), so no node's driver is checked against the images: set "
            f"{_ANN_CUDA} on the pod (e.g. \"12.4\", the CUDA its image was built with) or NVIDIA_REQUIRE_CUDA in "
            "the container's env")


_ANN_CUDA = "gpu-placement.io/cuda"  # gpu_placement.base.names.ANN_CUDA; this module imports no names


def _why_not(image: str, ngc: NgcTable) -> str:
    if "@" in image and ":" not in image.split("@", 1)[0].rsplit("/", 1)[-1]:
        return "pinned by digest only, and a digest names no version"
    plain = image.split("@", 1)[0]
    repository, _, tag = plain.rpartition(":") if ":" in plain.rsplit("/", 1)[-1] else (plain, "", "")
    last = repository.rsplit("/", 1)[-1]
    if repository.startswith(ngc.registry) and last in ngc.frameworks:
        release = _NGC_RELEASE.match(tag)
        if release is None:
            return f"an NGC {last} tag without a YY.MM release"
        if release.group(1) > ngc.newest:
            return (f"NGC release {release.group(1)} is newer than gpu-placement's table of NGC releases (its last "
                    f"is {ngc.newest}; a platform engineer adds it to ngcReleases in the configuration)")
        return (f"NGC release {release.group(1)} is not in gpu-placement's table of NGC releases ({ngc.first} to "
                f"{ngc.newest}, data/ngc-framework-cuda.json and ngcReleases)")
    if repository.startswith("nvcr.io/nim/"):
        return "NIM tags name the model's release, not its CUDA (the NIM's support matrix gives the driver it needs)"
    if last in ("vllm-openai", "vllm"):
        return ("vLLM tags name the vLLM release, not the CUDA it was built with (only a -cuNNN variant tag does, "
                "e.g. -cu128)")
    if not tag:
        return "no tag (latest), which names no version"
    return "its tag names no CUDA version (an nvidia/cuda tag, a -cudaX.Y part or a -cuNNN part would)"
