"""Optional live GPU telemetry, read from Prometheus's HTTP API: free framebuffer per device and XID
events in a recent window, per node. Never on the request path: a background refresher queries and
hands the view finished readings.

Why Prometheus and not dcgm-exporter itself: every node runs its own exporter, so a Service in front
of them answers with one random node's devices per scrape. Prometheus scrapes them all and keeps the
history that "an XID *happened* in the last ten minutes" needs: `DCGM_FI_DEV_XID_ERRORS` is a gauge
holding the *last* XID code, so its value alone would mark a node for ever after one error.

Queries (instant, `GET <url>/api/v1/query`):
- `DCGM_FI_DEV_FB_FREE` (MiB) per node (`Hostname` label, as the GPU Operator's exporter sets it) and
  device (`gpu`), only samples younger than `staleSeconds`;
- `changes(DCGM_FI_DEV_XID_ERRORS[<window>]) > 0`, less the application XIDs (13, 31, 43, 45: a
  program's own fault, not the GPU's), one series per device that had an XID in the window.
A failed query keeps the last readings until they are stale, so a dead Prometheus never pins a node.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

import orjson

from gpu_placement.base.config import Telemetry as TelemetryConfig
from gpu_placement.observe.metrics import TELEMETRY_SKIPPED, TELEMETRY_SUCCESS
from gpu_placement.view.cluster import ClusterView, Telemetry

__all__ = ["FB_FREE", "XID", "TelemetrySource", "fb_free_query", "readings_from", "xid_query"]

log = logging.getLogger("gpu_placement.telemetry")
FB_FREE = "DCGM_FI_DEV_FB_FREE"
XID = "DCGM_FI_DEV_XID_ERRORS"
APPLICATION_XIDS = (13, 31, 43, 45)  # raised by a program's own faults; the GPU is fine
_NODE_LABELS = ("Hostname", "hostname", "node")


def fb_free_query(stale_seconds: float) -> str:
    return f"{FB_FREE} and (time() - timestamp({FB_FREE})) < {stale_seconds:g}"


def xid_query(window_seconds: float) -> str:
    apps = "".join(f" and {XID} != {code}" for code in APPLICATION_XIDS)
    return f"changes({XID}[{window_seconds:g}s]) > 0{apps}"


def _vector(body: str | bytes) -> list[dict[str, Any]]:
    """The result of an instant query; ValueError for anything else."""
    try:
        answer = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not a Prometheus API answer ({exc})") from None
    if not isinstance(answer, dict) or answer.get("status") != "success":
        error = answer.get("error") if isinstance(answer, dict) else None
        raise ValueError(f"Prometheus query failed: {error or 'unexpected answer'}")
    data = answer.get("data") or {}
    if data.get("resultType") != "vector" or not isinstance(data.get("result"), list):
        raise ValueError(f"expected an instant vector, got {data.get('resultType')!r}")
    result: list[dict[str, Any]] = data["result"]
    return result


def _node(metric: dict[str, str]) -> str | None:
    return next((metric[label] for label in _NODE_LABELS if metric.get(label)), None)


def readings_from(fb_free: str | bytes, xid: str | bytes, now: float) -> dict[str, Telemetry]:
    """Per node: free MiB of each device (by `gpu` index, else UUID) and the devices with XID events.
    A sample that is no number (NaN or Inf from an exporter in trouble, or not a sample at all) is
    skipped alone and counted: that device has no reading, every other device keeps its own."""
    devices: dict[str, dict[str, int]] = {}
    skipped: dict[str, int] = {}
    for series in _vector(fb_free):
        metric = series.get("metric") if isinstance(series, dict) else None
        node = _node(metric) if isinstance(metric, dict) else None
        if node is None or not isinstance(metric, dict):
            continue
        free = _free_mib(series)
        if isinstance(free, str):
            skipped[free] = skipped.get(free, 0) + 1
            continue
        device = metric.get("gpu") or metric.get("UUID") or str(len(devices.get(node, {})))
        devices.setdefault(node, {})[device] = free
    for reason, count in skipped.items():
        TELEMETRY_SKIPPED.labels(reason).inc(count)
        log.debug("telemetry: %d %s sample(s) of %s skipped", count, reason, FB_FREE)
    xids: dict[str, int] = {}
    events: dict[str, int] = {}
    uuids: dict[str, set[str]] = {}
    for series in _vector(xid):
        metric = series.get("metric") if isinstance(series, dict) else None
        node = _node(metric) if isinstance(metric, dict) else None
        if node is not None and isinstance(metric, dict):
            xids[node] = xids.get(node, 0) + 1
            events[node] = events.get(node, 0) + _events(series)
            if metric.get("UUID"):
                uuids.setdefault(node, set()).add(str(metric["UUID"]))
    return {node: Telemetry(sum(devices[node].values()) if node in devices else None, xids.get(node, 0), now,
                            tuple(sorted(devices.get(node, {}).values(), reverse=True)),
                            frozenset(uuids.get(node, ())), events.get(node, 0))
            for node in devices.keys() | xids.keys()}


def _free_mib(series: dict[str, Any]) -> int | str:
    """The sample's value in MiB, or why it is skipped (the TELEMETRY_SKIPPED reason)."""
    try:
        value = float(series["value"][1])  # Prometheus sends [time, "text"]: "NaN", "+Inf" parse as floats
    except (KeyError, IndexError, TypeError, ValueError):
        return "malformed"
    return int(value) if math.isfinite(value) else "non_finite"


def _events(series: dict[str, Any]) -> int:
    """An XID series' changes() in the window (rollout figures); a sample that is no number counts none."""
    count = _free_mib(series)  # the same parse: an int, or why it is not one
    return count if isinstance(count, int) and count > 0 else 0


class TelemetrySource:
    """The background refresher: `start()` queries every `refreshSeconds` in its own thread."""

    def __init__(self, view: ClusterView, config: TelemetryConfig,
                 fetch: Callable[[str], bytes] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if config.url is None:
            raise ValueError("telemetry.url is not set")
        self.view, self.config, self.clock = view, config, clock
        self.fetch = fetch or _http_get
        self.last_error: str | None = None
        self._readings: dict[str, Telemetry] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def url(self, query: str) -> str:
        return f"{str(self.config.url).rstrip('/')}/api/v1/query?{urllib.parse.urlencode({'query': query})}"

    def refresh(self) -> None:
        now = self.clock()
        try:
            fb_free = self.fetch(self.url(fb_free_query(self.config.stale_seconds)))
            xid = self.fetch(self.url(xid_query(self.config.xid_window_seconds)))
            self._readings = readings_from(fb_free, xid, now)
            self.last_error = None
            TELEMETRY_SUCCESS.set(time.time())
        except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
            if self.last_error is None:
                log.warning("telemetry from %s failed, keeping readings until stale: %s", self.config.url, exc)
            self.last_error = str(exc)
        fresh = {node: r for node, r in self._readings.items() if now - r.at <= self.config.stale_seconds}
        self.view.set_telemetry(fresh)

    def start(self) -> None:
        def loop() -> None:
            while True:
                self.refresh()
                if self._stop.wait(self.config.refresh_seconds):
                    return

        self._thread = threading.Thread(target=loop, name="telemetry", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        body: bytes = response.read()
        return body
