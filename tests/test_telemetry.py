"""Live telemetry read from a real Prometheus server (contract sections 6 and 7), through the extender.

Prometheus holds backfilled DCGM exporter samples of the last half hour; the telemetry refresher
queries its HTTP API the way it does in a cluster, and kube-scheduler's requests go to the extender
over HTTP.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pytest
from prometheus_client import REGISTRY

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.base.config import Config, Telemetry
from gpu_placement.samples.cluster import make_node, namespace, validator_pod
from gpu_placement.view.telemetry import TelemetrySource, fb_free_query, readings_from, xid_query
from tests.prometheus import PrometheusServer, Series, openmetrics
from tests.support.extender import Extender, api_pod

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
APP = "registry.example.com/inference/chat:1.4"
H100 = 81559
A10G = 23028
STEP = 15.0
FB, XID = "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_XID_ERRORS"


def _series(now: float, node: str, gpu: int, metric: str, value: Any, quiet_for: float = STEP) -> Series:
    """Samples of the last half hour up to `quiet_for` seconds ago; `value` is a number, or a function
    of the sample's age in seconds."""
    samples = []
    at = now - 1800
    while at <= now - quiet_for:
        samples.append((at, float(value(now - at) if callable(value) else value)))
        at += STEP
    return metric, {"Hostname": node, "gpu": str(gpu), "UUID": f"GPU-{node}-{gpu}"}, samples


def _samples(now: float) -> list[Series]:
    return [
        # Idle GPUs: the driver keeps ~600 MiB, so free is a little below nvidia.com/gpu.memory.
        _series(now, "h100-single", 0, FB, H100 - 600),
        *(_series(now, "h100x8-idle", i, FB, H100 - 600) for i in range(8)),
        # Two A10Gs shared 4 ways: 6000 MiB left on each device, 12000 on the node.
        *(_series(now, "a10g-shared", i, FB, 6000) for i in range(2)),
        # XIDs: a recent one; one 29 minutes ago (the gauge still holds 79); an application XID (13) just now.
        *(_series(now, node, 0, FB, H100 - 600) for node in ("xid-recent", "xid-old", "xid-app", "xid-none")),
        _series(now, "xid-recent", 0, XID, lambda age: 79 if age < 180 else 0),
        _series(now, "xid-old", 0, XID, lambda age: 79 if age < 1740 else 0),
        _series(now, "xid-app", 0, XID, lambda age: 13 if age < 120 else 0),
        _series(now, "xid-none", 0, XID, 0),
        # An exporter that stopped reporting four minutes ago: Prometheus still returns it (5 m lookback).
        _series(now, "gone-quiet", 0, FB, 100, quiet_for=240),
    ]


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrometheusServer]:
    # Samples end "now", when the server starts: their age is what the staleness rules look at.
    server = PrometheusServer(Path(tmp_path_factory.mktemp("prometheus")), openmetrics(_samples(time.time())))
    yield server
    server.stop()


def _nodes() -> list[dict[str, Any]]:
    a10g = make_node("a10g-shared", "a10g-unregistered", shared_resource=SHARED,
                     labels={"nvidia.com/gpu.count": "2", "nvidia.com/gpu.replicas": "4",
                             "nvidia.com/gpu.sharing-strategy": "time-slicing"})
    nodes = [make_node("h100-single", "h100"), make_node("h100x8-idle", "h100x8"), a10g,
             *(make_node(name, "h100") for name in ("xid-recent", "xid-old", "xid-app", "xid-none", "gone-quiet"))]
    return [namespace("serve", {"gpu-placement.io/sharing": "shared"}), namespace("train"),
            *nodes, *(validator_pod(node["metadata"]["name"]) for node in nodes)]


@pytest.fixture(scope="module")
def extender(prometheus: PrometheusServer) -> Iterator[tuple[Extender, TelemetrySource]]:
    telemetry = Telemetry(url=prometheus.url, refresh_seconds=60, stale_seconds=90, xid_window_seconds=600)
    served = Extender(_nodes(), Config(telemetry=telemetry))
    source = TelemetrySource(served.core.view, telemetry)
    source.refresh()  # one round of the background refresher
    assert source.last_error is None, source.last_error
    yield served, source
    served.close()


def test_readings_come_per_device_from_the_prometheus_api(extender: tuple[Extender, TelemetrySource]) -> None:
    served, _ = extender
    readings = served.core.view.telemetry
    assert readings["h100x8-idle"].device_free_mib == (H100 - 600,) * 8
    assert readings["a10g-shared"].device_free_mib == (6000, 6000)
    assert readings["a10g-shared"].free_mib == 12000
    assert "gone-quiet" not in readings  # older than staleSeconds: ignored, not pinned


def test_idle_gpus_take_whole_gpu_pods(extender: tuple[Extender, TelemetrySource]) -> None:
    served, _ = extender
    one = served.filter(api_pod(namespace="train", image=APP, gpus=1), ["h100-single"])
    assert one["NodeNames"] == ["h100-single"], one
    eight = served.filter(api_pod(namespace="train", image=APP, gpus=8), ["h100x8-idle"])
    assert eight["NodeNames"] == ["h100x8-idle"], eight


def test_a_share_must_fit_one_device_as_it_really_is(extender: tuple[Extender, TelemetrySource]) -> None:
    served, _ = extender
    fits = api_pod(namespace="serve", resource=SHARED, image=APP, annotations={"gpu-placement.io/gpu-memory": "5Gi"})
    assert served.filter(fits, ["a10g-shared"])["NodeNames"] == ["a10g-shared"]
    # 8Gi fits the node's 12000 MiB free, but no single device has it.
    too_big = api_pod(namespace="serve", resource=SHARED, image=APP,
                      annotations={"gpu-placement.io/gpu-memory": "8Gi"})
    failed = served.filter(too_big, ["a10g-shared"])["FailedNodes"]
    assert failed["a10g-shared"].startswith("InsufficientGPUMemory: ") and "8192" in failed["a10g-shared"]


def test_only_xid_events_in_the_window_lower_the_score(extender: tuple[Extender, TelemetrySource]) -> None:
    served, _ = extender
    names = ["xid-recent", "xid-old", "xid-app", "xid-none"]
    response = served.post("prioritize", {"Pod": api_pod(namespace="train", image=APP), "Nodes": None,
                                          "NodeNames": names})
    scores = dict.fromkeys(names, 0) | {entry["Host"]: entry["Score"] for entry in response.json()}  # 0: left out
    assert scores["xid-old"] == scores["xid-app"] == scores["xid-none"]
    assert scores["xid-recent"] == scores["xid-none"] - Config().scoring.xid_errors


def test_queries_are_instant_queries_of_the_documented_form() -> None:
    assert fb_free_query(90) == "DCGM_FI_DEV_FB_FREE and (time() - timestamp(DCGM_FI_DEV_FB_FREE)) < 90"
    assert xid_query(600).startswith("changes(DCGM_FI_DEV_XID_ERRORS[600s]) > 0 and DCGM_FI_DEV_XID_ERRORS != 13")


def test_a_dead_prometheus_keeps_readings_until_stale(extender: tuple[Extender, TelemetrySource]) -> None:
    served, _ = extender
    clock = [1000.0]
    core = core_from_objects(Config(), _nodes())
    source = TelemetrySource(core.view, Telemetry(url="http://127.0.0.1:9", stale_seconds=30), clock=lambda: clock[0])
    source._readings = {node: replace(reading, at=clock[0])  # what the last good round read
                        for node, reading in served.core.view.telemetry.items()}
    source.refresh()  # nothing listens on port 9
    assert source.last_error is not None
    assert core.view.telemetry["a10g-shared"].free_mib == 12000  # kept
    clock[0] += 31
    source.refresh()
    assert core.view.telemetry == {}  # stale: dropped, so nothing is pinned


def test_a_nan_or_inf_sample_skips_only_its_own_device(tmp_path: Path) -> None:
    """An exporter in trouble sends NaN or +Inf for one device: that device has no reading, every
    other node and device keeps its own, and the skipped samples are counted."""
    now = time.time()
    samples = [_series(now, "fine", 0, FB, 5000), _series(now, "half-broken", 0, FB, float("nan")),
               _series(now, "half-broken", 1, FB, 6000), _series(now, "inf-node", 0, FB, float("inf"))]
    server = PrometheusServer(tmp_path, openmetrics(samples))
    try:
        telemetry = Telemetry(url=server.url, stale_seconds=90, xid_window_seconds=600)
        core = core_from_objects(Config(telemetry=telemetry), [make_node(name, "h100")
                                                               for name in ("fine", "half-broken", "inf-node")])
        before = _skipped("non_finite")
        source = TelemetrySource(core.view, telemetry)
        source.refresh()
    finally:
        server.stop()
    assert source.last_error is None, source.last_error
    readings = core.view.telemetry
    assert readings["fine"].device_free_mib == (5000,)
    assert readings["half-broken"].device_free_mib == (6000,) and readings["half-broken"].free_mib == 6000
    assert "inf-node" not in readings
    assert _skipped("non_finite") == before + 2


def test_xid_events_per_node_are_summed_and_a_sample_that_is_no_number_counts_none() -> None:
    """The rollout's XID rate per driver version adds each device's changes() in the window."""
    def vector(*samples: tuple[str, str, Any]) -> bytes:
        result = [{"metric": {"Hostname": node, "UUID": uuid}, "value": [0, value]} for node, uuid, value in samples]
        return orjson.dumps({"status": "success", "data": {"resultType": "vector", "result": result}})

    readings = readings_from(vector(), vector(("a", "GPU-1", "2"), ("a", "GPU-2", "3"), ("b", "GPU-3", "NaN"),
                                              ("c", "GPU-4", None)), 0.0)
    assert {node: (r.xid_errors, r.xid_events, r.xid_devices) for node, r in readings.items()} == {
        "a": (2, 5, frozenset({"GPU-1", "GPU-2"})), "b": (1, 0, frozenset({"GPU-3"})),
        "c": (1, 0, frozenset({"GPU-4"}))}


def _skipped(reason: str) -> float:
    value = REGISTRY.get_sample_value("gpu_placement_telemetry_samples_skipped_total", {"reason": reason})
    return float(value or 0.0)
