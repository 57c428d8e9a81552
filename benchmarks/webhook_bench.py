"""Webhook latency and throughput: the real service app over TLS on 127.0.0.1, one core.

The server runs in a child process pinned to one CPU (the service's webhook app, built by
`gpu_placement.app.assembly.core_from_objects` over the embedded demo cluster, behind the same uvicorn +
ReloadingTLS listener `serve` uses, with a self-signed certificate). The load comes from `wrk`
(keep-alive, on another CPU when there is one) when it is installed, else from a bounded Python
loop over one keep-alive `http.client` connection, which measures the client as much as the server.

Four cases: /mutate and /validate, each for a GPU pod (rewritten, tolerations, pools, quota check
and reservation) and for a pod without GPUs. Every case is checked once for the expected answer
before it is timed. Each case is then sent, right after, to the floor: the do-nothing webhook
(tests/floor_webhook.py) in a second child pinned to the same CPU, on the same stack; the ratio of
server CPU per request is what gpu-placement's own work costs. Only loopback traffic; every loop is
bounded; the children exit by themselves.

The service runs with the chart's default configuration (charts/gpu-placement/values.yaml `config`, with the
names the chart adds to it, so `refusedNodeLabel` is on) plus the demo's pools, which the demo namespaces
name; `--config demo` runs the demo's configuration instead (as runs before 8 December did).

    .venv/bin/python benchmarks/webhook_bench.py [--seconds 5] [--connections 4] [--python-client] [--config demo]
"""

from __future__ import annotations

import argparse
import base64
import http.client
import os
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TARGET_P99_MS = 5.0
TARGET_CPU_RATIO = 1.3  # server CPU per request, against the do-nothing webhook's
TARGET_CORE_RPS = 3000.0  # requests/s one core can answer
CHILD_DEADLINE_S = 300  # the server child stops by itself after this, whatever happens to us


# -- the server child --------------------------------------------------------------------------------

def chart_config() -> dict[str, Any]:
    """The configuration the chart renders by default (templates/_helpers.tpl `gpu-placement.config`: values.yaml's
    `config` plus the names set at the top of values.yaml; the release namespace, gpu-placement, exempt too), with
    the demo's pools added: the demo namespaces name them."""
    import yaml

    from gpu_placement.app.demo import DEMO_CONFIG

    values = yaml.safe_load((ROOT / "charts" / "gpu-placement" / "values.yaml").read_text())
    config = dict(values["config"])
    for key in ("schedulerName", "gpuResources", "sharedResource", "namespaceSelection"):
        config[key] = values[key]
    config["exemptNamespaces"] = list(dict.fromkeys([*values["exemptNamespaces"], "gpu-placement"]))
    config["pools"] = DEMO_CONFIG["pools"]
    return config


def serve(cert_dir: str, cpu: int | None, floor: bool, which: str = "chart") -> int:
    from gpu_placement.app.assembly import core_from_objects
    from gpu_placement.app.demo import DEMO_CONFIG
    from gpu_placement.base.config import parse_config
    from gpu_placement.observe.logs import setup_logging
    from gpu_placement.samples.cluster import demo_objects
    from gpu_placement.web.serving import ServerThread
    from gpu_placement.web.tls import ReloadingTLS, make_server
    from tests.floor_webhook import create_app as floor_app

    if cpu is not None:
        os.sched_setaffinity(0, {cpu})
    setup_logging("warning")
    config = parse_config(chart_config() if which == "chart" else DEMO_CONFIG)
    app = floor_app() if floor else core_from_objects(config, demo_objects()).webhook_app()
    tls = ReloadingTLS(Path(cert_dir) / "tls.crt", Path(cert_dir) / "tls.key")
    with ServerThread(make_server(app, "127.0.0.1", 0, tls=tls)) as server:
        print(server.port, flush=True)
        deadline = time.monotonic() + CHILD_DEADLINE_S
        # Runs until the parent closes our stdin (or the deadline passes).
        import select

        while time.monotonic() < deadline:
            ready, _, _ = select.select([sys.stdin], [], [], 1.0)
            if ready and not sys.stdin.readline():
                break
    return 0


# -- requests ----------------------------------------------------------------------------------------

def _review(pod: dict[str, Any], namespace: str) -> dict[str, Any]:
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {
        "uid": "705ab4f5-6393-11e8-b7cc-42010a800002", "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"}, "namespace": namespace,
        "operation": "CREATE", "userInfo": {"username": "system:serviceaccount:kube-system:replicaset-controller"},
        "object": pod, "dryRun": False}}


def _cases() -> list[tuple[str, str, bytes, dict[str, Any]]]:
    """(name, path, body, what the answer must hold)."""
    from gpu_placement.samples.cluster import make_pod
    from gpu_placement.web.patching import apply_patch

    gpu = make_pod("team-a", "bench-0", gpus={"nvidia.com/gpu": 1},
                   image="nvcr.io/nvidia/pytorch:24.05-py3", labels={"app": "trainer", "pod-template-hash": "7d4b9c"})
    del gpu["status"]
    gpu["metadata"]["generateName"] = "trainer-7d4b9c-"
    gpu["metadata"]["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "trainer-7d4b9c",
                                           "uid": "rs-1", "controller": True, "blockOwnerDeletion": True}]
    gpu["spec"]["containers"][0]["env"] = [{"name": f"VAR_{i}", "value": "x" * 20} for i in range(10)]
    gpu["spec"]["volumes"] = [{"name": "kube-api-access", "projected": {"sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}}]}}]
    cpu = make_pod("web", "frontend-0", image="nginx:1.27", labels={"app": "frontend"})
    del cpu["status"]
    # What /mutate gives the GPU pod is what /validate then sees.
    mutate_gpu = orjson.dumps(_review(gpu, "team-a"))
    return [
        ("mutate  GPU pod", "/mutate?timeout=10s", mutate_gpu, {"allowed": True, "patch": True}),
        ("validate GPU pod", "/validate?timeout=10s", b"", {"allowed": True, "from": ("team-a", gpu, apply_patch)}),
        ("mutate  CPU pod", "/mutate?timeout=10s", orjson.dumps(_review(cpu, "web")),
         {"allowed": True, "patch": False}),
        ("validate CPU pod", "/validate?timeout=10s", orjson.dumps(_review(cpu, "web")), {"allowed": True}),
    ]


def _post(conn: http.client.HTTPSConnection, path: str, body: bytes) -> dict[str, Any]:
    conn.request("POST", path, body, {"Content-Type": "application/json"})
    response = conn.getresponse()
    data = response.read()
    if response.status != 200:
        raise SystemExit(f"{path}: HTTP {response.status}: {data[:300]!r}")
    return orjson.loads(data)["response"]


def _prepare(port: int, ca: Path) -> list[tuple[str, str, bytes]]:
    """Each case's body, checked once for the expected answer."""
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=10)
    prepared = []
    last_patch: list[dict[str, Any]] = []
    try:
        for name, path, body, expect in _cases():
            if "from" in expect:
                namespace, pod, apply = expect["from"]
                body = orjson.dumps(_review(apply(pod, last_patch), namespace))
            answer = _post(conn, path, body)
            patched = "patch" in answer
            if answer["allowed"] is not expect["allowed"] or expect.get("patch", patched) != patched:
                raise SystemExit(f"{name}: unexpected answer {answer}")
            if "patch" in answer:
                last_patch = orjson.loads(base64.b64decode(answer["patch"]))
            prepared.append((name, path, body))
    finally:
        conn.close()
    return prepared


# -- what the server itself spent ------------------------------------------------------------------------

_BUCKET = re.compile(r'^gpu_placement_request_seconds_bucket\{component="webhook",le="([^"]+)",verb="(\w+)"\} (\S+)$',
                     re.M)


def _buckets(port: int, ca: Path, verb: str) -> dict[float, float]:
    """The webhook's own latency histogram for verb (cumulative counts by upper bound), from /metrics."""
    conn = http.client.HTTPSConnection("localhost", port, context=ssl.create_default_context(cafile=str(ca)),
                                       timeout=10)
    try:
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
    finally:
        conn.close()
    return {float(le): float(count) for le, v, count in _BUCKET.findall(text) if v == verb}


def _handler_p99_ms(before: dict[float, float], after: dict[float, float]) -> float:
    """Upper bound of the histogram bucket holding the 99th percentile of the requests in between."""
    counts = sorted((le, after[le] - before.get(le, 0.0)) for le in after)
    total = counts[-1][1]
    for le, cumulative in counts:
        if cumulative >= 0.99 * total:
            return le * 1000
    return float("inf")


def _steal() -> tuple[int, int]:
    """(steal, total) jiffies of all CPUs: time the hypervisor gave this VM's CPUs to someone else."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (fields[7] if len(fields) > 7 else 0), sum(fields)


def _cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# -- load: wrk, or a bounded Python loop ---------------------------------------------------------------

_WRK_LATENCY = re.compile(r"^\s*(50|99)%\s+([\d.]+)(us|ms|s)\s*$", re.M)
_UNIT_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0}


def _wrk(port: int, path: str, body: bytes, seconds: float, connections: int, cpu: int | None,
         work: Path) -> tuple[float, float, float, str]:
    script = work / "post.lua"
    text = body.decode()
    if "]==]" in text:
        raise SystemExit("the request body cannot be embedded in the wrk script")
    script.write_text(f'wrk.method = "POST"\nwrk.headers["Content-Type"] = "application/json"\n'
                      f"wrk.body = [==[{text}]==]\n")
    command = ["wrk", "-t1", f"-c{connections}", f"-d{max(1, round(seconds))}s", "--latency", "--timeout", "5s",
               "-s", str(script), f"https://127.0.0.1:{port}{path}"]
    if cpu is not None and shutil.which("taskset"):
        command = ["taskset", "-c", str(cpu), *command]
    out = subprocess.run(command, capture_output=True, text=True, timeout=seconds + 30, check=True).stdout
    if "Non-2xx" in out or "Socket errors" in out:
        raise SystemExit(f"wrk saw errors:\n{out}")
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out)[1])  # type: ignore[index]
    latency = {p: float(v) * _UNIT_MS[u] for p, v, u in _WRK_LATENCY.findall(out)}
    return rps, latency["50"], latency["99"], f"wrk -t1 -c{connections} -d{max(1, round(seconds))}s"


def _python_loop(port: int, path: str, body: bytes, seconds: float, ca: Path, cpu: int | None,
                 max_requests: int = 20_000) -> tuple[float, float, float, str]:
    before = os.sched_getaffinity(0)
    if cpu is not None:
        os.sched_setaffinity(0, {cpu})  # off the server's CPU, as wrk is
    try:
        return _python_loop_pinned(port, path, body, seconds, ca, max_requests)
    finally:
        os.sched_setaffinity(0, before)


def _python_loop_pinned(port: int, path: str, body: bytes, seconds: float, ca: Path,
                        max_requests: int) -> tuple[float, float, float, str]:
    context = ssl.create_default_context(cafile=str(ca))
    conn = http.client.HTTPSConnection("localhost", port, context=context, timeout=10)
    latencies: list[float] = []
    try:
        for _ in range(200):  # warm-up: connection, caches
            _post(conn, path, body)
        start = time.perf_counter()
        deadline = start + seconds
        while len(latencies) < max_requests and time.perf_counter() < deadline:
            t0 = time.perf_counter()
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            response.read()
            latencies.append((time.perf_counter() - t0) * 1000)
            if response.status != 200:
                raise SystemExit(f"{path}: HTTP {response.status}")
        elapsed = time.perf_counter() - start
    finally:
        conn.close()
    cuts = statistics.quantiles(latencies, n=100)
    return len(latencies) / elapsed, cuts[49], cuts[98], "python http.client, 1 keep-alive connection"


def _answered(port: int, ca: Path, verb: str, floor: bool) -> float:
    """Requests the server has answered so far: the floor's own count, or our histogram's."""
    if floor:
        conn = http.client.HTTPSConnection("localhost", port, context=ssl.create_default_context(cafile=str(ca)),
                                           timeout=10)
        try:
            conn.request("GET", "/count")
            return float(orjson.loads(conn.getresponse().read())["answered"])
        finally:
            conn.close()
    return _buckets(port, ca, verb).get(float("inf"), 0.0)


class _Server:
    """A server child pinned to one CPU: the service's webhook app, or the do-nothing floor."""

    def __init__(self, cert_dir: Path, cpu: int, floor: bool, which: str = "chart") -> None:
        self.floor = floor
        self.child = subprocess.Popen([sys.executable, __file__, "--serve", str(cert_dir), "--cpu", str(cpu),
                                       "--config", which, *(["--floor"] if floor else [])],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
        assert self.child.stdout is not None
        self.port = int(self.child.stdout.readline())

    def close(self) -> None:
        if self.child.stdin:
            self.child.stdin.close()
        try:
            self.child.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.child.kill()
            self.child.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per case and server (default 5)")
    parser.add_argument("--connections", type=int, default=4, help="wrk keep-alive connections (default 4)")
    parser.add_argument("--python-client", action="store_true", help="use the Python loop even when wrk is there")
    parser.add_argument("--config", choices=("chart", "demo"), default="chart",
                        help="the service's configuration: the chart's defaults (with the demo's pools; default) "
                             "or the demo's")
    parser.add_argument("--serve", metavar="CERT_DIR", help=argparse.SUPPRESS)
    parser.add_argument("--cpu", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--floor", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        return serve(args.serve, args.cpu, args.floor, args.config)

    from gpu_placement.web.certs import write_bundle

    cpus = sorted(os.sched_getaffinity(0))
    server_cpu = cpus[0]
    client_cpu = cpus[1] if len(cpus) > 1 else None
    use_wrk = shutil.which("wrk") is not None and not args.python_client
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="webhook-bench-") as tmp:
        work = Path(tmp)
        bundle = write_bundle(work / "certs", "gpu-placement-webhook", "gpu-placement", ("localhost", "127.0.0.1"))
        servers = [_Server(work / "certs", server_cpu, floor=False, which=args.config),
                   _Server(work / "certs", server_cpu, floor=True)]
        try:
            cases = _prepare(servers[0].port, bundle.ca_cert)
            if use_wrk:  # warm-up, not reported: first requests, allocator, caches
                for server in servers:
                    _wrk(server.port, cases[0][1], cases[0][2], 1, args.connections, client_cpu, work)
            rows = []
            for name, path, body in cases:
                verb = path.strip("/").split("?")[0]
                row: list[tuple[float, float, float, str, float, float, float]] = []
                for server in servers:  # ours, then the floor with the same requests, back to back
                    buckets = {} if server.floor else _buckets(server.port, bundle.ca_cert, verb)
                    answered, steal_before = _answered(server.port, bundle.ca_cert, verb, server.floor), _steal()
                    cpu_before = _cpu_seconds(server.child.pid)
                    if use_wrk:
                        rps, p50, p99, how = _wrk(server.port, path, body, args.seconds, args.connections, client_cpu,
                                                  work)
                    else:
                        rps, p50, p99, how = _python_loop(server.port, path, body, args.seconds, bundle.ca_cert,
                                                          client_cpu)
                    cpu_seconds = _cpu_seconds(server.child.pid) - cpu_before
                    steal_after = _steal()
                    steal = 100 * (steal_after[0] - steal_before[0]) / max(steal_after[1] - steal_before[1], 1)
                    served = _answered(server.port, bundle.ca_cert, verb, server.floor) - answered
                    handler = 0.0 if server.floor else _handler_p99_ms(buckets, _buckets(server.port, bundle.ca_cert,
                                                                                         verb))
                    row.append((rps, p50, p99, how, handler, cpu_seconds / max(served, 1) * 1e6, steal))
                rows.append((name, row[0], row[1]))
        finally:
            for server in servers:
                server.close()
    how = rows[0][1][3]
    print(f"webhook over TLS on 127.0.0.1: each server pinned to CPU {server_cpu} (one uvicorn event loop), client "
          f"{'on CPU ' + str(client_cpu) if client_cpu is not None else 'sharing it'}; load: {how}; "
          f"{args.seconds:g} s per case and server; load average {load_before:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end; the {args.config}'s configuration")
    print(f"floor: the do-nothing webhook (tests/floor_webhook.py: same uvicorn, TLS, Starlette, body reader, orjson; "
          f"allows everything), sent the same requests right after ours\ngoals: server CPU per request <= "
          f"{TARGET_CPU_RATIO:g}x the floor's, >= {TARGET_CORE_RPS:,.0f} requests/s per core (1 s / CPU per request); "
          f"p99 <= {TARGET_P99_MS:g} ms\n")
    print(f"{'case':<18} {'req/s':>7} {'p50 ms':>7} {'p99 ms':>7} {'handler p99':>12} {'CPU/req':>9} "
          f"{'floor req/s':>11} {'floor CPU/req':>13} {'ratio':>6} {'<= 1.3x':>7} {'per core':>9} {'>= 3k':>5} "
          f"{'steal':>6}")
    for name, ours, floor in rows:
        rps, p50, p99, _, handler, cpu_us, steal = ours
        ratio = cpu_us / floor[5]
        per_core = 1e6 / cpu_us
        print(f"{name:<18} {rps:>7,.0f} {p50:>7.2f} {p99:>7.2f} {'<= ' + format(handler, 'g') + ' ms':>12} "
              f"{cpu_us:>6,.0f} us {floor[0]:>11,.0f} {floor[5]:>10,.0f} us {ratio:>5.2f}x "
              f"{'PASS' if ratio <= TARGET_CPU_RATIO else 'MISS':>7} {per_core:>9,.0f} "
              f"{'PASS' if per_core >= TARGET_CORE_RPS else 'MISS':>5} {max(steal, floor[6]):>5.0f}%")
    print("\nreq/s, p50, p99: end to end as the client saw them (TLS, HTTP, queueing behind other connections).\n"
          "handler p99: the webhook's own time per request (parse, decide, encode), as a bucket bound of its\n"
          "  gpu_placement_request_seconds histogram. CPU/req: CPU time of the server process (TLS, uvicorn,\n"
          "  Starlette, the webhook) per request answered; per core = 1 s / that.\n"
          "steal: share of CPU time the hypervisor gave to other guests during the case (/proc/stat); above a\n"
          "  few percent the figures measure the host's load as much as this code.")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
