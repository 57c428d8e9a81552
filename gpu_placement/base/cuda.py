"""Driver and CUDA versions: parsing, and what a driver supports (CUDA Toolkit release notes).

Versions are tuples of ints so they compare as numbers: `(535, 129, 3) < (550, 54, 15)`.
"""

from __future__ import annotations

import json
import re
from bisect import bisect_right
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from importlib import resources
from types import MappingProxyType

from gpu_placement.base.text import quoted

__all__ = ["NGC_RELEASE", "DriverTable", "NgcRelease", "NgcTable", "Version", "VersionError", "driver_table",
           "format_version", "ngc_table", "parse_version"]

Version = tuple[int, ...]
_VERSION = re.compile(r"^\d{1,9}(?:\.\d{1,9}){0,3}$", re.ASCII)  # ASCII digits, bounded: labels are untrusted


class VersionError(ValueError):
    """Not a dotted version number; the message quotes the value."""


def parse_version(text: str) -> Version:
    text = text.strip()
    if not _VERSION.match(text):
        raise VersionError(f"{quoted(text)} is not a version number like 12.4 or 550.54.15")
    return tuple(int(part) for part in text.split("."))


def format_version(version: Version) -> str:
    """Drivers keep their zero-padded revision (`535.129.03`) the way nvidia-smi prints them."""
    if len(version) == 3 and version[0] >= 100:
        return f"{version[0]}.{version[1]}.{version[2]:02d}"
    return ".".join(str(part) for part in version)


@dataclass(slots=True, frozen=True)
class DriverTable:
    """Minimum Linux driver per CUDA toolkit release, and the minor-version compatibility floors."""

    toolkits: tuple[tuple[Version, Version], ...]  # (cuda, min_driver), sorted by driver
    compat_floor: dict[int, Version]  # CUDA major -> lowest driver of minor-version compatibility
    cuda13_min_compute: Version

    def max_cuda(self, driver: Version) -> Version | None:
        """Highest CUDA `major.minor` whose minimum driver this driver meets; None if below all."""
        drivers = [row[1] for row in self.toolkits]
        index = bisect_right(drivers, driver)
        if index == 0:
            return None
        return max(row[0] for row in self.toolkits[:index])[:2]

    def min_driver(self, cuda: Version) -> Version | None:
        """Lowest driver for a toolkit: the exact release when listed, else the first of its minor."""
        exact = [drv for ver, drv in self.toolkits if ver == _pad(cuda)]
        if exact:
            return exact[0]
        same_minor = [drv for ver, drv in self.toolkits if ver[:2] == cuda[:2]]
        return min(same_minor) if same_minor else None


def _pad(version: Version) -> Version:
    return (*version, 0, 0, 0)[:3]


@cache
def driver_table() -> DriverTable:
    raw = json.loads(resources.files("gpu_placement").joinpath("data/cuda-driver-table.json").read_text())
    rows = sorted(
        ((_pad(parse_version(row["cuda"])), parse_version(row["min_driver"])) for row in raw["toolkit_min_driver"]),
        key=lambda row: (row[1], row[0]),
    )
    floors = {int(major): parse_version(drv) for major, drv in raw["minor_version_compat_floor"].items()}
    return DriverTable(tuple(rows), floors, parse_version(raw["cuda13_min_compute_capability"]))


# -- NGC framework releases ---------------------------------------------------------------------
NGC_RELEASE = re.compile(r"^\d{2}\.\d{2}$")  # an NGC release as its tags begin: 24.05


@dataclass(slots=True, frozen=True)
class NgcRelease:
    """One monthly NGC framework release: the CUDA its containers carry, where that figure was read,
    and the lowest driver of each branch its CUDA compatibility package serves on data-center GPUs
    (empty: none assumed). `configured`: a row of the configuration's `ngcReleases`, not the built-in table."""

    release: str  # "24.05"
    cuda: Version
    source: str
    forward: tuple[Version, ...] = ()
    configured: bool = False


@dataclass(slots=True, frozen=True)
class NgcTable:
    """The NGC releases gpu-placement knows: `data/ngc-framework-cuda.json`, plus configured rows."""

    registry: str  # nvcr.io/nvidia/
    frameworks: frozenset[str]  # pytorch, tensorflow, ...
    releases: Mapping[str, NgcRelease]

    @property
    def first(self) -> str:
        return min(self.releases)

    @property
    def newest(self) -> str:
        return max(self.releases)  # YY.MM sorts as text


@cache
def ngc_table(extra: tuple[NgcRelease, ...] = ()) -> NgcTable:
    """The built-in table, with `extra` rows (releases it lacks; the configuration checks that) added."""
    raw = json.loads(resources.files("gpu_placement").joinpath("data/ngc-framework-cuda.json").read_text())
    rows = {row["release"]: NgcRelease(row["release"], parse_version(row["cuda"]), row["source"],
                                       tuple(parse_version(d) for d in (row.get("forward_compat") or {})
                                             .get("branches", ())))
            for row in raw["release_cuda"]}
    rows.update((row.release, row) for row in extra)
    return NgcTable(raw["registry"], frozenset(raw["frameworks"]), MappingProxyType(rows))
