"""Sharing levels: how a pod's GPUs are served, parsed once for the webhook and the extender alike.

Levels, widest first: `exclusive` (whole devices) > `mig-<profile>` (a dedicated, isolated slice) >
`shared` (a time-sliced or MPS share with no isolation). A namespace sets its level with
`gpu-placement.io/sharing` (default exclusive); a pod may narrow it with the same annotation, never
widen it. A MIG profile is narrower than another when it has no more compute slices and no more memory
(`1g.10gb` < `3g.40gb`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.base.text import quoted

__all__ = ["EXCLUSIVE", "SHARED", "Sharing", "effective_sharing", "is_standin", "narrowed", "parse_sharing",
           "sharing_of_resource", "standin_of"]

_MIG_PROFILE = re.compile(r"([0-9]{1,2})g\.([0-9]{1,4})gb((?:\.[a-z0-9]+)*)", re.ASCII)


@dataclass(slots=True, frozen=True)
class Sharing:
    """How `nvidia.com/gpu` asks are served: kind `exclusive`, `shared` or `mig` (with a profile)."""

    kind: str
    profile: str = ""  # mig only, e.g. "1g.10gb"

    @property
    def text(self) -> str:
        return f"mig-{self.profile}" if self.kind == "mig" else self.kind

    def resource(self, config: Config) -> str:
        """What an `nvidia.com/gpu` ask becomes."""
        if self.kind == "shared":
            return config.shared_resource
        if self.kind == "mig":
            return n.MIG_RESOURCE_PREFIX + self.profile
        return n.GPU_RESOURCE

    def within(self, other: Sharing) -> bool:
        """True when this level gives no more than `other` (narrower or the same)."""
        if other.kind == "exclusive" or self.kind == "shared" or self == other:
            return True
        if self.kind != "mig" or other.kind != "mig":
            return False
        mine, theirs = _MIG_PROFILE.fullmatch(self.profile), _MIG_PROFILE.fullmatch(other.profile)
        if mine is None or theirs is None:
            return False
        return (int(mine[1]) <= int(theirs[1]) and int(mine[2]) <= int(theirs[2])
                and mine[3] in ("", theirs[3]))


EXCLUSIVE = Sharing("exclusive")
SHARED = Sharing("shared")


def parse_sharing(text: str) -> Sharing:
    """Raises ValueError with a phrase describing the problem."""
    if text == "exclusive":
        return EXCLUSIVE
    if text == "shared":
        return SHARED
    if text.startswith("mig-"):
        profile = text[4:]
        if _MIG_PROFILE.fullmatch(profile):
            return Sharing("mig", profile)
        dotted = profile.replace("+", ".")  # as the device plugin names nvidia-smi's 1g.10gb+me
        hint = f" (the device plugin advertises {profile} as mig-{dotted})" if _MIG_PROFILE.fullmatch(dotted) else ""
        raise ValueError(f"{quoted(profile)} is not a MIG profile like 1g.10gb, 2g.20gb or 3g.40gb{hint}")
    hint = f" (values are lower case: {text.lower()})" if text.lower() in ("exclusive", "shared") else ""
    raise ValueError(f"{quoted(text)} is not exclusive, shared or mig-<profile>{hint}")


def sharing_of_resource(resource: str, config: Config) -> Sharing:
    """The level a resource name stands for: a MIG slice, a share, or (any other GPU resource) whole devices."""
    if resource == config.shared_resource:
        return SHARED
    if resource.startswith(n.MIG_RESOURCE_PREFIX):
        return Sharing("mig", resource[len(n.MIG_RESOURCE_PREFIX):])
    return EXCLUSIVE


def standin_of(level: Sharing) -> str:
    """The stand-in resource of a level (docs/dra.md, "Quota on devices"), named after the device plugin's
    resource for it: `gpu-placement.io/gpu`, `gpu-placement.io/gpu.shared`, `gpu-placement.io/mig-1g.10gb`."""
    name = "gpu" if level.kind == "exclusive" else "gpu.shared" if level.kind == "shared" else level.text
    return f"{n.STANDIN_GROUP}/{name}"


def is_standin(resource: str) -> bool:
    return resource.startswith(n.STANDIN_GROUP + "/")


def narrowed(namespace_level: Sharing, asked: Sharing | None) -> Sharing:
    """The pod's own level when it asked for one within its namespace's; else the namespace's (a wider
    ask is the webhook's to deny)."""
    return asked if asked is not None and asked.within(namespace_level) else namespace_level


def effective_sharing(namespace_level: Sharing, pod_annotations: Mapping[str, str]) -> Sharing:
    """`narrowed` by the pod's annotation as written; a broken one leaves the namespace's level (the
    webhook denies it). Raises nothing."""
    raw = pod_annotations.get(n.ANN_SHARING)
    try:
        asked = parse_sharing(raw.strip()) if raw is not None else None
    except ValueError:
        asked = None
    return narrowed(namespace_level, asked)
