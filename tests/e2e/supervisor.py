"""What kubelet does for the chart's containers, which run here as local processes (deploy.Pod).

- A container that exits is started again: at once the first time, then after 10 s, doubling up to
  5 minutes (kubelet's CrashLoopBackOff with 1.37's defaults; the back-off is forgotten after 10
  minutes without an exit). A pod that is gone (`Pod.lose()`, `Pod.stop()`) is not restarted.
- The probes run as rendered (startup, then liveness and readiness; periodSeconds, timeoutSeconds,
  failureThreshold, initialDelaySeconds): a container failing its startup or liveness probe is
  killed and started again; readiness is reported (the webhook Service's endpoints follow it, as
  the EndpointSlice controller and kube-proxy make them). Each run is tests/e2e/container.py's
  Prober: an httpGet from here, an exec probe inside the container.

One thread per container, each kubelet's probe workers in one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tests.e2e.deploy import Pod

INITIAL_BACKOFF, MAX_BACKOFF = 10.0, 300.0
TICK = 0.25  # how soon an exit is noticed (kubelet's PLEG relists every second; events come sooner)


@dataclass(slots=True)
class Probe:
    """One of a container's probes as the kubelet schedules it; each run is container.Prober's, the
    same one `make image-test` checks the chart's probes with."""

    pod: Pod
    container: str
    kind: str  # startup, liveness, readiness
    period: float
    failure_threshold: int
    initial_delay: float
    last_failure: str = ""

    def ok(self) -> bool:
        prober = self.pod.prober(self.container)  # per run: a restarted container is a new process
        if prober.probe(self.kind):
            return True
        self.last_failure = prober.log[-1] if prober.log else "failed"
        return False


def probes(pod: Pod, name: str) -> list[Probe]:
    container = pod.container(name)
    return [Probe(pod, name, kind, float(spec.get("periodSeconds", 10)), int(spec.get("failureThreshold", 3)),
                  float(spec.get("initialDelaySeconds", 0)))
            for kind in ("startup", "liveness", "readiness") if (spec := container.get(f"{kind}Probe"))]


@dataclass
class _Container:
    pod: Pod
    name: str
    probes: list[Probe]
    popen: Any = None  # the process the probes are about
    since: float = 0.0
    started: bool = False
    ready: bool = False
    exited_at: float | None = None
    backoff: float = 0.0  # 0: no back-off entry (the next restart is immediate)
    backoff_updated: float = float("-inf")
    failures: dict[str, int] = field(default_factory=dict)
    due: dict[str, float] = field(default_factory=dict)
    restarts: int = 0


class Supervisor:
    def __init__(self, on_ready_change: Callable[[], None]) -> None:
        self.on_ready_change = on_ready_change
        self.events: list[str] = []  # what it did, for failure reports
        self._containers: dict[tuple[int, str], _Container] = {}
        self._stop = threading.Event()
        self._t0 = time.monotonic()

    def watch(self, pod: Pod, name: str) -> None:
        """Keep `name` of `pod` running (from now until the pod is stopped or lost)."""
        key = (id(pod), name)
        if key not in self._containers:
            self._containers[key] = _Container(pod, name, probes(pod, name))
            threading.Thread(target=self._run, args=(self._containers[key],), daemon=True,
                             name=f"kubelet-{pod.deployment}-{pod.replica}-{name}").start()

    def ready(self, pod: Pod, name: str) -> bool:
        container = self._containers.get((id(pod), name))
        return container is not None and container.ready

    def restarts(self, pod: Pod, name: str) -> int:
        container = self._containers.get((id(pod), name))
        return container.restarts if container else 0

    def wait_ready(self, pod: Pod, name: str, timeout: float = 90.0) -> float:
        t0 = time.monotonic()
        while not self.ready(pod, name):
            if time.monotonic() - t0 > timeout:
                proc = pod.procs.get(name)
                raise TimeoutError(f"{pod.deployment}-{pod.replica} {name} not Ready after {timeout:.0f} s; "
                                   f"supervisor: {self.events[-5:]}; log tail:\n{proc.tail() if proc else ''}")
            time.sleep(0.1)
        return time.monotonic() - t0

    def wait_restarted(self, pod: Pod, name: str, restarts_before: int, timeout: float = 90.0) -> None:
        """After a kill: until the exit was noticed, the container started again and is Ready."""
        t0 = time.monotonic()
        while self.restarts(pod, name) <= restarts_before:
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"{pod.deployment}-{pod.replica} {name} not restarted after {timeout:.0f} s; "
                                   f"supervisor: {self.events[-5:]}")
            time.sleep(0.05)
        self.wait_ready(pod, name, timeout - (time.monotonic() - t0))

    def stop(self) -> None:
        self._stop.set()

    def _event(self, c: _Container, what: str) -> None:
        self.events.append(f"{time.monotonic() - self._t0:7.1f} s {c.pod.deployment}-{c.pod.replica} {c.name}: {what}")

    def _set_ready(self, c: _Container, ready: bool) -> None:
        if c.ready != ready:
            c.ready = ready
            self._event(c, "Ready" if ready else "not Ready")
            self.on_ready_change()

    def _run(self, c: _Container) -> None:
        while not self._stop.wait(TICK):
            try:
                self._step(c)
            except Exception as exc:  # a harness bug: say so and keep supervising
                self._event(c, f"supervisor error {exc!r}")

    def _step(self, c: _Container) -> None:
        pod, now = c.pod, time.monotonic()
        with pod.lock:
            proc = pod.procs.get(c.name) if c.name in pod.wanted else None
        if proc is None:  # stopped on purpose, or the pod is gone
            self._set_ready(c, False)
            c.popen = None
            return
        if proc.popen is not c.popen:  # a new process (started here or by a test)
            c.popen, c.since, c.exited_at = proc.popen, now, None
            c.started = not any(p.kind == "startup" for p in c.probes)
            c.failures.clear()
            c.due = {p.kind: now + p.initial_delay for p in c.probes}
        if not proc.alive():
            self._exited(c, proc.popen.returncode if proc.popen else None, now)
            return
        for probe in c.probes:
            if now < c.due[probe.kind] or (probe.kind != "startup") != c.started:
                continue
            c.due[probe.kind] = now + probe.period
            if probe.ok():
                c.failures[probe.kind] = 0
                if probe.kind == "startup":
                    c.started = True
                    self._event(c, f"startup probe passed {now - c.since:.1f} s after start")
                    c.due = {p.kind: now for p in c.probes}  # liveness and readiness start now
                elif probe.kind == "readiness":
                    self._set_ready(c, True)
                continue
            c.failures[probe.kind] = c.failures.get(probe.kind, 0) + 1
            if c.failures[probe.kind] < probe.failure_threshold:
                continue
            if probe.kind == "readiness":
                self._set_ready(c, False)
            else:
                self._event(c, f"{probe.kind} probe failed {probe.failure_threshold} times "
                               f"({probe.last_failure}): killed")
                proc.kill()
                return
        if c.started and not any(p.kind == "readiness" for p in c.probes):
            self._set_ready(c, True)

    def _exited(self, c: _Container, code: int | None, now: float) -> None:
        if c.exited_at is None:
            c.exited_at = now
            self._set_ready(c, False)
            self._event(c, f"exited ({code})")
        if now - c.backoff_updated > 2 * MAX_BACKOFF:  # no entry, or forgotten
            c.backoff = 0.0
        if now - c.exited_at < c.backoff:
            return  # CrashLoopBackOff
        c.backoff = INITIAL_BACKOFF if c.backoff == 0.0 else min(2 * c.backoff, MAX_BACKOFF)
        c.backoff_updated = now
        with c.pod.lock:
            if c.name not in c.pod.wanted or c.pod.procs[c.name].alive():
                return
            c.pod.start(c.name, c.pod.extra_args.get(c.name, ()))
        c.restarts += 1
        self._event(c, f"restarted (restart {c.restarts}; next back-off {c.backoff:.0f} s)")
