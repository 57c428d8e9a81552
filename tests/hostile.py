"""Shared by the hostile-input tests (issue 14): raw deep JSON, and the memory the service's own code
holds across a run. No tests here."""

from __future__ import annotations

import gc
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Allocations whose innermost frame is in the service's packages: caches, the view, reasons. The
# client, the HTTP server and hypothesis allocate a lot too, but none of it is the service's to keep.
_OURS = tuple(f"{ROOT / package}/" for package in ("gpu_placement", "extender", "webhook"))


def deep(levels: int, leaf: bytes = b'"x"') -> bytes:
    """A value nested `levels` arrays deep, as raw JSON: orjson will not encode past 254 levels."""
    return b"[" * levels + leaf + b"]" * levels


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a JSON document, as key/index tuples, the root `()` first."""
    yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from paths(value, (*prefix, index))


def _held() -> int:
    gc.collect()
    by_file = tracemalloc.take_snapshot().statistics("filename")  # grouped first: cheaper than filter_traces
    return sum(stat.size for stat in by_file if stat.traceback[0].filename.startswith(_OURS))


@contextmanager
def held_by_the_service() -> Iterator[list[int]]:
    """Yields a one-item list that holds, afterwards, the bytes the service's own code allocated inside
    the block and still holds (traced across threads, so the server thread counts)."""
    growth = [0]
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        before = _held()
        yield growth
        growth[0] = _held() - before
    finally:
        if started:
            tracemalloc.stop()
