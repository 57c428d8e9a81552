"""Where the extender's CPU went in a scheduler_bench batch, from py-spy's raw collapsed stacks.

    .venv/bin/python benchmarks/profile_breakdown.py DIR/NN-gpu-placement.extender.txt [...]

Each stack is put in the first bucket whose marker it holds (innermost frame first: the code that
spent the time, then what called it), and the buckets printed as shares of all samples. The
scheduler's side: `go tool pprof -top -cum DIR/NN-gpu-placement.scheduler.pprof` (see
docs/performance.md, "Where a pod's milliseconds go").
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

# (bucket, markers): a frame matching any marker puts the stack in the bucket. Checked per frame from
# the innermost out, so a JSON parse inside /filter counts as JSON, not as /filter.
_BUCKETS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("the Binding POST (aiohttp, TLS)", ("aiohttp/", "kube/aio.py")),
    ("JSON (orjson) and shape checks", ("orjson", "web/shape.py", "extender/args.py")),
    ("prometheus_client", ("prometheus_client/",)),
    ("the view's bookkeeping", ("view/ingest.py", "view/cluster.py", "facts/", "report/cluster_metrics.py")),
    ("decisions (placement, scores, recheck)", ("decide/",)),
    ("/bind handler", ("extender/binding.py", "_bind (", "_recheck_and_reserve", "bind (extender/app.py")),
    ("/filter handler", ("filter_ (", "_decide (", "_encode_filter", "extender/settle.py", "extender/state.py")),
    ("/prioritize handler", ("prioritize (",)),
    ("HTTP server: writing an answer (uvicorn's transport.write: the send, and waiting for a CPU after it)",
     ("httptools_impl.py:549",)),
    ("HTTP server: uvicorn, h11/httptools, Starlette", ("uvicorn/", "starlette/", "h11/", "httptools")),
    ("event loop (asyncio, uvloop)", ("asyncio/", "uvloop")),
)


# Threads by what runs them, checked first: the watch thread's TLS reads are the watch's, not a POST's.
_THREADS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("watch: reading events into the view (its own thread)", ("view/live.py",)),
)


def bucket(stack: str) -> str:
    frames = stack.split(";")
    for name, markers in _THREADS:
        if any(marker in frame for frame in frames for marker in markers):
            return name
    for frame in reversed(frames):
        for name, markers in _BUCKETS:
            if any(marker in frame for marker in markers):
                return name
    return "other"


def breakdown(path: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in path.read_text().splitlines():
        stack, _, number = line.rpartition(" ")
        if stack and number.isdigit():
            counts[bucket(stack)] += int(number)
    return counts


def main(argv: list[str]) -> int:
    total: Counter[str] = Counter()
    for name in argv:
        total += breakdown(Path(name))
    samples = sum(total.values())
    if not samples:
        print("no samples")
        return 1
    for name, count in total.most_common():
        print(f"{count / samples * 100:5.1f}%  {count:6d}  {name}")
    print(f"{samples} samples")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
