"""A real kube-scheduler, configured by the chart, preempting for a high-priority shared-GPU pod.

On the shared e2e control plane (conftest.py): the chart installed, its scheduler pod running
kube-scheduler with the KubeSchedulerConfiguration the chart renders (extender verbs, preemptVerb,
nodeCacheCapable, managedResources) and the extender sidecar, as the chart's ServiceAccount. No
kubelet: the harness's Kubelets play them; running pods are created bound, and victims go at once
(terminationGracePeriodSeconds 0). The nodes carry this test's own e2e-group, which the pending pod
selects, so the other tests' nodes are neither candidates nor victims' homes.

Two time-sliced T4s (8 shares of 15360 MiB), every share taken. On t4-a the lowest-priority pod holds
2 GiB: kube-scheduler's unit-counting dry run proposes it alone, which frees a share but not the 4 GiB
the pending pod asks. On t4-b the one lower-priority pod holds 1 GiB and the rest is held by pods of
higher priority than the pending one. The extender must add batch-big on t4-a and drop t4-b.
Without `preemptVerb` (tried by hand, v1.35.4) kube-scheduler evicts batch-low on t4-a, then b-low on
t4-b, both for nothing, and the pod stays Pending with InsufficientGPUMemory.
"""

from __future__ import annotations

from typing import Any

import httpx
import yaml

from gpu_placement.samples.cluster import make_pod
from tests.e2e.cluster import wait_for
from tests.e2e.conftest import E2E
from tests.e2e.deploy import find

SHARED = "nvidia.com/gpu.shared"
GROUP = "preempt"
Obj = dict[str, Any]
PRIORITIES = {"batch-low": 5, "batch": 10, "batch-high": 20, "inference-critical": 1000, "platform-gpu": 2000}
T4 = ("t4-timeslicing", {"labels": {"nvidia.com/gpu.sharing-strategy": "time-slicing"}, "shared_resource": SHARED})


def _bound(namespace: str, name: str, node: str, mib: int, priority_class: str) -> Obj:
    """A pod already running on `node` (created bound: no scheduler)."""
    pod = make_pod(namespace, name, gpus={SHARED: 1}, node=node,
                   annotations={"gpu-placement.io/gpu-memory": f"{mib}Mi"})
    del pod["metadata"]["uid"], pod["status"]
    pod["spec"].update({"priorityClassName": priority_class, "terminationGracePeriodSeconds": 0,
                        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]})
    return pod


def _preemption_outcomes(e2e: E2E) -> dict[str, float]:
    return {line.split('"')[1]: float(line.rsplit(" ", 1)[1])
            for line in httpx.get(f"{e2e.extender_url()}/metrics", timeout=5).text.splitlines()
            if line.startswith("gpu_placement_preemption_nodes_total{")}


def test_kube_scheduler_preempts_the_pods_that_free_the_memory(e2e: E2E) -> None:
    sched_config = yaml.safe_load(find(e2e.docs, "ConfigMap", "gpu-placement-scheduler")["data"]
                                  ["scheduler-config.yaml"])
    assert sched_config["extenders"][0]["preemptVerb"] == "preempt"  # what the running kube-scheduler was given

    for name, value in PRIORITIES.items():
        r = e2e.api.create("/apis/scheduling.k8s.io/v1/priorityclasses", {
            "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value})
        assert r.status_code in (201, 409), r.text
    ns = e2e.namespace("inference")
    t4a, t4b = e2e.nodes(GROUP, [("t4-a", T4[0], dict(T4[1])), ("t4-b", T4[0], dict(T4[1]))])
    assert e2e.api.get(f"/api/v1/nodes/{t4a}")["status"]["allocatable"][SHARED] == "8"
    on_a = [_bound(ns, "batch-low", t4a, 2048, "batch-low"), _bound(ns, "batch-big", t4a, 6144, "batch"),
            *[_bound(ns, f"batch-small-{i}", t4a, 1024, "batch-high") for i in range(6)]]
    on_b = [_bound(ns, "b-low", t4b, 1024, "batch-low"),
            *[_bound(ns, f"platform-{i}", t4b, 2048, "platform-gpu") for i in range(7)]]
    for pod in on_a + on_b:
        r = e2e.api.create(f"/api/v1/namespaces/{ns}/pods", pod)
        assert r.status_code == 201, r.text

    def pods_on(node: str) -> set[str]:
        items = e2e.api.get(f"/api/v1/namespaces/{ns}/pods", fieldSelector=f"spec.nodeName={node}")["items"]
        return {item["metadata"]["name"] for item in items}

    before_b = pods_on(t4b)
    before = _preemption_outcomes(e2e)

    # No CUDA version in the image tag: the T4s' driver (CUDA 11.7) will do.
    pending = make_pod(ns, "chat-hi", gpus={SHARED: 1}, image="registry.example.com/inference/chat:1.4",
                       annotations={"gpu-placement.io/gpu-memory": "4Gi"})
    del pending["metadata"]["uid"], pending["status"]
    pending["spec"].update({"schedulerName": sched_config["profiles"][0]["schedulerName"],
                            "priorityClassName": "inference-critical", "nodeSelector": {"e2e-group": GROUP},
                            "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]})
    r = e2e.api.create(f"/api/v1/namespaces/{ns}/pods", pending)
    assert r.status_code == 201, r.text

    assert e2e.wait_bound(ns, "chat-hi", timeout=90) == t4a
    left_on_a = pods_on(t4a)
    assert {"batch-low", "batch-big"}.isdisjoint(left_on_a)  # the in-tree victim and the one the extender added
    assert {f"batch-small-{i}" for i in range(6)} <= left_on_a  # higher priority than needed: left alone
    assert pods_on(t4b) == before_b  # evicting b-low would not free 4 GiB: untouched
    after = _preemption_outcomes(e2e)
    added, dropped = (after.get(k, 0) - before.get(k, 0) for k in ("victims_added", "dropped"))
    assert added >= 1 and dropped >= 1, (before, after)

    def preempted() -> set[str]:
        events = e2e.api.get(f"/apis/events.k8s.io/v1/namespaces/{ns}/events")["items"]
        return {event["regarding"]["name"] for event in events if event.get("reason") == "Preempted"}

    assert wait_for("Preempted events", lambda: preempted() >= {"batch-low", "batch-big"}, timeout=30)
    assert preempted() == {"batch-low", "batch-big"}  # and nothing else, on either node
