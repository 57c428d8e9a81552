"""Scenario 23: launch outcomes are counted by one webhook replica under its own Lease, with the chart's
RBAC and arguments: the Lease carries the watermark and the cluster's totals, and every replica's
/metrics exports them; a pod stuck in ContainerCreating holds no figure back; a large cluster's totals
fit the Lease kube-apiserver allows (docs/outcomes.md)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_placement.base.config import Config
from gpu_placement.kube.api import load_api_client
from gpu_placement.outcomes.counter import STATE_ANNOTATION, WATERMARK_ANNOTATION, CounterSettings, OutcomeCounter
from gpu_placement.outcomes.record import SETTLE_SECONDS, Outcomes
from gpu_placement.outcomes.store import unpack
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from tests.e2e.cluster import now_rfc3339, wait_for
from tests.e2e.conftest import E2E
from tests.e2e.deploy import NAMESPACE
from tests.outcome_replay import Held, held, large_cluster

LEASES = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases"
LEASE = f"{LEASES}/gpu-placement-outcomes"


def test_a_webhook_replica_counts_outcomes_under_its_own_lease(e2e: E2E) -> None:
    def annotated() -> dict[str, Any] | None:
        response = e2e.api.http.get(LEASE)
        if response.status_code != 200:
            return None
        lease: dict[str, Any] = response.json()
        found = lease["metadata"].get("annotations") or {}
        return lease if WATERMARK_ANNOTATION in found and STATE_ANNOTATION in found else None

    lease = wait_for("the outcomes Lease with its watermark and totals", annotated, timeout=60, interval=0.5)
    assert lease["spec"]["holderIdentity"]
    assert {"starts", "histograms", "deferred"} <= unpack(lease["metadata"]["annotations"][STATE_ANNOTATION]).keys()
    leading = []
    for pod in e2e.webhooks:
        if pod.procs["webhook"].alive():
            text = httpx.get(e2e.webhook_url(pod, "/metrics"), verify=False, timeout=5).text
            leading += [line for line in text.splitlines()
                        if line.startswith('gpu_placement_outcomes_leading{lease="gpu-placement-outcomes"} 1')]
            assert "gpu_placement_outcomes_counted_until_timestamp_seconds" in text
    assert len(leading) == 1  # exactly one replica counts


def _counter(e2e: E2E, outcomes: Outcomes, lease: str, identity: str) -> OutcomeCounter:
    """The real counter on a Lease of its own (not the chart's), as an administrator: the chart's
    ServiceAccount may write only its own Lease."""
    kubeconfig = e2e.api.kubeconfig(e2e.plane.work / "outcomes-admin.kubeconfig", e2e.api.token, "e2e-admin")
    return OutcomeCounter(load_api_client(str(kubeconfig)), outcomes, NAMESPACE, identity,
                          CounterSettings(lease_name=lease))


def _outcomes(config: Config) -> Outcomes:
    view = ClusterView(config)
    for kind in ("nodes", "pods"):  # listed, and empty: the totals are all there is to count
        Ingest(config).replace(view, kind, [])
    return Outcomes(view, config).start()


def _sums(found: Held) -> tuple[float, dict[str, tuple[int, ...]]]:
    """Every launch, and every observation by bucket, whatever series they are under."""
    starts, histograms = found
    return sum(starts.values()), {metric: tuple(map(sum, zip(*(b for b, _, _ in table.values()), strict=True)))
                                  for metric, table in histograms.items() if table}


def _annotations_bytes(e2e: E2E, name: str) -> int:
    lease = e2e.api.get(f"{LEASES}/{name}")
    return sum(len(k) + len(v) for k, v in (lease["metadata"].get("annotations") or {}).items())


def test_a_large_clusters_totals_fit_their_lease(e2e: E2E) -> None:
    """The totals of a large cluster (20 pools, 8 products, every launch cause, wait reason and reason a
    node goes out for: 2,660 series) written by the real counter to kube-apiserver, which refuses more
    than 256 KiB of annotations on an object (TotalAnnotationSizeLimitB) with 422; then a grown cluster
    (60 pools, 16 products: 13,260 series) past the bound. A fresh replica reads back the same totals."""
    for pools, products in ((20, 8), (60, 16)):
        lease = f"outcomes-large-{pools}x{products}"
        try:
            config, events = large_cluster(pools, products)
            leader = _outcomes(config)
            leader.emit(events)
            counted = held(leader)
            counter = _counter(e2e, leader, lease, "leader")
            counter.step()
            assert counter.last_error is None, f"{pools} pools x {products} products: {counter.last_error}"
            assert counter.leading
            print(f"{pools} pools x {products} products: the Lease's annotations take "
                  f"{_annotations_bytes(e2e, lease)} bytes")
            standby = _outcomes(config)
            _counter(e2e, standby, lease, "standby").step()
            read = held(standby)
            if pools == 20:
                assert read == counted  # every series kept as it is
            else:  # past the bound: every launch and observation still counted, some under pool "_other"
                assert _sums(read) == _sums(counted) and read == held(leader)
        finally:
            e2e.api.delete(f"{LEASES}/{lease}")


def _leader_metrics(e2e: E2E) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The outcome samples of the replica that holds the outcomes Lease (every replica exports the same
    totals; the deferred gauge is the holder's own write)."""
    for pod in e2e.webhooks:
        if pod.procs["webhook"].alive():
            text = httpx.get(e2e.webhook_url(pod, "/metrics"), verify=False, timeout=5).text
            if 'gpu_placement_outcomes_leading{lease="gpu-placement-outcomes"} 1' in text:
                return {(s.name, tuple(sorted(s.labels.items()))): s.value
                        for family in text_string_to_metric_families(text) for s in family.samples
                        if s.name.startswith(("gpu_placement_gpu_pod_starts", "gpu_placement_node_ready",
                                              "gpu_placement_outcomes_deferred"))}
    return {}


def _total(samples: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str) -> float:
    return sum(value for (sample, found), value in samples.items()
               if sample == name and labels.items() <= dict(found).items())


# A figure comes SETTLE_SECONDS after what the view last heard passes its anchor: in a cluster this quiet,
# that is the watch's bookmark, which kube-apiserver sends about every minute (defaultBookmarkFrequency).
LATE = SETTLE_SECONDS + 60 + 2 * 10


@pytest.mark.timeout(LATE + 120)
def test_counting_flows_past_a_pod_stuck_in_container_creating(e2e: E2E) -> None:
    """A GPU pod bound and left in ContainerCreating (its volume never mounts), then on the same node a
    pod that starts and one the device plugin's Allocate fails, and a node that joins and is verified:
    the webhook replica holding the outcomes Lease counts the three within SETTLE_SECONDS plus a turn or
    two, while the stuck pod stays deferred (uncounted). This test plays the kubelet for its pods."""
    group = "s23"
    [node] = e2e.nodes(group, [("a", "h100x8", {})])
    ns = e2e.namespace("outcomes")
    e2e.kubelets.elsewhere.add(ns)
    status = f"/api/v1/namespaces/{ns}/pods/{{}}/status"
    scheduled = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": now_rfc3339()}]
    before = _leader_metrics(e2e)
    starts = "gpu_placement_gpu_pod_starts_total"
    for name in ("stuck", "starts", "fails"):
        assert e2e.gpu_pod(ns, name, group).status_code == 201
        assert e2e.wait_bound(ns, name) == node
    waiting = {"name": "main", "ready": False, "restartCount": 0, "image": "nvcr.io/nvidia/cuda:12.2.0",
               "imageID": "", "started": False, "state": {"waiting": {"reason": "ContainerCreating"}}}
    e2e.api.merge_patch(status.format("stuck"), {"status": {
        "phase": "Pending", "startTime": now_rfc3339(), "conditions": scheduled, "containerStatuses": [waiting]}})
    e2e.api.merge_patch(status.format("starts"), {"status": {
        "phase": "Running", "startTime": now_rfc3339(), "conditions": scheduled, "containerStatuses": [
            {**waiting, "ready": True, "started": True, "state": {"running": {"startedAt": now_rfc3339()}}}]}})
    e2e.api.merge_patch(status.format("fails"), {"status": {
        "phase": "Failed", "reason": "UnexpectedAdmissionError", "startTime": now_rfc3339(),
        "message": "Pod was rejected: Allocate failed due to rpc error: code = Unknown desc = device GPU-5c1f "
                   "unhealthy, which is unexpected", "conditions": scheduled}})
    product = "NVIDIA-H100-80GB-HBM3-s23"  # this node's own series
    [joined] = e2e.nodes(group, [("b", "h100x8", {"validator_ready": False,
                                                  "labels": {"nvidia.com/gpu.product": product}})])
    e2e.kubelets.set_pod_ready("gpu-operator", f"nvidia-operator-validator-{joined}", True)
    events = time.monotonic()
    try:
        def counted() -> dict[str, float] | None:
            now = _leader_metrics(e2e)
            grew = {figure: _total(now, name, **labels) - _total(before, name, **labels)
                    for figure, (name, labels) in {
                        "started": (starts, {"outcome": "started"}),
                        "device_plugin": (starts, {"outcome": "failed", "cause": "device_plugin"}),
                        "not_started": (starts, {"outcome": "failed", "cause": "not_started"}),
                        "ready": ("gpu_placement_node_ready_seconds_count", {"product": product})}.items()}
            return grew if all(grew[f] >= 1 for f in ("started", "device_plugin", "ready")) else None

        grew = wait_for("the started pod, the failed one and the verified node counted", counted,
                        timeout=LATE + 30, interval=2)
        print(f"counted {time.monotonic() - events:.0f} s after the last of them, past the stuck pod")
        assert grew["not_started"] == 0  # the stuck pod: deferred, not counted
        assert _total(_leader_metrics(e2e), "gpu_placement_outcomes_deferred_launches") >= 1
    finally:
        for name in ("stuck", "starts", "fails"):  # no kubelet confirms a graceful delete here
            e2e.api.delete(f"/api/v1/namespaces/{ns}/pods/{name}", grace=0)
