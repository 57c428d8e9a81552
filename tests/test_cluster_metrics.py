"""Cluster metrics (gpu_placement/report/cluster_metrics.py): aggregates kept current one object change at a
time must equal the same aggregates built from scratch, and say what a platform engineer expects."""

from __future__ import annotations

from collections import Counter
from itertools import pairwise
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_placement.app.assembly import Core, core_from_objects
from gpu_placement.app.demo import DEMO_CONFIG
from gpu_placement.base.config import parse_config
from gpu_placement.decide.rules import CODES
from gpu_placement.observe import metrics
from gpu_placement.report.cluster_metrics import NO_POOL, OK, ClusterMetrics, tracker_for
from gpu_placement.samples.cluster import demo_objects, make_node, make_pod, namespace, validator_pod
from gpu_placement.view.cluster import Telemetry
from gpu_placement.web.serving import ServerThread, make_server

GPU = "nvidia.com/gpu"
GIB = 2**30


@pytest.fixture
def core() -> Core:
    return core_from_objects(parse_config(DEMO_CONFIG), demo_objects())


def tracked(core: Core) -> ClusterMetrics:
    tracker = tracker_for(core.view)
    assert tracker is not None
    return tracker


def assert_matches_rebuild(core: Core) -> None:
    """What the listeners kept equals what a fresh tracker computes from the view as it is now."""
    live = tracked(core)
    fresh = ClusterMetrics(core.view, core.config, live.quota_of, live.problems_of)
    fresh._node_changed(None)
    for name, record in core.view.namespaces.items():
        fresh._namespace_changed(name, record)
    assert dict(live.nodes) == dict(fresh.nodes)
    assert {k: v for k, v in live.capacity.items() if any(v)} == {k: v for k, v in fresh.capacity.items() if any(v)}
    assert {n: r for n, (r, _) in live.unusable_since.items()} == {n: r for n, (r, _) in fresh.unusable_since.items()}
    assert live.quotas == fresh.quotas and live.enforced == fresh.enforced and live.problems == fresh.problems


def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    samples = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(name: str, **labels: str) -> float | None:
    return scrape().get((name, tuple(sorted(labels.items()))))


def test_demo_cluster_as_exported(core: Core) -> None:
    assert value("gpu_placement_gpu_nodes", verdict="NotValidated", product="NVIDIA-H100-80GB-HBM3") == 1
    assert value("gpu_placement_gpu_nodes", verdict=OK, product="NVIDIA-H100-80GB-HBM3") == 5
    assert value("gpu_placement_gpu_nodes", verdict="NoGPU", product="NVIDIA-A10G") == 1  # plugin not registered
    assert not any(name == "gpu_placement_gpu_nodes" and dict(labels).get("product") == "unknown"
                   for name, labels in scrape())  # cpu-1 is no GPU node
    since = value("gpu_placement_gpu_node_unusable_since_timestamp_seconds", node="h100-upgrading",
                  reason="DriverUpgrade")
    assert since is not None and since > 1.7e9
    assert value("gpu_placement_gpu_node_unusable_since_timestamp_seconds", node="h100-train-1",
                 reason=OK) is None  # usable nodes have no series
    # Training pool: two 8x H100 nodes, pretrain-0 (6) and eval-0 (2) hold 8 GPUs.
    assert value("gpu_placement_gpu_allocatable", resource=GPU, pool="training") == 16
    assert value("gpu_placement_gpu_used", resource=GPU, pool="training") == 8
    assert value("gpu_placement_gpu_memory_used_bytes", resource=GPU, pool="training") == 8 * 81559 * 2**20
    assert value("gpu_placement_gpu_memory_free_bytes", resource=GPU, pool="training") == 8 * 81559 * 2**20
    assert value("gpu_placement_gpu_allocatable", resource="nvidia.com/gpu.shared", pool=NO_POOL) == 8
    assert value("gpu_placement_namespace_quota_limit", namespace="team-a", resource=GPU, enforced="true") == 16
    assert value("gpu_placement_namespace_quota_used", namespace="team-a", resource=GPU, enforced="true") == 8
    assert value("gpu_placement_namespace_quota_used", namespace="research", resource=GPU,
                 enforced="true") == 0  # old-job finished
    assert value("gpu_placement_namespace_quota_limit", namespace="web", resource=GPU,
                 enforced="true") is None  # no quota
    assert value("gpu_placement_config_info", mode="enforce", pools="batch,training", scheduler_name="gpu-placement",
                 strategy="binpack", validator_required="true") == 1
    assert_matches_rebuild(core)


def test_node_changes_move_the_counts(core: Core) -> None:
    view, ingest = core.view, core.ingest
    ingest.event(view, "pods", "MODIFIED", validator_pod("h100-not-validated", ready=True))
    assert value("gpu_placement_gpu_node_unusable_since_timestamp_seconds", node="h100-not-validated",
                 reason="NotValidated") is None
    assert value("gpu_placement_gpu_nodes", verdict=OK, product="NVIDIA-H100-80GB-HBM3") == 6
    assert value("gpu_placement_gpu_nodes", verdict="NotValidated", product="NVIDIA-H100-80GB-HBM3") is None
    ingest.event(view, "nodes", "MODIFIED", make_node("h100-train-1", "h100x8", labels={
        "pool": "training", "nvidia.com/mig.config.state": "pending"}))
    assert value("gpu_placement_gpu_nodes", verdict="MIGReconfiguring", product="NVIDIA-H100-80GB-HBM3") == 2
    ingest.event(view, "nodes", "DELETED", make_node("h100-train-2", "h100x8", labels={"pool": "training"}))
    assert value("gpu_placement_gpu_allocatable", resource=GPU, pool="training") == 8
    assert_matches_rebuild(core)


def test_pods_reservations_telemetry_and_namespaces(core: Core) -> None:
    view, ingest = core.view, core.ingest
    ingest.event(view, "pods", "ADDED", make_pod("team-a", "more", gpus={GPU: 1}, node="h100-train-2"))
    assert value("gpu_placement_gpu_used", resource=GPU, pool="training") == 9
    assert value("gpu_placement_namespace_quota_used", namespace="team-a", resource=GPU, enforced="true") == 9
    view.reserve("team-a/next", "h100-train-2", ((GPU, 2),), None)
    assert value("gpu_placement_gpu_reserved", resource=GPU, pool="training") == 2
    assert value("gpu_placement_gpu_used", resource=GPU, pool="training") == 9  # reservations are not counted twice
    assert value("gpu_placement_gpu_memory_reserved_bytes", resource=GPU, pool="training") == 2 * 81559 * 2**20
    age = value("gpu_placement_reservation_oldest_age_seconds")
    assert age is not None and 0 <= age < 5
    view.set_telemetry({"h100-train-2": Telemetry(free_mib=1024, xid_errors=0, at=view.clock())})
    free = value("gpu_placement_gpu_memory_free_bytes", resource=GPU, pool="training")
    # Whole GPUs follow allocatable, not the framebuffer reading (contract §6): h100-train-1's 2 free
    # GPUs and h100-train-2's 3 (8 less 5 used), not narrowed to 1 GiB.
    assert free == 5 * 81559 * 2**20
    assert value("gpu_placement_telemetry_nodes") == 1
    view.release("team-a/next")
    assert value("gpu_placement_gpu_reserved", resource=GPU, pool="training") == 0
    assert value("gpu_placement_reservation_oldest_age_seconds") == 0
    ingest.event(view, "namespaces", "MODIFIED", namespace("team-a", {"gpu-placement.io/quota": "nvidia.com/gpu=10"}))
    assert value("gpu_placement_namespace_quota_limit", namespace="team-a", resource=GPU, enforced="true") == 10
    ingest.event(view, "namespaces", "MODIFIED", namespace("team-a"))
    assert value("gpu_placement_namespace_quota_limit", namespace="team-a", resource=GPU, enforced="true") is None
    ingest.event(view, "pods", "DELETED", make_pod("team-a", "more", gpus={GPU: 1}, node="h100-train-2"))
    assert_matches_rebuild(core)


def test_pools_follow_the_configured_node_selectors() -> None:
    config = parse_config({"pools": {"training": {"nodeSelector": {"pool": "training"}},
                                     "taint-only": {"tolerations": [{"key": "x", "operator": "Exists"}]}}})
    core = core_from_objects(config, [make_node("t", "h100", labels={"pool": "training"}), make_node("o", "h100"),
                                      validator_pod("t"), validator_pod("o")])
    assert value("gpu_placement_gpu_allocatable", resource=GPU, pool="training") == 1
    assert value("gpu_placement_gpu_allocatable", resource=GPU, pool=NO_POOL) == 1
    core.ingest.event(core.view, "nodes", "MODIFIED", make_node("o", "h100", labels={"pool": "training"}))
    assert value("gpu_placement_gpu_allocatable", resource=GPU, pool="training") == 2
    assert value("gpu_placement_gpu_allocatable", resource=GPU, pool=NO_POOL) == 0
    assert_matches_rebuild(core)


def filter_(http: httpx.Client, pod: dict[str, Any], names: list[str]) -> dict[str, Any]:
    answer = http.post("/filter", json={"Pod": pod, "NodeNames": names})
    assert answer.status_code == 200
    result: dict[str, Any] = answer.json()
    return result


def test_pods_waiting_follow_the_extenders_answers(core: Core) -> None:
    """A GPU pod waits when the extender rejected it on every node it was asked about; the reason is
    that of the node that came closest to taking it; it stops waiting when a node passes or the pod is
    bound."""
    server = ServerThread(make_server(core.extender_app(), "127.0.0.1", 0)).start()
    try:
        http = httpx.Client(base_url=server.url(""), timeout=5)
        huge = make_pod("research", "huge", gpus={GPU: 1}, annotations={"gpu-placement.io/gpu-memory": "120Gi"})
        result = filter_(http, huge, ["h100-not-validated", "h100-down"])
        assert result["NodeNames"] == []
        assert value("gpu_placement_pods_waiting", reason="NotValidated") == 1  # readiness: got past NodeNotReady
        first = value("gpu_placement_pods_waiting_since_timestamp_seconds", reason="NotValidated")
        filter_(http, huge, ["h100-single", "h100-not-validated", "h100-down", "cpu-1", "a10g-unregistered"])
        assert value("gpu_placement_pods_waiting", reason="NotValidated") is None
        # One node where only the device's memory failed, four that failed earlier checks.
        assert value("gpu_placement_pods_waiting", reason="InsufficientGPUMemory") == 1
        assert value("gpu_placement_pods_waiting_since_timestamp_seconds", reason="InsufficientGPUMemory") == first
        other = make_pod("research", "small", gpus={GPU: 1})
        filter_(http, other, ["h100-not-validated", "not-a-node"])
        assert value("gpu_placement_pods_waiting", reason="NotValidated") == 1  # UnknownNode ranks lowest
        filter_(http, other, ["h100-not-validated", "h100-single"])  # a node passes: not waiting on a GPU reason
        assert value("gpu_placement_pods_waiting", reason="NotValidated") is None
        huge["spec"]["nodeName"] = "h100-single"  # bound anyway (by hand): the watch says so
        core.ingest.event(core.view, "pods", "ADDED", huge)
        assert not tracked(core).waiting
        assert Counter(tracked(core).waiting_by) == Counter()
    finally:
        server.stop()


def test_codes_are_listed_in_the_order_the_checks_run() -> None:
    """The waiting reason relies on it: readiness, then the sharing level, then compatibility, then device
    fit, then capacity (rules.check_node's chain)."""
    stages = [("NodeNotReady", "NoGPU", "NotValidated", "DriverUpgrade", "MIGReconfiguring"), ("SharingMismatch",),
              ("DriverTooOld", "ComputeCapability", "ProductMismatch"), ("UnknownGPUMemory",),
              ("InsufficientGPUMemory", "InsufficientGPU")]
    positions = [[CODES.index(code) for code in stage] for stage in stages]
    for earlier, later in pairwise(positions):
        assert max(earlier) < min(later)


def test_a_quota_nothing_enforces_says_so_and_unread_settings_are_counted() -> None:
    """The trial's case: with namespaceSelection optIn and no namespace labelled, the quotas were exported
    as if enforced (and GpuNamespaceQuotaNearlyFull would fire for them); a misspelt quota key, a label
    `True` and a policy on a namespace nobody opted in were nowhere in the metrics."""
    on, capital = {"gpu-placement.io/enabled": "true"}, {"gpu-placement.io/enabled": "True"}
    objects = [*demo_objects(), namespace("typo1", {"gpu-placement.io/qouta": "nvidia.com/gpu=4"}, on),
               namespace("capital", {"gpu-placement.io/quota": "nvidia.com/gpu=4"}, capital),
               namespace("on", {"gpu-placement.io/quota": "nvidia.com/gpu=2"}, on)]
    core = core_from_objects(parse_config({**DEMO_CONFIG, "namespaceSelection": "optIn"}), objects)
    assert value("gpu_placement_namespace_quota_limit", namespace="team-a", resource=GPU, enforced="false") == 16
    assert value("gpu_placement_namespace_quota_used", namespace="team-a", resource=GPU, enforced="false") == 8
    assert value("gpu_placement_namespace_quota_limit", namespace="team-a", resource=GPU, enforced="true") is None
    assert value("gpu_placement_namespace_quota_limit", namespace="on", resource=GPU, enforced="true") == 2
    problems = {labels: v for (name, labels), v in scrape().items()
                if name == "gpu_placement_namespace_policy_problems"}
    assert problems[(("namespace", "typo1"), ("problem", "unread_annotation"))] == 1
    assert problems[(("namespace", "capital"), ("problem", "label_value"))] == 1
    assert problems[(("namespace", "capital"), ("problem", "not_opted_in"))] == 1
    assert problems[(("namespace", "team-a"), ("problem", "not_opted_in"))] == 1
    assert not any(dict(labels)["namespace"] == "on" for labels in problems)
    # Fixed: the label written right opts the namespace in; its quota is enforced and its problems go.
    core.ingest.event(core.view, "namespaces", "MODIFIED", namespace(
        "capital", {"gpu-placement.io/quota": "nvidia.com/gpu=4"}, {"gpu-placement.io/enabled": "true"}))
    assert value("gpu_placement_namespace_quota_limit", namespace="capital", resource=GPU, enforced="true") == 4
    assert not any(name == "gpu_placement_namespace_policy_problems" and dict(labels)["namespace"] == "capital"
                   for name, labels in scrape())
    assert_matches_rebuild(core)
