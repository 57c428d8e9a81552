"""Scenario 23: launch outcomes are counted by one webhook replica under its own Lease, with the chart's
RBAC and arguments: the Lease carries the watermark and the cluster's totals, and every replica's
/metrics exports them (docs/outcomes.md)."""

from __future__ import annotations

from typing import Any

import httpx

from gpu_placement.base.config import Config
from gpu_placement.kube.api import load_api_client
from gpu_placement.outcomes.counter import STATE_ANNOTATION, WATERMARK_ANNOTATION, CounterSettings, OutcomeCounter
from gpu_placement.outcomes.record import Outcomes
from gpu_placement.outcomes.store import unpack
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from tests.e2e.cluster import wait_for
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
