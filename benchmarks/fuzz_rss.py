"""Is the service's RSS under hostile input growth or a plateau?

`make fuzz` runs the servers inside pytest's process (with hypothesis and tracemalloc beside them),
so the RSS it saw (69 to 147 MiB over 100,000 requests, issue 25) mixes the service with the test
machinery. Here the service is a process of its own (`gpu-placement serve --snapshot`, both
components, TLS for the webhook), sent the fuzz suite's hostile bodies (tests/test_fuzz_http.py:
the same bases and mutations), each to one of /filter, /prioritize, /bind, /mutate and /validate;
its RSS is read from /proc every SAMPLE requests, and the number of series its /metrics holds (hostile
input must not add label values). Every answer is checked as the fuzz suite checks it.

    .venv/bin/python benchmarks/fuzz_rss.py [--requests 100000]

It prints the RSS curve and the least-squares slope over the last half of the run (MiB per 10,000
requests): a plateau has a slope near zero there, growth does not.
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
from pathlib import Path

import httpx
import orjson
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gpu_placement.samples.cluster import demo_objects, make_pod  # noqa: E402
from tests.test_fuzz_http import (  # noqa: E402
    _extender_bases,
    _webhook_bases,
    check_extender,
    check_webhook,
    hostile,
)
from tests.test_webhook_helpers import NAMESPACES  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    total = parser.parse_args().requests
    work = Path(tempfile.mkdtemp(prefix="fuzz-rss-"))
    objects = [*demo_objects(), make_pod("team-a", "queued", gpus={"nvidia.com/gpu": 2}), *NAMESPACES]
    (work / "cluster.json").write_bytes(orjson.dumps({"kind": "List", "apiVersion": "v1", "items": objects}))
    ext_port, hook_port = _port(), _port()
    server = subprocess.Popen(
        [str(Path(sys.executable).parent / "gpu-placement"), "serve", "--snapshot", str(work / "cluster.json"),
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

        examples()
    finally:
        ext.close()
        hook.close()
        server.terminate()
        server.wait(10)
    half = [(n, rss) for n, rss in curve if n >= sent[0] / 2]
    xs, ys = [n / 10_000 for n, _ in half], [rss for _, rss in half]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    print(f"\nRSS: {curve[0][1]:.1f} MiB at start, {max(rss for _, rss in curve):.1f} MiB at most, {curve[-1][1]:.1f} "
          f"MiB after {sent[0]} requests; slope over the last half {slope:+.2f} MiB per 10,000 requests")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
