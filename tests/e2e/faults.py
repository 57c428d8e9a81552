"""Fault scenarios on the real control plane: the harness the test_faults_*.py files share.

Each scenario makes a world of its own (nodes and namespaces no other test selects), drives a burst
of GPU pod creates with deletes alongside (a StatefulSet-like pod recreated under its name among
them), injects its fault a few seconds in, keeps creating for a few seconds after the fault ends,
then waits for the cluster to settle. One checker samples the API server twice a second all along,
and once more at the end, for the same invariants in every scenario:

1. no node holds more GPU units, or (time-sliced nodes) more GPU memory, than it has;
2. no pod on a node whose GPU Operator validator is not Ready;
3. no namespace over its `gpu-placement.io/quota`;
4. every GPU pod in these namespaces (each has a GPU policy) was shaped by /mutate: the admitted
   annotation and the gpu-placement scheduler;
5. within 60 s of the fault's end every pod is bound, or Pending with reason codes; pods of the
   exclusive namespaces must be bound (their quotas add up to less than the verified GPUs: each
   admitted pod fits);
6. no reservation left that nothing will release: every GPU reservation of an extender and quota
   hold of a webhook is released within its time (`reservationTTLSeconds`; a hold is then settled
   by a list of the namespace's pods), checked every few seconds and at the end.

Recovery is measured with a probe: one pod created (retried until the API server takes it) the
moment the fault ends; the time until it is bound is how long new work waited. pytest's terminal
summary gets one line per scenario: pods created, bound, refused, and the recovery times
(conftest.py prints `SUMMARY`).
"""

from __future__ import annotations

import itertools
import re
import threading
import time
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from gpu_placement.base.quantity import QuantityError, quantity_to_mib
from tests.e2e.cluster import Api
from tests.e2e.conftest import E2E, gpu_pod_manifest
from tests.e2e.container import Container
from tests.e2e.deploy import Pod

Obj = dict[str, Any]
SUMMARY: list[str] = []

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
EXCLUSIVE_QUOTA = 12  # of the 16 verified H100 GPUs: every admitted 1-GPU pod fits
SHARED_MEMORY = "5Gi"  # three fit on a 15 GiB T4; the others wait for InsufficientGPUMemory
CUDA11 = "nvcr.io/nvidia/cuda:11.6.2-runtime-ubuntu20.04"  # the T4 fixture's driver is 510.73.08
SETTLE_S = 60.0
# A reason kube-scheduler can act on: the extender's grouped "N Code: sentence", or its own resource fit.
REASON = re.compile(r"\b\d+ [A-Z][A-Za-z]+: |Insufficient nvidia\.com/")
TERMINAL = ("Succeeded", "Failed")

@dataclass
class World:
    group: str
    exclusive: str
    shared: str
    quotas: dict[str, dict[str, int]]  # namespace -> resource -> units
    unverified: set[str]
    capacity: dict[str, dict[str, int]]  # node -> GPU resource -> units
    memory: dict[str, tuple[int, int]]  # time-sliced node -> (MiB it has, MiB one unit stands for)
    probe: str = ""  # the namespace of the recovery probe pod
    unscheduled: set[str] = field(default_factory=set)  # namespaces whose pods select no node on purpose

    @property
    def must_bind(self) -> set[str]:
        return {self.exclusive, self.probe}

    @property
    def namespaces(self) -> list[str]:
        return list(self.quotas)


def make_world(e2e: E2E, tag: str) -> World:
    """Two verified H100x8, a one-GPU H100 whose validator is not Ready (binpack's favourite: the first
    pod goes there the moment the readiness check slips), two time-sliced T4s (8 shares of 15 GiB);
    an exclusive namespace with a quota of 12 GPUs and a shared one whose pods ask 5 GiB each."""
    group = f"faults-{tag}"
    t4 = {"shared_resource": SHARED, "labels": {"nvidia.com/gpu.sharing-strategy": "time-slicing"}}
    e2e.nodes(group, [("h100-a", "h100x8", {}), ("h100-b", "h100x8", {}),
                      ("h100-unverified", "h100", {"validator_ready": False}),
                      ("t4-a", "t4-timeslicing", dict(t4)), ("t4-b", "t4-timeslicing", dict(t4))])
    exclusive = e2e.namespace(f"fx-{tag}", {"gpu-placement.io/quota": f"{GPU}={EXCLUSIVE_QUOTA}"})
    shared = e2e.namespace(f"fs-{tag}", {"gpu-placement.io/sharing": "shared",
                                         "gpu-placement.io/gpu-memory": SHARED_MEMORY,
                                         "gpu-placement.io/quota": f"{SHARED}=12"})
    probe = e2e.namespace(f"fp-{tag}", {"gpu-placement.io/quota": f"{GPU}=1"})
    capacity: dict[str, dict[str, int]] = {}
    memory: dict[str, tuple[int, int]] = {}
    for node in e2e.api.get("/api/v1/nodes", labelSelector=f"e2e-group={group}")["items"]:
        name, labels = node["metadata"]["name"], node["metadata"]["labels"]
        capacity[name] = {r: int(v) for r, v in node["status"]["allocatable"].items() if r in (GPU, SHARED)}
        replicas = int(labels.get("nvidia.com/gpu.replicas", "1"))
        if replicas > 1:
            device = int(labels["nvidia.com/gpu.memory"])
            device = device // 2**20 if device > 10_000_000 else device  # GFD before v0.7 wrote bytes
            memory[name] = (device * int(labels["nvidia.com/gpu.count"]), device // replicas)
    world = World(group, exclusive, shared, {exclusive: {GPU: EXCLUSIVE_QUOTA}, shared: {SHARED: 12}, probe: {GPU: 1}},
                  {f"{group}-h100-unverified"}, capacity, memory, probe)
    return world  # e2e.namespace waited for each quota to be in force


def _client(e2e: E2E, timeout: float) -> Api:
    """A client of its own with a short timeout: a paused API server must not hold a thread for 30 s."""
    api = Api(e2e.api.server, e2e.api.ca, e2e.api.token)
    api.http.timeout = httpx.Timeout(timeout)
    return api


# -- the load ----------------------------------------------------------------------------------------

class Burst:
    """GPU pods created at a fixed rate (two in three exclusive, one in three shared) by two threads,
    while a third deletes the oldest ones, and every third second deletes a StatefulSet-like pod and
    creates it again under the same name once it is gone."""

    def __init__(self, e2e: E2E, world: World, rate: float = 4.0) -> None:
        self.world, self.rate = world, rate
        self.api = _client(e2e, 10.0)
        self.outcomes: Counter[str] = Counter()
        self.messages: dict[str, str] = {}  # the first answer of each kind, for the report
        self.live: dict[str, deque[str]] = {world.exclusive: deque(), world.shared: deque()}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._slot, self._t0 = 0, time.monotonic()
        self._ids = itertools.count()
        self._threads = [threading.Thread(target=self._creator, daemon=True, name=f"burst-{i}") for i in range(2)]
        self._threads.append(threading.Thread(target=self._churn, daemon=True, name="burst-churn"))

    def start(self) -> Burst:
        for t in self._threads:
            t.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=30)
        self.api.close()

    def create(self, namespace: str, name: str, **kwargs: Any) -> int | None:
        body = gpu_pod_manifest(namespace, name, self.world.group, **kwargs)
        try:
            r = self.api.create(f"/api/v1/namespaces/{namespace}/pods", body)
        except httpx.HTTPError as exc:
            outcome, status, text = "no answer", None, repr(exc)
        else:
            status, text = r.status_code, r.text[:400]
            outcome = "created" if status == 201 else f"refused {status}{_why(text)}"
        with self._lock:
            self.outcomes[outcome] += 1
            self.messages.setdefault(outcome, text)
            if status == 201 and namespace in self.live:
                self.live[namespace].append(name)
        return status

    def _next_slot(self) -> float:
        """When this thread's next create is due; after a stall (a paused API server) the schedule moves
        on rather than firing the missed creates at once."""
        with self._lock:
            at = self._t0 + self._slot / self.rate
            now = time.monotonic()
            if now > at + 1.0:
                self._t0 += now - at
                at = now
            self._slot += 1
            return at

    def _creator(self) -> None:
        while not self._stop.wait(max(0.0, self._next_slot() - time.monotonic())):
            i = next(self._ids)
            if i % 3 == 2:
                self.create(self.world.shared, f"sh-{i:04d}", image=CUDA11)
            else:
                self.create(self.world.exclusive, f"ex-{i:04d}")

    def _churn(self) -> None:
        rounds = 0
        while not self._stop.wait(1.0):
            rounds += 1
            for ns, keep in ((self.world.exclusive, 8), (self.world.shared, 5)):
                with self._lock:
                    victim = self.live[ns].popleft() if len(self.live[ns]) > keep else None
                if victim:
                    self._delete(ns, victim)
            if rounds % 3 == 0:
                self._recreate(f"sts-{rounds // 3 % 3}")

    def _delete(self, namespace: str, name: str) -> None:
        try:
            r = self.api.delete(f"/api/v1/namespaces/{namespace}/pods/{name}")
            outcome = "deleted" if r.status_code in (200, 202, 404) else f"delete refused {r.status_code}"
        except httpx.HTTPError:
            outcome = "delete: no answer"
        with self._lock:
            self.outcomes[outcome] += 1

    def _recreate(self, name: str) -> None:
        """What the StatefulSet controller does: the old pod deleted, the new one (a new UID) created
        under the same name once the old one is gone."""
        ns = self.world.shared
        path = f"/api/v1/namespaces/{ns}/pods/{name}"
        try:
            if self.api.http.get(path).status_code == 200:
                self._delete(ns, name)
                deadline = time.monotonic() + 10
                while self.api.http.get(path).status_code != 404:
                    if time.monotonic() > deadline or self._stop.wait(0.2):
                        return
        except httpx.HTTPError:
            return
        self.create(ns, name, image=CUDA11)


# What a refusal's message says, for the scenario's line: the quota (the webhook's count or the API
# server's ResourceQuota), an unshaped pod, a quota not in force yet, the webhook unreachable.
_WHY = (("gpu-placement.io/quota); ", "OverQuota"), ("exceeded quota", "ResourceQuota"),
        ("was not shaped", "NotShaped"), ("does not exist yet", "QuotaPending"),
        ("has not been counted", "QuotaPending"), ("failed calling webhook", "webhook unreachable"))


def _why(text: str) -> str:
    return next((f" {why}" for words, why in _WHY if words in text), "")


# -- the invariants ----------------------------------------------------------------------------------

def _units(pod: Obj) -> dict[str, int]:
    units: dict[str, int] = {}
    for c in pod["spec"].get("containers", []):
        for resource, value in (c.get("resources", {}).get("limits") or {}).items():
            if resource in (GPU, SHARED):
                units[resource] = units.get(resource, 0) + int(value)
    return units


def _name(pod: Obj) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def _scheduled(pod: Obj) -> Obj:
    return next((c for c in pod.get("status", {}).get("conditions", []) if c["type"] == "PodScheduled"), {})


class Invariants:
    def __init__(self, e2e: E2E, world: World) -> None:
        self.e2e, self.world = e2e, world
        self.api = _client(e2e, 5.0)
        self.t0 = time.monotonic()
        self.violations: dict[str, list[str]] = {}
        self.samples = self.unavailable = 0
        self.bound_at: dict[str, float] = {}  # namespace/name/uid -> when first seen bound
        self.ttl = float(e2e.config().get("reservationTTLSeconds", 60))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="invariants")

    def start(self) -> Invariants:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while not self._stop.wait(0.5):
            self.check()
            if self.samples % 6 == 0:
                self.check_held()

    def check_held(self) -> dict[str, tuple[float, float]]:
        """Invariant 6: a reservation or hold still there well past its time is one nothing releases."""
        figures = held(self.e2e)
        for replica, (count, oldest) in figures.items():
            if count and oldest > self.ttl + 15:
                self._violate("held", f"{replica}: {count:.0f} reservations or quota holds, the oldest "
                                      f"{oldest:.0f} s old (released within {self.ttl:.0f} s + a list)")
        return figures

    def _violate(self, key: str, detail: str) -> None:
        seen = self.violations.setdefault(key, [])
        if len(seen) < 8 and not any(detail in s for s in seen):
            seen.append(f"[{time.monotonic() - self.t0:6.1f} s] {detail}")

    def check(self) -> list[Obj] | None:
        """One sample: the pods of the world's namespaces, the invariants 1-4 checked on them."""
        try:
            pods = [p for ns in self.world.namespaces
                    for p in self.api.get(f"/api/v1/namespaces/{ns}/pods")["items"]]
        except (httpx.HTTPError, ValueError):
            self.unavailable += 1
            return None
        self.samples += 1
        now = time.monotonic()
        units: dict[str, Counter[str]] = {}
        memory: Counter[str] = Counter()
        used: dict[str, Counter[str]] = {}
        for pod in pods:
            meta, node = pod["metadata"], pod["spec"].get("nodeName")
            asked = _units(pod)
            active = pod.get("status", {}).get("phase") not in TERMINAL
            shaped = (meta.get("annotations") or {}).get("gpu-placement.io/admitted") is not None and \
                pod["spec"].get("schedulerName") == "gpu-placement"
            if asked and not shaped:
                self._violate("unshaped", f"{_name(pod)} admitted without /mutate's shaping (schedulerName "
                                          f"{pod['spec'].get('schedulerName')}, annotations {meta.get('annotations')})")
            if active:
                used.setdefault(meta["namespace"], Counter()).update(asked)
            if not node:
                continue
            self.bound_at.setdefault(f"{_name(pod)}/{meta['uid']}", now)
            if node in self.world.unverified:
                self._violate("unverified", f"{_name(pod)} bound to {node}, whose validator is not Ready")
            if not active:
                continue
            units.setdefault(node, Counter()).update(asked)
            if node in self.world.memory:
                try:
                    mib = quantity_to_mib((meta.get("annotations") or {})["gpu-placement.io/gpu-memory"])
                except (KeyError, QuantityError):
                    mib = self.world.memory[node][1] * asked.get(SHARED, 0)
                memory[node] += mib
        for node, taken in units.items():
            for resource, count in taken.items():
                if count > self.world.capacity.get(node, {}).get(resource, 0):
                    self._violate("overcommit", f"{node} holds {count} {resource} of "
                                                f"{self.world.capacity.get(node, {}).get(resource, 0)}")
        for node, mib in memory.items():
            if mib > self.world.memory[node][0]:
                pods_there = sorted(_name(p) for p in pods if p["spec"].get("nodeName") == node)
                self._violate("overcommit", f"{node} holds {mib} MiB of GPU memory of {self.world.memory[node][0]}: "
                                            f"{pods_there}")
        for ns, quota in self.world.quotas.items():
            for resource, limit in quota.items():
                if used.get(ns, Counter())[resource] > limit:
                    self._violate("quota", f"namespace {ns} holds {used[ns][resource]} {resource}, quota {limit}")
        return pods

    def unsettled(self, pods: list[Obj]) -> list[str]:
        """Invariant 5: what is neither bound nor Pending with reason codes."""
        out = []
        for pod in pods:
            ns = pod["metadata"]["namespace"]
            if pod["spec"].get("nodeName") or ns in self.world.unscheduled or \
                    pod.get("status", {}).get("phase") in TERMINAL:
                continue
            cond = _scheduled(pod)
            said = f"PodScheduled {cond.get('status')} {cond.get('reason')}: {cond.get('message', '')[:300]}"
            if ns in self.world.must_bind:
                out.append(f"{_name(pod)} Pending though every admitted exclusive pod fits ({said})")
            elif not (cond.get("status") == "False" and cond.get("reason") == "Unschedulable"
                      and REASON.search(cond.get("message", ""))):
                out.append(f"{_name(pod)} Pending without reason codes ({said})")
        return out


def held(e2e: E2E) -> dict[str, tuple[float, float]]:
    """Invariant 6's figures, (how many, age of the oldest in s), per running replica: GPU reservations
    of each extender, quota holds of each webhook."""
    figures: dict[str, tuple[float, float]] = {}
    for pod in e2e.chart_pods():
        for container, metric in (("extender", "gpu_placement_reservation"), ("webhook", "gpu_placement_quota_hold")):
            proc = pod.procs.get(container)
            if proc is None or not proc.alive() or container not in pod.wanted:
                continue
            url = e2e.extender_url(pod) + "/metrics" if container == "extender" else e2e.webhook_url(pod, "/metrics")
            try:
                text = httpx.get(url, verify=False, timeout=5).text
            except httpx.HTTPError:
                continue  # a replica restarting: its holds went with it
            values = {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
                      if line.startswith(metric)}
            figures[f"{pod.deployment}-{pod.replica}"] = (values.get(f"{metric}s", 0.0),
                                                          values.get(f"{metric}_oldest_age_seconds", 0.0))
    return figures


# -- a scenario --------------------------------------------------------------------------------------

@dataclass
class Outcome:
    name: str
    burst: Burst
    checker: Invariants
    notes: dict[str, Any]
    fault_s: float
    probe_s: float | None  # a pod created when the fault ended: bound this long after
    settled_s: float | None
    unsettled: list[str]
    held: dict[str, tuple[float, float]]

    def line(self) -> str:
        out = self.burst.outcomes
        refused = {k.removeprefix("refused "): v for k, v in sorted(out.items()) if k.startswith("refused")}
        probe = "not bound" if self.probe_s is None else f"bound after {self.probe_s:.1f} s"
        settled = "not within 60 s" if self.settled_s is None else f"after {self.settled_s:.1f} s"
        notes = "; ".join(f"{k} {v:.1f} s" if isinstance(v, float) else f"{k}: {v}"
                          for k, v in self.notes.items() if k != "problems")
        left = {k: f"{n:.0f} (oldest {age:.0f} s)" for k, (n, age) in self.held.items() if n}
        return (f"{self.name}: fault {self.fault_s:.1f} s; pods created {out['created']}, bound "
                f"{len(self.checker.bound_at)}, refused {sum(refused.values())} {refused or ''}, no answer "
                f"{out['no answer']}; after the fault: a new pod {probe}, every pod bound or Pending with reasons "
                f"{settled}; {notes}; invariant samples {self.checker.samples} (+{self.checker.unavailable} "
                f"while the API did not answer)" + (f"; held at the end, within their time: {left}" if left else ""))

    def problems(self) -> dict[str, list[str]]:
        found = {key: list(v) for key, v in self.checker.violations.items()}
        if self.unsettled:
            found["unsettled"] = [f"{len(self.unsettled)} pods 60 s after the fault:", *self.unsettled[:10]]
        if self.notes.get("problems"):
            found["scenario"] = list(self.notes["problems"])
        return found


def _probe(e2e: E2E, world: World) -> None:
    """The recovery probe: one pod, created as soon as the API server and the webhook take it."""
    api = _client(e2e, 5.0)
    deadline = time.monotonic() + SETTLE_S
    try:
        while time.monotonic() < deadline:
            try:
                r = api.create(f"/api/v1/namespaces/{world.probe}/pods",
                               gpu_pod_manifest(world.probe, "probe", world.group))
                if r.status_code in (201, 409):
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
    finally:
        api.close()


def run_scenario(e2e: E2E, world: World, name: str, fault: Callable[[dict[str, Any]], None],
                 warm: float = 6.0, tail: float = 6.0) -> Outcome:
    """The burst and the checker, the fault `warm` s in; `fault(notes)` returns when the fault is over
    (notes: timings worth printing; notes["problems"]: the scenario's own findings). Asserts every
    invariant."""
    checker = Invariants(e2e, world).start()
    restarts = watch_restarts(e2e)
    burst = Burst(e2e, world).start()
    notes: dict[str, Any] = {"problems": []}
    probe = threading.Thread(target=_probe, args=(e2e, world), daemon=True, name="probe")
    try:
        time.sleep(warm)
        started = time.monotonic()
        try:
            fault(notes)
        finally:
            ended = time.monotonic()
            probe.start()
            time.sleep(tail)
            burst.stop()
        settled_at, unsettled = None, ["no sample of the pods answered"]
        while time.monotonic() < ended + SETTLE_S:
            pods = checker.check()
            if pods is not None:
                unsettled = checker.unsettled(pods)
                if not unsettled and any(k.startswith(f"{world.probe}/probe/") for k in checker.bound_at):
                    settled_at = time.monotonic()
                    break
            time.sleep(1.0)
        deadline = time.monotonic() + 15  # most are released by the watch within a second
        figures = held(e2e)
        while any(count for count, _ in figures.values()) and time.monotonic() < deadline:
            time.sleep(1.0)
            figures = held(e2e)
    finally:
        checker.stop()
        burst.stop()
        probe.join(timeout=SETTLE_S)
    checker.check()  # once more at the end
    checker.check_held()
    notes["extender watch restarts"] = dict(watch_restarts(e2e) - restarts) or "none"
    probe_at = [t - ended for k, t in checker.bound_at.items() if k.startswith(f"{world.probe}/probe/")]
    outcome = Outcome(name, burst, checker, notes, ended - started, probe_at[0] if probe_at else None,
                      None if settled_at is None else settled_at - ended, unsettled, figures)
    SUMMARY.append(outcome.line())
    print("\n" + outcome.line())
    for ns in world.namespaces:  # Pending pods would keep kube-scheduler retrying for the tests after
        e2e.api.delete(f"/api/v1/namespaces/{ns}")
    _judge(outcome)
    return outcome


def _judge(outcome: Outcome) -> None:
    problems = outcome.problems()
    if problems:
        pytest.fail("\n".join([f"scenario {outcome.name}: invariants broken", outcome.line()]
                              + [f"  {key}: " + "\n    ".join(lines) for key, lines in problems.items()]
                              + [f"  first answer of each kind: {outcome.burst.messages}"]), pytrace=False)


def watch_restarts(e2e: E2E) -> Counter[str]:
    """The leading extender's watch restarts so far, by cause (every kind summed): what its logs and
    gpu_placement_watch_restarts_total show an operator of each fault."""
    try:
        text = httpx.get(f"{e2e.extender_url()}/metrics", timeout=5).text
    except httpx.HTTPError:
        return Counter()
    out: Counter[str] = Counter()
    for line in text.splitlines():
        if line.startswith("gpu_placement_watch_restarts_total{"):
            cause = re.search(r'cause="([^"]*)"', line)
            out[cause.group(1) if cause else "?"] += int(float(line.rsplit(" ", 1)[1]))
    return out


def lease_holder(e2e: E2E, name: str) -> str:
    lease = e2e.api.get(f"/apis/coordination.k8s.io/v1/namespaces/gpu-placement/leases/{name}")
    return str(lease.get("spec", {}).get("holderIdentity") or "")


def pod_by_pid(pods: list[Pod], container: str, identity: str) -> Pod | None:
    """The replica whose process is `identity` (`<hostname>-<pid>`, the webhook's Lease identity): a
    container from the image has its pod's name as hostname; a process from source, this host's."""
    def holds(pod: Pod) -> bool:
        proc = pod.procs.get(container)
        if isinstance(proc, Container):
            return identity.rpartition("-")[0] == f"{pod.deployment}-{pod.replica}"
        return proc is not None and proc.popen is not None and identity.endswith(f"-{proc.popen.pid}")
    return next((p for p in pods if holds(p)), None)
