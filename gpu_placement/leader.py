"""A worker that acts only while it holds its Lease: the ResourceQuota mirror and the DRA taint controller.

One daemon thread takes or renews the Lease every `renew_seconds` (sooner when woken by an event), then
calls `step()`. A bug in a pass is logged and the thread goes on; on stop the Lease is handed over at
once rather than after its duration, so a rolling update does not leave the work undone that long.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

import urllib3
from prometheus_client import Gauge

from gpu_placement.kube import ApiError
from gpu_placement.lease import Lease

__all__ = ["LeaderLoop"]


class LeaderLoop:
    what = "leader loop"  # the log's name for the worker, e.g. "quota mirror"
    log = logging.getLogger("gpu_placement")

    def __init__(self, lease: Lease, leading_gauge: Gauge, renew_seconds: float, clock: Callable[[], float],
                 settle_seconds: float = 0.0) -> None:
        self.lease = lease
        self.clock = clock
        self._leading_gauge = leading_gauge
        self._renew_seconds = renew_seconds
        self._settle_seconds = settle_seconds  # after a wake, let a burst of events arrive before a pass
        self.leading = False
        self._renewed = float("-inf")
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def leading(self) -> bool:
        return self._leading

    @leading.setter
    def leading(self, value: bool) -> None:
        self._leading = value
        self._leading_gauge.set(float(value))

    def step(self) -> None:
        """One turn: `_lead()`, then the work while leading."""
        raise NotImplementedError

    def _took_lead(self) -> None:
        """This replica just became the leader (whatever happened while another led is to be checked)."""

    def _not_leading(self) -> None:
        """A turn on which another replica leads."""

    # -- running -------------------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.what.lower().replace(" ", "-"), daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self.leading:
            self.leading = False
            try:
                self.lease.release()
            except (ApiError, OSError, urllib3.exceptions.HTTPError) as exc:
                self.log.info("%s: could not release the lease (%s); it runs out by itself", self.what, exc)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.step()
            except Exception:  # a bug, not the network: say so, keep the thread
                self.log.exception("%s pass failed", self.what)
            self._wake.wait(self._renew_seconds)
            self._wake.clear()
            if self._settle_seconds:
                self._stop.wait(self._settle_seconds)

    def _lead(self) -> None:
        """Take or renew the Lease when due; raises what the API server answered (then not leading)."""
        now = self.clock()
        if self.leading and now - self._renewed < self._renew_seconds:
            return
        try:
            leading = self.lease.acquire()
        except BaseException:
            self.leading = False
            raise
        if leading and not self.leading:
            self._took_lead()
        elif self.leading and not leading:
            self.log.info("%s: another replica holds the lease now", self.what)
        self.leading = leading
        if leading:
            self._renewed = now
        else:
            self._not_leading()
