"""Kubernetes Events where a person looks first (`kubectl describe node|namespace|pod`), written in the
background, never on a request path.

What is written, and why there:

- **Node**: gpu-placement's verdict for a GPU node changed (it keeps GPU pods off the node, and why; or
  takes them again). Every replica sees the same change, so only the holder of a Lease writes these
  (`--events-lease`): a standby's copies would be duplicates.
- **Node**, too: a launch fence began (GPU pods of a resource failed to start there for the node's reasons,
  in a row: a Warning naming the cause and since when) or was lifted (a Normal naming the evidence);
  docs/rules.md, LaunchFailures. Lease-held like the verdicts.
- **Namespace**: its gpu-placement settings do nothing (a misspelt key, a GPU policy the webhook never
  sees, a label `True`): the same problems as `gpu_placement_namespace_policy_problems`. Lease-held too.
- **Pod**: the warnings the webhook gave when it admitted the pod (a misspelt annotation, audit mode's
  would-be denial). A warning reaches only whoever created the pod, and a controller (ReplicaSet, Job)
  drops it; the Event puts it on the pod. An admission webhook cannot write an Event about a pod that
  does not exist yet, and the API server may still refuse the create after /validate: so the replica
  that validated the pod notes the warnings (a bounded dict, no I/O) and writes the Event once its view
  sees the pod created, matched by the uid the API server gave the pod (`PodWarnings`: a forged review,
  which anyone who reaches the webhook port can post, names no pod that will be created). Only that
  replica knows them, so no Lease is needed and none is duplicated.
  A *refused* pod never exists: its denial message goes to its creator, and a controller records it as
  a `FailedCreate` Warning on the workload (pkg/controller/controller_utils.go, FailedCreatePodReason),
  which is where `kubectl describe deploy|job` shows it; another Event would repeat it.

Aggregation and rate limits follow client-go: events.k8s.io/v1 series as its events broadcaster keeps
them (k8s.io/client-go tools/events event_broadcaster.go recordToSink: an Event isomorphic to one of the
last `finishTime` (6 minutes), keyed by type, reason, action, reporting controller and instance, and
regarding object, becomes a series: its count and lastObservedTime are patched instead of a new Event),
and the spam filter of tools/record (EventSourceObjectSpamFilter: per object a token bucket of 25,
refilled one per 5 minutes), so a flapping node cannot flood the API server. The queue to the writer is
bounded; what does not fit is dropped and counted (`gpu_placement_events_total{outcome}`).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from prometheus_client import Counter

from gpu_placement.base.config import Config
from gpu_placement.decide.fences import Fences
from gpu_placement.decide.rules import LAUNCH_FAILURES, launch_failures, node_readiness
from gpu_placement.facts.fence import Fence
from gpu_placement.facts.namespaces import NamespaceRecord
from gpu_placement.facts.pods import PodRecord
from gpu_placement.view.cluster import ClusterView

__all__ = ["CONTROLLER", "EVENTS", "EventItem", "EventWriter", "PodWarnings", "Regarding", "watch_fences",
           "watch_namespaces", "watch_nodes"]

log = logging.getLogger("gpu_placement.events")
CONTROLLER = "gpu-placement.io/gpu-placement"  # reportingController: a domain-qualified name, as the API requires
EVENTS = Counter("gpu_placement_events_total", "Kubernetes Events gpu-placement wrote or did not, by outcome: "
                 "created, series (an isomorphic Event's count raised), limited (the per-object spam filter), "
                 "dropped (the queue was full), standby (not the Lease holder), failed.", ["outcome"])
FINISH_SECONDS = 6 * 60.0  # client-go tools/events finishTime: a series ends after this long without a repeat
_BURST, _REFILL_SECONDS = 25, 300.0  # client-go tools/record EventSourceObjectSpamFilter defaults
_NOTE_LIMIT = 1024  # events.k8s.io/v1 validation: note is at most 1 kB


@dataclass(slots=True, frozen=True)
class Regarding:
    kind: str
    name: str
    namespace: str = ""
    uid: str = ""
    api_version: str = "v1"

    def reference(self) -> dict[str, str]:
        ref = {"apiVersion": self.api_version, "kind": self.kind, "name": self.name}
        if self.namespace:
            ref["namespace"] = self.namespace
        if self.uid:
            ref["uid"] = self.uid
        return ref


@dataclass(slots=True, frozen=True)
class EventItem:
    regarding: Regarding
    type: str  # Normal or Warning
    reason: str  # UpperCamelCase, e.g. GpuNodeUnusable
    action: str  # what gpu-placement did or decided, e.g. the reason code
    note: str
    leased: bool = True  # written by the Lease holder only (every replica sees it); False: by whoever saw it


@dataclass(slots=True)
class _Series:
    name: str
    namespace: str
    count: int
    last: float


@dataclass(slots=True)
class _Bucket:
    tokens: float
    at: float


@dataclass
class EventWriter:
    """Writes EventItems on a thread of its own. `lease`: an object with `acquire() -> bool` (gpu_placement.kube.lease
    Lease) that leased items wait for; None writes them all (a single replica, tests)."""

    api: Any
    instance: str  # reportingInstance: this replica
    lease: Any = None
    clock: Callable[[], float] = time.time
    max_queue: int = 1000
    renew_seconds: float = 10.0
    _queue: queue.Queue[EventItem | None] = field(init=False)
    _series: dict[tuple[str, str, str, Regarding], _Series] = field(default_factory=dict, init=False)
    _buckets: OrderedDict[Regarding, _Bucket] = field(default_factory=OrderedDict, init=False)
    _leading_until: float = field(default=0.0, init=False)
    _last_ns: int = field(default=0, init=False)
    _thread: threading.Thread | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._queue = queue.Queue(self.max_queue)

    def emit(self, item: EventItem) -> None:
        """Never blocks: called from view listeners under the view's lock."""
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            EVENTS.labels("dropped").inc()

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="events", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def drain(self, timeout: float = 10.0) -> None:
        """For tests: wait until every queued item was handled."""
        deadline = time.monotonic() + timeout
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.02)

    def _run(self) -> None:
        while True:
            try:
                item = self._queue.get(timeout=self.renew_seconds)
            except queue.Empty:
                self._leading()  # keep the Lease while quiet, so a standby does not take it for nothing
                self._forget(self.clock())
                continue
            try:
                if item is None:
                    return
                self.write(item)
            except Exception:  # the writer must outlive any one Event
                log.exception("writing an Event failed")
                EVENTS.labels("failed").inc()
            finally:
                self._queue.task_done()

    def _leading(self) -> bool:
        if self.lease is None:
            return True
        now = self.clock()
        if now < self._leading_until:
            return True
        try:
            held = bool(self.lease.acquire())
        except Exception as exc:
            log.warning("events Lease could not be renewed: %s", exc)
            held = False
        self._leading_until = now + self.renew_seconds if held else 0.0
        return held

    def write(self, item: EventItem) -> None:
        """One Event: a new one, or the next in an isomorphic series; what the spam filter lets through."""
        if item.leased and not self._leading():
            EVENTS.labels("standby").inc()
            return
        now = self.clock()
        if not self._allowed(item.regarding, now):
            EVENTS.labels("limited").inc()
            return
        key = (item.type, item.reason, item.action, item.regarding)
        series = self._series.get(key)
        if series is not None and now - series.last < FINISH_SECONDS:
            series.count += 1
            series.last = now
            if self._patch_series(series, now):
                EVENTS.labels("series").inc()
                return
        name = self._create(item, now)
        if name is not None:
            self._series[key] = _Series(name, _namespace_of(item.regarding), 1, now)
            EVENTS.labels("created").inc()

    def _allowed(self, regarding: Regarding, now: float) -> bool:
        bucket = self._buckets.pop(regarding, None) or _Bucket(float(_BURST), now)
        bucket.tokens = min(float(_BURST), bucket.tokens + (now - bucket.at) / _REFILL_SECONDS)
        bucket.at = now
        self._buckets[regarding] = bucket
        if len(self._buckets) > 4096:  # client-go's LRU is 4096 objects too
            self._buckets.popitem(last=False)
        if bucket.tokens < 1:
            return False
        bucket.tokens -= 1
        return True

    def _create(self, item: EventItem, now: float) -> str | None:
        from gpu_placement.kube.api import OBJECT_TIMEOUT, api_error, drain, request

        namespace = _namespace_of(item.regarding)
        self._last_ns = max(time.time_ns(), self._last_ns + 1)  # unique even for Events made in one nanosecond
        name = f"{item.regarding.name}.{self._last_ns:x}"[:253]  # client-go GenerateEventName: name.unixnano
        stamp = _micro(now)
        body = {"apiVersion": "events.k8s.io/v1", "kind": "Event",
                "metadata": {"name": name, "namespace": namespace},
                "eventTime": stamp, "reportingController": CONTROLLER, "reportingInstance": self.instance[:128],
                "action": item.action[:128], "reason": item.reason[:128], "type": item.type,
                "regarding": item.regarding.reference(), "note": _cut(item.note)}
        response = request(self.api, "POST", f"/apis/events.k8s.io/v1/namespaces/{namespace}/events", body=body,
                           timeout=OBJECT_TIMEOUT)
        if response.status >= 300:
            error = api_error(response)
            log.warning("Event %s/%s about %s %s not written: %s", namespace, item.reason, item.regarding.kind,
                        item.regarding.name, error)
            EVENTS.labels("failed").inc()
            return None
        drain(response)
        return name

    def _patch_series(self, series: _Series, now: float) -> bool:
        """client-go patches the series onto the Event it first wrote; gone (404): a new one is made."""
        from gpu_placement.kube.api import OBJECT_TIMEOUT, drain, request

        patch = {"series": {"count": series.count, "lastObservedTime": _micro(now)}}
        response = request(self.api, "PATCH", f"/apis/events.k8s.io/v1/namespaces/{series.namespace}/events/"
                           f"{series.name}", body=patch, timeout=OBJECT_TIMEOUT,
                           content_type="application/merge-patch+json")
        drain(response)
        return response.status < 300

    def _forget(self, now: float) -> None:
        for key in [k for k, s in self._series.items() if now - s.last >= FINISH_SECONDS]:
            del self._series[key]


def _namespace_of(regarding: Regarding) -> str:
    """Events about cluster-scoped objects go to `default`, as client-go's makeEvent puts them."""
    return regarding.namespace or "default"


def _micro(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _cut(note: str) -> str:
    encoded = note.encode()
    if len(encoded) <= _NOTE_LIMIT:
        return note
    return encoded[:_NOTE_LIMIT - 3].decode("utf-8", "ignore") + "..."


# -- feeds: what the view's changes become -----------------------------------------------------------

def watch_nodes(view: ClusterView, config: Config, writer: EventWriter) -> Callable[[str | None], None]:
    """A Node Event each time gpu-placement's verdict on a GPU node changes (none for the first one seen:
    a restart is not a change). Cheap under the view's lock: a readiness check and a dict compare."""
    verdicts: dict[str, str] = {}

    def on_node(name: str | None) -> None:
        for node in (list({*view.nodes, *verdicts}) if name is None else [name]):
            facts = view.nodes.get(node)
            if facts is None or (not facts.gpu_present and not any(facts.capacity.values())):
                verdicts.pop(node, None)
                continue
            rejection = node_readiness(facts, view.validator_state(node), config)
            verdict = "OK" if rejection is None else rejection.code
            before = verdicts.get(node)
            verdicts[node] = verdict
            if before is None or before == verdict:
                continue
            regarding = Regarding("Node", node, uid=getattr(facts, "uid", "") or "")
            if rejection is None:
                writer.emit(EventItem(regarding, "Normal", "GpuNodeUsable", "Usable",
                                      f"gpu-placement takes GPU pods on node {node} again (it was {before})"))
            else:
                why = rejection.message.split(": ", 1)[-1]  # the message leads with its code, the action here
                writer.emit(EventItem(regarding, "Warning", "GpuNodeUnusable", verdict,
                                      f"gpu-placement keeps GPU pods off node {node}: {why}"))

    with view.lock:
        view.subscribe(on_node, lambda name: None)
        on_node(None)
    return on_node


_LIFTED_BY = {"validator": "the GPU Operator revalidated the node (a validator pod turned Ready)",
              "plugin": "the device plugin's pod was recreated or restarted",
              "driver": "the driver's pod was recreated or restarted", "reboot": "the node rebooted",
              "started": "a GPU pod started there (the probe)"}


def watch_fences(fences: Fences, writer: EventWriter) -> None:
    """A Warning on the Node when a launch fence begins (GPU pods of a resource failed to start there for the
    node's reasons, in a row), a Normal one when evidence lifts it. None for the fences found at start: a
    restart is not a change (the fences are in the cluster: gpu_placement/decide/fences.py)."""
    def on_fence(node: str, fence: Fence, lifted_by: str | None) -> None:
        facts = fences.view.nodes.get(node)
        regarding = Regarding("Node", node, uid=getattr(facts, "uid", "") or "")
        if lifted_by is None:
            why = launch_failures(fence).message.split(": ", 1)[-1]
            writer.emit(EventItem(regarding, "Warning", "GpuLaunchFenced", LAUNCH_FAILURES,
                                  f"gpu-placement keeps {fence.resource} pods off node {node}: {why}"))
        else:
            writer.emit(EventItem(regarding, "Normal", "GpuLaunchFenceLifted", "Lifted",
                                  f"gpu-placement takes {fence.resource} pods on node {node} again: "
                                  f"{_LIFTED_BY.get(lifted_by, lifted_by)} after {fence.count} failed to start "
                                  f"({fence.cause})"))

    fences.watch(on_fence)


ProblemsOf = Callable[[NamespaceRecord], dict[str, list[str]]]


def watch_namespaces(view: ClusterView, writer: EventWriter, problems_of: ProblemsOf) -> None:
    """A Warning on a Namespace whose gpu-placement settings do nothing, when it starts (or changes) and at
    start for the ones that already have such problems; one Event per kind of problem."""
    seen: dict[str, dict[str, list[str]]] = {}

    def on_namespace(name: str, record: NamespaceRecord | None) -> None:
        found = problems_of(record) if record is not None else {}
        before = seen.pop(name, {})
        if found:
            seen[name] = found
        for kind, sentences in found.items():
            if before.get(kind) != sentences:
                regarding = Regarding("Namespace", name, name, record.uid if record is not None else "")
                writer.emit(EventItem(regarding, "Warning", "GpuPolicyIgnored", kind, "; ".join(sentences)))

    with view.lock:
        view.subscribe_namespaces(on_namespace)
        for name, record in list(view.namespaces.items()):
            on_namespace(name, record)


@dataclass(slots=True)
class _Noted:
    key: str  # namespace/name the review named: the pod must have it too
    note: str  # the warnings, joined and cut to an Event's note
    made: float


class PodWarnings:
    """The webhook's warnings for pods it admitted, until the view sees the pod created: then one Warning
    Event on the pod.

    Only on the pod that review created. The webhook port answers anyone (docs/webhook.md, "Who may hold
    quota"), so a forged review may name any pod. The warnings are kept by the pod's uid, which
    kube-apiserver gives the object before it calls validating webhooks (v1.37.2
    staging/src/k8s.io/apiserver/pkg/registry/generic/registry/store.go `create`: FillObjectMetaSystemFields,
    a random UUID, then createValidation) and stores with it; the review's own request.uid is another UUID
    per webhook call (admission/plugin/webhook/request/admissionreview.go) that no object carries. They are
    written when the view first sees a pod with that uid and that namespace/name, and dropped if the view
    has that pod already when the review comes (a pod being created is not stored yet): a forger would
    need the uid of a pod before the API server has stored it. One Event per uid.

    Bounded by the peer that sent the review (`source`), which a forger cannot take: at most `per_source`
    a peer (its oldest go first), `limit` in all (the oldest of the peer holding the most go first: never
    the API server's handful in flight), and none kept past `ttl` seconds (a pod shows up within seconds
    of its /validate, or its create failed; 5 minutes cover a watch that went silent and relisted). Each is
    at most an Event's note (1 kB)."""

    def __init__(self, view: ClusterView, writer: EventWriter, limit: int = 10_000, per_source: int = 1_000,
                 ttl: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.view, self.writer = view, writer
        self.limit, self.per_source, self.ttl, self.clock = limit, per_source, ttl, clock
        self._by_source: dict[str, OrderedDict[str, _Noted]] = {}  # peer -> pod uid -> its warnings
        self._source_of: dict[str, str] = {}  # pod uid -> peer
        self._lock = threading.Lock()
        with view.lock:
            view.subscribe_records(self._pod_changed, lambda name, record: None)

    def __len__(self) -> int:
        return len(self._source_of)

    def admitted(self, namespace: str, name: str, uid: str, warnings: list[str], source: str = "") -> None:
        """From /validate of a pod CREATE allowed with warnings, not a dry run: a dict insert, no I/O.
        `uid`: the pod's metadata.uid in the review; `source`: the peer's address."""
        if not name or not uid or not warnings or name.endswith("*"):
            return  # no uid: not what the API server sends to validating webhooks, nothing to match
        key = f"{namespace}/{name}"
        seen = self.view.pods.get(key)  # one dict read: the view's lock is not needed
        if seen is not None and seen.uid == uid:
            return  # stored already: not the review of its create
        noted = _Noted(key, _cut(f"admitted by gpu-placement with warnings: {' | '.join(warnings)}"), self.clock())
        with self._lock:
            self._expire(noted.made)
            previous = self._source_of.pop(uid, None)
            if previous is not None:
                self._by_source[previous].pop(uid, None)
            entries = self._by_source.setdefault(source, OrderedDict())
            entries[uid] = noted
            self._source_of[uid] = source
            while len(entries) > self.per_source:
                self._source_of.pop(entries.popitem(last=False)[0], None)
            while len(self._source_of) > self.limit:
                largest = max(self._by_source.values(), key=len)
                self._source_of.pop(largest.popitem(last=False)[0], None)

    def _expire(self, now: float) -> None:
        for source, entries in list(self._by_source.items()):
            while entries and now - next(iter(entries.values())).made > self.ttl:
                self._source_of.pop(entries.popitem(last=False)[0], None)
            if not entries:
                del self._by_source[source]

    def _pod_changed(self, key: str, record: PodRecord | None) -> None:
        """View listener (under the view's lock, for every pod): one dict lookup unless it is a pod noted."""
        if record is None or record.uid not in self._source_of:
            return
        with self._lock:
            source = self._source_of.pop(record.uid, None)
            noted = self._by_source[source].pop(record.uid, None) if source is not None else None
        if noted is None or noted.key != key:
            return  # another pod's uid under this name: not the pod reviewed
        regarding = Regarding("Pod", record.name, record.namespace, record.uid)
        self.writer.emit(EventItem(regarding, "Warning", "GpuPlacementWarning", "Admitted", noted.note, leased=False))
