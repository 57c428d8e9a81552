"""Is the service's RSS under hostile input growth or a plateau?

`make fuzz` runs the servers inside pytest's process (with hypothesis and tracemalloc beside them),
so the RSS it saw (69 to 147 MiB over 100,000 requests, issue 25) mixes the service with the test
machinery. Here the service is a process of its own (`gpu-placement serve --snapshot`, both
components, TLS for the webhook), sent the fuzz suite's hostile bodies (tests/test_fuzz_http.py:
the same bases and mutations), each to one of /filter, /prioritize, /bind, /mutate and /validate;
its RSS is read from /proc every SAMPLE requests, and the number of series its /metrics holds (hostile
input must not add label values). Every answer is checked as the fuzz suite checks it.

    .venv/bin/python benchmarks/fuzz_rss.py [--requests 100000] [--seed 3] [--snapshots DIR --at 10000,50000]

It prints the RSS curve, the RSS after the warm-up (the first tenth of the run), the end's ratio to
it, and the least-squares slope over the last half of the run (MiB per 10,000 requests): a plateau
has a slope near zero there, growth does not. The same seed sends the same bodies. With
`--snapshots DIR` the server runs under tracemalloc (benchmarks/traced_serve.py: slower) and its heap
is dumped to DIR at each count of `--at`; the end prints the allocations that grew most between the
first and the last dump, by traceback.
"""

from __future__ import annotations

import argparse
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import httpx
import orjson
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu_placement.samples.cluster import demo_objects, make_pod  # noqa: E402
from tests.support.webhook import NAMESPACES  # noqa: E402
from tests.test_fuzz_http import (  # noqa: E402
    _extender_bases,
    _webhook_bases,
    check_extender,
    check_webhook,
    hostile,
)

SAMPLE = 2000


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _snapshot(folder: Path, label: int, pid: int, trim: bool = False) -> None:
    """Ask the traced server for its figures and heap snapshot, wait for them (a big heap takes
    seconds), and print the figures."""
    (folder / f"{label}.want").write_text("trim" if trim else "")
    while not (folder / f"{label}.done").exists():
        if not Path(f"/proc/{pid}").exists():
            raise SystemExit("the traced server exited")
        time.sleep(0.1)
    figures = orjson.loads((folder / f"{label}.json").read_bytes())
    print(f"{label:>7} requests  " + "  ".join(f"{key.removesuffix('_mib')} {value:.1f}"
                                              for key, value in figures.items()) + " (MiB; ms)", flush=True)


def _grown(folder: Path, first: int, last: int, top: int = 12) -> None:
    """What grew most between two dumps, by traceback (the innermost frames first)."""
    before, after = (tracemalloc.Snapshot.load(str(folder / f"{label}.snap")) for label in (first, last))
    diffs = after.compare_to(before, "traceback")
    total = sum(diff.size_diff for diff in diffs)
    print(f"\ntraced heap {sum(s.size for s in before.statistics('filename')) / 2**20:.1f} MiB after {first} "
          f"requests, {sum(s.size for s in after.statistics('filename')) / 2**20:.1f} MiB after {last} "
          f"({total / 2**20:+.1f} MiB); what grew most:")
    for diff in diffs[:top]:
        print(f"  {diff.size_diff / 2**10:+9.1f} KiB  {diff.count_diff:+7d} blocks")
        for frame in list(reversed(diff.traceback))[:8]:
            print(f"      {frame.filename.removeprefix(str(ROOT) + '/')}:{frame.lineno}")


def _slope(curve: list[tuple[int, float]]) -> float:
    """Least-squares slope of RSS over requests, MiB per 10,000."""
    xs, ys = [n / 10_000 for n, _ in curve], [rss for _, rss in curve]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=3, help="hypothesis's seed: the same seed, the same bodies")
    parser.add_argument("--snapshots", type=Path, help="run the server under tracemalloc and dump its heap here")
    parser.add_argument("--at", default="", help="request counts to dump the heap at, e.g. 10000,50000")
    parser.add_argument("--frames", type=int, default=12, help="traceback depth under --snapshots")
    args = parser.parse_args()
    total = args.requests
    dumps = sorted({int(n) for n in args.at.split(",") if n}) if args.snapshots else []
    if args.snapshots:
        args.snapshots.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="fuzz-rss-"))
    objects = [*demo_objects(), make_pod("team-a", "queued", gpus={"nvidia.com/gpu": 2}), *NAMESPACES]
    (work / "cluster.json").write_bytes(orjson.dumps({"kind": "List", "apiVersion": "v1", "items": objects}))
    ext_port, hook_port = _port(), _port()
    command = ([sys.executable, str(ROOT / "benchmarks" / "traced_serve.py"), str(args.snapshots), str(args.frames)]
               if args.snapshots else [str(Path(sys.executable).parent / "gpu-placement")])
    server = subprocess.Popen(
        [*command, "serve", "--snapshot", str(work / "cluster.json"),
         "--extender-listen", f"127.0.0.1:{ext_port}", "--webhook-listen", f"127.0.0.1:{hook_port}",
         "--self-signed", str(work / "certs"), "--log-level", "error"],
        stdout=subprocess.DEVNULL, stderr=(work / "serve.log").open("wb"))
    ext = httpx.Client(base_url=f"http://127.0.0.1:{ext_port}", timeout=30)
    hook = httpx.Client(base_url=f"https://127.0.0.1:{hook_port}", verify=False, timeout=30)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if ext.get("/readyz").status_code == 200 and hook.get("/readyz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit(f"serve did not come up:\n{(work / 'serve.log').read_text()[-2000:]}")
            time.sleep(0.2)

        bind_bases = [{"PodName": "queued", "PodNamespace": "team-a", "PodUID": "uid-team-a-queued",
                       "Node": "h100-single"},
                      {"PodName": "ghost", "PodNamespace": "team-b", "PodUID": "", "Node": "ghost-node"}]
        endpoints = [("/filter", _extender_bases(), ext, lambda b, r: check_extender("filter", b, r)),
                     ("/prioritize", _extender_bases(), ext, lambda b, r: check_extender("prioritize", b, r)),
                     ("/bind", bind_bases, ext, lambda b, r: check_extender("bind", b, r)),
                     ("/mutate", _webhook_bases(), hook, check_webhook),
                     ("/validate", _webhook_bases(), hook, check_webhook)]
        curve: list[tuple[int, float]] = [(0, _rss_mib(server.pid))]
        sent = [0]
        t0 = time.monotonic()

        @seed(args.seed)
        @settings(max_examples=total, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @given(st.data())
        def examples(data: st.DataObject) -> None:
            path, bases, client, check = data.draw(st.sampled_from(endpoints), label="endpoint")
            body = hostile(data, bases)
            response = client.post(path, content=body, headers={"Content-Type": "application/json"})
            check(body, response)
            sent[0] += 1
            if sent[0] % SAMPLE == 0:
                curve.append((sent[0], _rss_mib(server.pid)))
                rate = sent[0] / (time.monotonic() - t0)
                series = len([line for line in ext.get("/metrics").text.splitlines() if not line.startswith("#")])
                print(f"{sent[0]:>7} requests  RSS {curve[-1][1]:6.1f} MiB  {series} metric series  ({rate:.0f}/s)",
                      flush=True)
            if sent[0] in dumps:  # after the RSS sample: a dump allocates, and the last one trims
                _snapshot(args.snapshots, sent[0], server.pid, trim=sent[0] == dumps[-1])

        examples()
    finally:
        ext.close()
        hook.close()
        server.terminate()
        server.wait(10)
    warm = next((n, rss) for n, rss in curve if n >= max(SAMPLE, sent[0] // 10))
    slope = _slope([(n, rss) for n, rss in curve if n >= sent[0] / 2])
    print(f"\nseed {args.seed}: RSS {curve[0][1]:.1f} MiB at start, {warm[1]:.1f} MiB after the warm-up ({warm[0]} "
          f"requests), {max(rss for _, rss in curve):.1f} MiB at most, {curve[-1][1]:.1f} MiB after {sent[0]} "
          f"requests: {curve[-1][1] / warm[1]:.2f}x the warm-up; slope over the second half {slope:+.2f} MiB per "
          "10,000 requests")
    done = [n for n in dumps if (args.snapshots / f"{n}.snap").exists()]
    if len(done) >= 2:
        _grown(args.snapshots, done[0], done[-1])
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
