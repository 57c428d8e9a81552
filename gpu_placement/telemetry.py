"""Optional live GPU telemetry from DCGM exporter: free framebuffer and recent XID errors per node.

Reads the Prometheus text that dcgm-exporter (or a Prometheus federation endpoint) serves, sums
`DCGM_FI_DEV_FB_FREE` (MiB) over each node's devices and notes `DCGM_FI_DEV_XID_ERRORS`. Series name
their node with the `Hostname` or `hostname` label. Readings older than `staleSeconds` are dropped,
so a dead exporter never pins a node's free memory at an old value.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.request
from collections.abc import Callable

from prometheus_client.parser import text_string_to_metric_families

from gpu_placement.cluster_metrics import TELEMETRY_SUCCESS
from gpu_placement.config import Telemetry as TelemetryConfig
from gpu_placement.view import ClusterView, Telemetry

__all__ = ["TelemetrySource", "parse_dcgm"]

log = logging.getLogger("gpu_placement.telemetry")
FB_FREE = "DCGM_FI_DEV_FB_FREE"
XID = "DCGM_FI_DEV_XID_ERRORS"


def parse_dcgm(text: str, now: float) -> dict[str, Telemetry]:
    free: dict[str, float] = {}
    xid: dict[str, int] = {}
    for family in text_string_to_metric_families(text):
        if family.name not in (FB_FREE, XID):
            continue
        for sample in family.samples:
            node = sample.labels.get("Hostname") or sample.labels.get("hostname")
            if not node:
                continue
            if family.name == FB_FREE:
                free[node] = free.get(node, 0.0) + sample.value
            elif sample.value > 0:
                xid[node] = xid.get(node, 0) + 1
    return {node: Telemetry(int(free[node]) if node in free else None, xid.get(node, 0), now)
            for node in free.keys() | xid.keys()}


class TelemetrySource:
    def __init__(self, view: ClusterView, config: TelemetryConfig,
                 fetch: Callable[[str], str] | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if config.url is None:
            raise ValueError("telemetry.url is not set")
        self.view, self.config, self.clock = view, config, clock
        self.fetch = fetch or _http_get
        self.last_error: str | None = None
        self._readings: dict[str, Telemetry] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def refresh(self) -> None:
        now = self.clock()
        try:
            self._readings = parse_dcgm(self.fetch(str(self.config.url)), now)
            self.last_error = None
            TELEMETRY_SUCCESS.set(time.time())
        except (OSError, ValueError) as exc:
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


def _http_get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()
