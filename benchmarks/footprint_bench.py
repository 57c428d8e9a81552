"""The memory and CPU the chart's containers need at 5,000 nodes and 150,000 pods, measured.

    .venv/bin/python benchmarks/footprint_bench.py [--nodes 5000] [--pods 150000]

A real control plane (tests/e2e: etcd, kube-apiserver) holds the cluster: GPU nodes from the GPU
Operator label sets (gpu_placement/samples/cluster.py), one validator pod each, and pods bound across
them through the API (the ServiceAccount admission adds its token volume, as in a cluster). Then
the chart's three containers run as the chart runs them (args rendered by Helm, tests/e2e/deploy.py)
against that API server: kube-scheduler with the chart's KubeSchedulerConfiguration (its informers
cache every node and every bound pod of the cluster, not only GPU pods), the extender and the
webhook (the service's view: nodes, pods, namespaces). For each it prints, from /proc: resident
memory once its cache holds the whole cluster (kube-scheduler: its scheduler_cache_size metric;
the service: /readyz), the peak (VmHWM, what a memory limit must allow), and the CPU seconds spent
getting there. The chart's requests and limits (charts/gpu-placement/values.yaml) come from these.
Every wait has a deadline; every process is stopped at the end.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from gpu_placement.samples.cluster import BASES, make_node, make_pod  # noqa: E402
from tests.e2e.cluster import ControlPlane, Proc, start_control_plane, wait_for  # noqa: E402
from tests.e2e.deploy import Pod, install, render  # noqa: E402

NAMESPACES = 50
CLK_TCK = 100  # Linux USER_HZ


def proc_status(pid: int) -> dict[str, float]:
    """VmRSS, VmHWM (MiB) and CPU seconds (user + system) of one process."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            fields[key] = int(value.split()[0]) / 1024
    stat = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    fields["cpu_s"] = (int(stat[11]) + int(stat[12])) / CLK_TCK
    return fields


def populate(plane: ControlPlane, nodes: int, pods: int, threads: int) -> float:
    api = plane.api
    assert api is not None
    start = time.monotonic()
    names = [f"team-{i:02d}" for i in range(NAMESPACES)] + ["gpu-operator"]
    for ns in names:
        api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    for ns in names:  # the ServiceAccount admission refuses pods until the controller made `default`
        wait_for(f"serviceaccount {ns}/default", lambda ns=ns: api.http.get(
            f"/api/v1/namespaces/{ns}/serviceaccounts/default").status_code == 200, timeout=60)
    # No kubelet heartbeats here: stop the controllers before the node lifecycle controller taints
    # the nodes and evicts their pods (the scheduler's cache would then hold fewer pods).
    plane.procs["kube-controller-manager"].stop()
    plane.procs["kube-scheduler"].stop()
    bases = list(BASES)

    def node(i: int) -> None:
        name = f"gpu-{i:05d}"
        body = make_node(name, bases[i % len(bases)], labels={"pool": f"pool-{i % 7}"})
        status = body.pop("status")
        body["metadata"].pop("uid")
        check(api.create("/api/v1/nodes", body))
        api.merge_patch(f"/api/v1/nodes/{name}/status", {"status": status})

    per_node = max(1, pods // nodes)

    def node_pods(i: int) -> None:
        name = f"gpu-{i:05d}"
        validator = make_pod("gpu-operator", f"nvidia-operator-validator-{name}", node=name,
                             labels={"app": "nvidia-operator-validator"})
        batch = [validator] + [make_pod(f"team-{(i + j) % NAMESPACES:02d}", f"w-{i:05d}-{j:02d}",
                                        gpus={"nvidia.com/gpu": 1} if j % 6 == 0 else None, node=name,
                                        labels={"app": f"app-{j}", "pool": f"pool-{i % 7}"})
                                for j in range(per_node - 1)]
        for pod in batch:
            pod.pop("status")
            pod["metadata"].pop("uid")
            pod["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                                                   {"name": "MODEL", "value": f"model-{i % 13}"}]
            check(api.create(f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods", pod))

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(node, range(nodes)))
        print(f"  {nodes} nodes in {time.monotonic() - start:.0f} s", flush=True)
        for done, _ in enumerate(pool.map(node_pods, range(nodes)), 1):
            if done % 500 == 0:
                print(f"  pods of {done} nodes ({done * per_node} pods) in {time.monotonic() - start:.0f} s",
                      flush=True)
    return time.monotonic() - start


def check(response: httpx.Response) -> None:
    if response.status_code not in (200, 201):
        raise RuntimeError(f"{response.request.method} {response.request.url.path}: {response.status_code} "
                           f"{response.text[:300]}")


def scheduler_cache(proc_port: int, token: str) -> dict[str, float]:
    text = httpx.get(f"https://127.0.0.1:{proc_port}/metrics", headers={"Authorization": f"Bearer {token}"},
                     verify=False, timeout=10).text
    sizes = {}
    for line in text.splitlines():
        if line.startswith("scheduler_cache_size{"):
            kind = line.split('type="', 1)[1].split('"', 1)[0]
            sizes[kind] = float(line.rsplit(" ", 1)[1])
    return sizes


def measure(name: str, proc: Proc, ready: Any, timeout: float) -> dict[str, float]:
    assert proc.popen is not None
    started = time.monotonic()
    wait_for(f"{name} ready", lambda: proc.alive() and ready(), timeout=timeout, interval=1.0)
    ready_s = time.monotonic() - started
    time.sleep(10)  # settled: what it holds between events
    figures = proc_status(proc.popen.pid)
    figures["ready_s"] = ready_s
    return figures


def run(args: argparse.Namespace) -> int:
    print(f"footprint_bench: {args.nodes} nodes, {args.pods} pods on a real control plane "
          f"(other engineers' work may share this machine)", flush=True)
    plane = start_control_plane()
    try:
        api = plane.api
        assert api is not None
        took = populate(plane, args.nodes, args.pods, args.threads)
        print(f"  cluster loaded in {took:.0f} s", flush=True)
        docs = render()
        install(api, docs)
        results: dict[str, dict[str, float]] = {}
        scheduler = Pod(plane, docs, "gpu-placement-scheduler")
        extender = scheduler.start("extender")
        results["extender"] = measure("extender", extender, lambda: httpx.get(
            f"http://127.0.0.1:{scheduler.local_port(8888)}/readyz", timeout=5).status_code == 200, 600)
        kube_scheduler = scheduler.start("kube-scheduler")
        port = scheduler.local_port(10259)
        results["kube-scheduler"] = measure("kube-scheduler", kube_scheduler, lambda: scheduler_cache(
            port, api.token).get("pods", 0) >= args.pods * 0.99, 600)
        results["kube-scheduler"]["cached_pods"] = scheduler_cache(port, api.token).get("pods", 0)
        webhook = Pod(plane, docs, "gpu-placement-webhook")
        hook = webhook.start("webhook", ("--no-quota-mirror",))
        results["webhook"] = measure("webhook", hook, lambda: httpx.get(
            f"https://127.0.0.1:{webhook.local_port(8443)}/readyz", verify=False, timeout=5).status_code == 200, 600)
        print(f"\n  {'container':<16}{'ready after':>12}{'CPU to ready':>14}{'RSS settled':>14}{'RSS peak':>12}")
        for name, f in results.items():
            print(f"  {name:<16}{f['ready_s']:>10.0f} s{f['cpu_s']:>12.1f} s{f['VmRSS']:>10.0f} MiB"
                  f"{f['VmHWM']:>8.0f} MiB")
        print(f"  (kube-scheduler's cache: {results['kube-scheduler']['cached_pods']:.0f} pods)")
        scheduler.stop()
        webhook.stop()
        return 0
    finally:
        plane.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--pods", type=int, default=150_000)
    parser.add_argument("--threads", type=int, default=16)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
