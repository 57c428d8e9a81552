"""Where the cluster's outcome totals live: one annotation of the outcomes Lease, bounded in size.

The holder of the Lease writes the watermark and this state in one PUT, a compare-and-swap
(gpu_placement/outcomes/counter.py): the cluster's totals (each launch series' count, each histogram
series' buckets, sum and count) and the launches deferred. One object, because Kubernetes has no
transaction over several: a second object written beside the Lease could hold totals the watermark
does not match after a crash between the two writes, and an event would be counted twice or never.

kube-apiserver refuses an object whose annotations take more than 256 KiB in all (keys and values,
TotalAnnotationSizeLimitB, k8s.io/apimachinery v0.37.2 pkg/api/validation/objectmeta.go) with 422; the
plain JSON of a large cluster's totals (20 pools, 8 products, every cause and reason) took 280 KB, and
counting stopped for good. So the state is:

- compact: JSON with each label value written once (series name them by index) and each histogram's
  buckets as counts per bucket (not cumulative), gzip-compressed, in base64 (`base64 -d | gunzip` shows
  it): that cluster's 2,660 series take 54 KB;
- at most MAX_SERIES series: a label set first seen past the cap is counted in its metric's overflow
  series, pool and product `_other` (the other labels are codes, a bounded set: at most 82 overflow
  series), so a series already kept goes on growing and none is ever reset;
- at most LIMIT bytes, whatever the counts grow to: a state past it (never met at MAX_SERIES with
  realistic counts) has its series with the fewest observations folded into the overflow series until
  it fits, and from then on admits no new series (the cap it reached is kept in the state).
"""

from __future__ import annotations

import base64
import binascii
import gzip
import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import orjson

from gpu_placement.outcomes.record import BUCKETS, LABELS, STARTS

__all__ = ["LIMIT", "MAX_SERIES", "OTHER", "Packed", "pack", "unpack"]

MAX_SERIES = 4096  # series kept by their own labels (a large cluster has 2,660)
LIMIT = 224 * 1024  # bytes of the annotation's value: 32 KiB of the Lease's 256 KiB left to the watermark and others
OTHER = "_other"  # the pool and product of overflow series (not a Kubernetes label value: it starts with "_")
_FOLDED = ("pool", "product")
_VERSION = 2
_INFLATED = 16 << 20  # at most this much JSON from the annotation (a bomb is refused, not inflated)

Series = tuple[str, tuple[str, ...]]  # (metric, labels)


@dataclass(slots=True, frozen=True)
class Packed:
    text: str  # the annotation's value
    totals: dict[str, Any]  # what it holds, as Outcomes.totals gives them (Outcomes.load takes them back)
    folded: int  # series folded into the overflow because the state outgrew LIMIT on this write


def pack(totals: Mapping[str, Any], previous: Mapping[str, Any] | None, deferred: Mapping[str, float]) -> Packed:
    """The state to write: `totals` (Outcomes.totals, the batch counted in) with the series that
    `previous` (the state as read) did not have admitted while there is room, the others in their
    overflow series; and the `deferred` launches."""
    kept = _series(previous) if previous else {}
    closed = previous.get("cap") if previous else None  # the cap the bound left, once it had to fold
    cap = MAX_SERIES if closed is None else min(MAX_SERIES, int(closed))
    series = _series(totals)
    admitted = sum(1 for key in series if key in kept and not _overflow(key))
    out: dict[Series, Any] = {}
    for key in sorted(series, key=lambda key: (key not in kept, key)):  # the kept first, the new in a fixed order
        if key in kept or _overflow(key) or admitted < cap:
            admitted += not (key in kept or _overflow(key))
            _add(out, key, series[key])
        else:
            _add(out, _fold(key), series[key])
    text = _encode(out, deferred, closed)
    if len(text) <= LIMIT:
        return Packed(text, _totals(out, deferred, closed), 0)
    # Past the bound: fold the fewest series that make it fit (the smallest first), and close admission.
    smallest = sorted((key for key in out if not _overflow(key)), key=lambda key: (_observations(out[key]), key))
    low, high = 1, len(smallest)
    while low < high:
        middle = (low + high) // 2
        if len(_encode(_folded(out, smallest[:middle]), deferred, 0)) <= LIMIT:
            high = middle
        else:
            low = middle + 1
    out = _folded(out, smallest[:low])
    cap = len(smallest) - low
    return Packed(_encode(out, deferred, cap), _totals(out, deferred, cap), low)


def unpack(text: str) -> dict[str, Any]:
    """The state an annotation holds, as Outcomes.totals gives totals (with `deferred`: pod UID ->
    anchor, and `cap`); raises ValueError when it is not one this code wrote."""
    try:
        inflater = zlib.decompressobj(wbits=31)  # gzip
        raw = inflater.decompress(base64.b64decode(text, validate=True), _INFLATED)
        if inflater.unconsumed_tail or not inflater.eof:
            raise ValueError("more than 16 MiB inflated, or cut short")
        state = orjson.loads(raw)
        if not isinstance(state, dict) or state.get("version") != _VERSION:
            raise ValueError(f"not version {_VERSION}")
        names = [str(name) for name in state["labels"]]
        starts = [[*(names[i] for i in labels), float(value)] for *labels, value in state["starts"]]
        histograms = {metric: {"le": [float(b) for b in stored["le"]],
                               "series": [[*(names[i] for i in labels), list(accumulate(int(n) for n in counts[:-1])),
                                           float(total), sum(int(n) for n in counts)]
                                          for *labels, counts, total in stored["series"]]}
                      for metric, stored in state["histograms"].items()}
        deferred = {str(uid): float(anchor) for uid, anchor in state["deferred"]}
        cap = state.get("cap")
        return {"version": 1, "starts": starts, "histograms": histograms, "deferred": deferred,
                "cap": int(cap) if cap is not None else None}
    except (binascii.Error, zlib.error, orjson.JSONDecodeError, KeyError, IndexError, TypeError,
            AttributeError) as exc:
        raise ValueError(f"{type(exc).__name__}: {exc}") from None


# -- the series ------------------------------------------------------------------------------------
def _series(totals: Mapping[str, Any]) -> dict[Series, Any]:
    """(metric, labels) -> a launch series' count, or a histogram's (cumulative buckets, sum, count)."""
    out: dict[Series, Any] = {}
    for *labels, value in totals.get("starts") or ():
        if value:
            out[(STARTS, tuple(labels))] = float(value)
    for metric, stored in (totals.get("histograms") or {}).items():
        if metric in BUCKETS and [float(b) for b in stored.get("le") or ()] == list(BUCKETS[metric]):
            for *labels, buckets, total, count in stored.get("series") or ():
                if count:
                    out[(metric, tuple(labels))] = ([int(n) for n in buckets], float(total), int(count))
    return out


def _overflow(key: Series) -> bool:
    metric, labels = key
    return all(value == OTHER for name, value in zip(LABELS[metric], labels, strict=True) if name in _FOLDED)


def _fold(key: Series) -> Series:
    metric, labels = key
    names = LABELS[metric]
    return metric, tuple(OTHER if name in _FOLDED else value for name, value in zip(names, labels, strict=True))


def _add(out: dict[Series, Any], key: Series, value: Any) -> None:
    found = out.get(key)
    if found is None:
        out[key] = value
    elif key[0] == STARTS:
        out[key] = found + value
    else:
        out[key] = ([a + b for a, b in zip(found[0], value[0], strict=True)], found[1] + value[1], found[2] + value[2])


def _folded(out: Mapping[Series, Any], keys: Iterable[Series]) -> dict[Series, Any]:
    folded = set(keys)
    result: dict[Series, Any] = {}
    for key, value in out.items():
        _add(result, _fold(key) if key in folded else key, value)
    return result


def _observations(value: Any) -> float:
    return float(value) if isinstance(value, float) else float(value[2])


# -- the encoding ----------------------------------------------------------------------------------
def _encode(out: Mapping[Series, Any], deferred: Mapping[str, float], cap: int | None) -> str:
    names: dict[str, int] = {}
    starts: list[list[Any]] = []
    histograms: dict[str, dict[str, Any]] = {metric: {"le": list(bounds), "series": []}
                                             for metric, bounds in BUCKETS.items()}
    for (metric, labels), value in sorted(out.items()):
        indices = [names.setdefault(label, len(names)) for label in labels]
        if metric == STARTS:
            starts.append([*indices, value])
        else:
            buckets, total, count = value  # cumulative; kept as counts per bucket, the last beyond the bounds
            per_bucket = [b - a for a, b in zip([0, *buckets], [*buckets, count], strict=True)]
            histograms[metric]["series"].append([*indices, per_bucket, total])
    state = {"version": _VERSION, "labels": list(names), "starts": starts, "histograms": histograms,
             "deferred": sorted([uid, anchor] for uid, anchor in deferred.items()), "cap": cap}
    return base64.b64encode(gzip.compress(orjson.dumps(state), 6, mtime=0)).decode()


def _totals(out: Mapping[Series, Any], deferred: Mapping[str, float], cap: int | None) -> dict[str, Any]:
    """As Outcomes.totals gives them (and Outcomes.load takes them)."""
    starts: list[list[Any]] = []
    histograms: dict[str, dict[str, Any]] = {metric: {"le": list(bounds), "series": []}
                                             for metric, bounds in BUCKETS.items()}
    for (metric, labels), value in sorted(out.items()):
        if metric == STARTS:
            starts.append([*labels, value])
        else:
            buckets, total, count = value
            histograms[metric]["series"].append([*labels, list(buckets), total, count])
    return {"version": 1, "starts": starts, "histograms": histograms, "deferred": dict(deferred), "cap": cap}
