"""`gpu-placement serve` with its heap open to inspection (benchmarks/fuzz_rss.py --snapshots).

    python benchmarks/traced_serve.py DIR FRAMES serve ARGS...

A thread waits for `DIR/<label>.want`, collects garbage, and writes `DIR/<label>.json`: RSS, what
Python's allocators hold (tracemalloc's count, when FRAMES > 0), and glibc malloc's own figures
(`mallinfo2`: bytes in use, bytes free but kept, in how many arenas); then, when FRAMES > 0, a heap
snapshot `DIR/<label>.snap` to compare by traceback (`tracemalloc.Snapshot.compare_to`), and
`DIR/<label>.done`. FRAMES 0 runs without tracemalloc (full speed, figures only). A `.want` file
that says `trim` adds RSS after `malloc_trim(0)`: what glibc kept but could give back.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import re
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


def _rss() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _resident() -> dict[str, float]:
    """RSS by where it lives (/proc/self/smaps): glibc's main heap (brk), other anonymous mappings
    (pymalloc's arenas, malloc's mmapped blocks and other arenas, thread stacks), and files."""
    heap = anon = files = 0
    where = ""
    for line in Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()
        if head and "-" in head[0] and ":" not in head[0]:  # a mapping's first line: address range, perms, ...
            where = "heap" if line.endswith("[heap]") else "file" if len(head) >= 6 and head[5].startswith("/") \
                else "anon"
        elif line.startswith("Rss:"):
            kib = int(head[1])
            if where == "heap":
                heap += kib
            elif where == "file":
                files += kib
            else:
                anon += kib
    return {"rss_heap_mib": heap / 1024, "rss_anon_other_mib": anon / 1024, "rss_files_mib": files / 1024}


def _pymalloc() -> dict[str, float]:
    """Python's small-object allocator (its arenas are mmapped, outside malloc's figures): from
    `sys._debugmallocstats`, which writes to fd 2."""
    with tempfile.TemporaryFile("w+") as out:
        saved = os.dup(2)
        try:
            sys.stderr.flush()
            os.dup2(out.fileno(), 2)
            sys._debugmallocstats()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        out.seek(0)
        text = out.read()

    def figure(label: str) -> float:
        found = re.search(rf"# {label}\s*=\s*([\d,]+)", text)
        return int(found.group(1).replace(",", "")) if found else 0

    return {"pymalloc_arenas_mib": figure("arenas allocated current"),  # 1 MiB each
            "pymalloc_in_use_mib": figure("bytes in allocated blocks") / 2**20,
            "pymalloc_free_mib": (figure("bytes in available blocks") + figure("bytes in empty pools")) / 2**20}


def _figures() -> dict[str, float]:
    libc = ctypes.CDLL("libc.so.6")
    libc.mallinfo2.restype = _MallInfo2
    info = libc.mallinfo2()
    mib = 2**20
    figures = {"rss_mib": _rss(), "malloc_in_use_mib": info.uordblks / mib, "malloc_free_kept_mib": info.fordblks / mib,
               "malloc_heap_mib": info.arena / mib, "malloc_mmapped_mib": info.hblkhd / mib,
               "malloc_top_releasable_mib": info.keepcost / mib}
    figures |= _resident() | _pymalloc()
    if tracemalloc.is_tracing():
        figures["python_traced_mib"] = tracemalloc.get_traced_memory()[0] / mib
        figures["tracemalloc_overhead_mib"] = tracemalloc.get_tracemalloc_memory() / mib
    return figures


def _dumper(folder: Path) -> None:
    while True:
        for want in sorted(folder.glob("*.want")):
            gc.collect()
            figures = _figures()
            if want.read_text().strip() == "trim":  # what malloc keeps that it could give back
                start = time.perf_counter()
                ctypes.CDLL("libc.so.6").malloc_trim(0)
                figures["malloc_trim_ms"] = (time.perf_counter() - start) * 1000
                figures["rss_after_malloc_trim_mib"] = _rss()
            want.with_suffix(".json").write_text(json.dumps(figures))
            if tracemalloc.is_tracing():
                tracemalloc.take_snapshot().dump(str(want.with_suffix(".snap")))
            want.with_suffix(".done").touch()
            want.unlink()
        time.sleep(0.1)


def main() -> int:
    folder, frames, argv = Path(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
    if frames > 0:
        tracemalloc.start(frames)
    threading.Thread(target=_dumper, args=(folder,), name="snapshots", daemon=True).start()
    from gpu_placement.app.cli import main as cli

    return cli(argv)


if __name__ == "__main__":
    sys.exit(main())
