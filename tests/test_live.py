"""The live source against the fake API server, through the real `kubernetes` client and our own
list+watch loop (docs/live.md): paged lists, readiness, events, decisions following labels,
cut streams, 410 Gone, an API server that goes away and comes back, slow answers, bookmarks."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpu_placement.base.config import Config
from gpu_placement.decide.placement import FilterResult, Placement
from gpu_placement.kube.api import KubeConfigError, WatchSettings, load_api_client
from gpu_placement.observe import metrics
from gpu_placement.samples.cluster import make_node, make_pod, namespace, validator_pod
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from gpu_placement.view.live import LiveSource
from tests.fakeapi import FakeApiServer
from tests.support.live import FAST
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(30)

GPU = "nvidia.com/gpu"


def gauge(metric: Any, *labels: str) -> float:
    return float((metric.labels(*labels) if labels else metric)._value.get())


def cluster(nodes: int = 10, pods_per_node: int = 1) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = [namespace("team-a", {"gpu-placement.io/gpu-memory": "10Gi"})]
    for i in range(nodes):
        node = f"gpu-{i:02d}"
        objects += [make_node(node, "h100x8"), validator_pod(node)]
        objects += [make_pod("team-a", f"job-{i:02d}-{j}", gpus={GPU: 1}, node=node) for j in range(pods_per_node)]
    return objects


class Harness:
    def __init__(self, fake: FakeApiServer, settings: WatchSettings = FAST) -> None:
        self.fake = fake
        self.config = Config()
        self.view = ClusterView(self.config)
        self.api = fake.api_client()
        self.source = LiveSource(self.view, Ingest(self.config), self.api, settings)

    def start(self, ready: bool = True) -> Harness:
        self.source.start()
        if ready:
            wait_for(lambda: self.source.ready, what="the first full lists")
            self.fake.wait_for_watches(len(self.source.kinds))
        return self

    def stop(self) -> None:
        self.source.stop()
        self.api.close()

    def watches_from(self, path: str) -> list[str]:
        return [r.query.get("resourceVersion", "") for r in self.fake.requests_log
                if r.verb == "watch" and r.path == path]

    def lists(self, path: str | None = None) -> int:
        return self.fake.count("list", path)


@pytest.fixture
def live(fake_api: FakeApiServer) -> Iterator[Callable[..., Harness]]:
    made: list[Harness] = []

    def make(settings: WatchSettings = FAST, objects: list[dict[str, Any]] | None = None,
             ready: bool = True) -> Harness:
        fake_api.load(cluster() if objects is None else objects)
        harness = Harness(fake_api, settings)
        made.append(harness)
        return harness.start(ready)

    yield make
    for harness in made:
        harness.stop()
    gc.unfreeze()  # the source froze the test process's heap; give it back to the collector
    leftover = [t.name for t in threading.enumerate() if t.name.startswith("watch-")]
    assert leftover == [], f"threads left running: {leftover}"


# -- lists and readiness ---------------------------------------------------------------------------

def test_initial_list_is_paged_and_complete(live: Callable[..., Harness]) -> None:
    h = live()
    assert len(h.view.nodes) == 10
    assert len(h.view.pods) == 20  # a validator and a job per node
    assert {"team-a", "default", "kube-system"} <= h.view.namespaces.keys()
    pages = [r for r in h.fake.requests_log if r.verb == "list" and r.path == "/api/v1/nodes"]
    assert len(pages) == 4 and all(r.query["limit"] == "3" for r in pages)  # 10 nodes, 3 a page
    assert [("continue" in r.query) for r in pages] == [False, True, True, True]
    assert h.source.readiness() == (True, "")
    wait_for(lambda: gc.get_freeze_count() > 0, what="the heap frozen after the first full lists")
    watch = next(r for r in h.fake.requests_log if r.verb == "watch" and r.path == "/api/v1/pods")
    assert watch.query["allowWatchBookmarks"] == "true" and watch.query["timeoutSeconds"] == "30"


def test_not_ready_until_every_kind_is_listed(live: Callable[..., Harness], fake_api: FakeApiServer) -> None:
    # The pods list fails until the test has looked (a fixed number of 503s ran out in about a second
    # of backoff: a test thread slower than that under load found the source ready already).
    fake_api.fail_next(10_000, 503, path="/api/v1/pods")
    h = live(ready=False)
    wait_for(lambda: {"nodes", "namespaces"} <= h.view.listed, what="nodes and namespaces listed")
    ready, why = h.source.readiness()
    assert not ready and "waiting for the first full list of pods" in why
    wait_for(lambda: h.source.last_error, what="the pods failure")
    assert "503" in (h.source.readiness()[1]) and gauge(metrics.SOURCE_UP) == 0
    wait_for(lambda: fake_api.count("list", "/api/v1/pods") >= 3, what="the pods list retried")
    assert not h.source.ready
    fake_api.stop_failing()
    wait_for(lambda: h.source.ready, what="pods listed after the 503s")
    assert h.source.readiness() == (True, "") and h.source.last_error is None
    wait_for(lambda: gauge(metrics.SOURCE_UP) == 1, what="SOURCE_UP 1")


def test_expired_continue_token_starts_the_list_again(live: Callable[..., Harness], fake_api: FakeApiServer) -> None:
    fake_api.fail_next(1, 410, path="/api/v1/nodes", message="The provided continue parameter is too old")
    before = gauge(metrics.WATCH_RESTARTS, "nodes", "gone")
    h = live()
    assert len(h.view.nodes) == 10
    assert gauge(metrics.WATCH_RESTARTS, "nodes", "gone") == before + 1


# -- events ----------------------------------------------------------------------------------------

def test_added_modified_deleted_are_applied(live: Callable[..., Harness], fake_api: FakeApiServer) -> None:
    h = live()
    fake_api.add(make_node("gpu-new", "h100"))
    fake_api.add(make_pod("team-a", "pending", gpus={GPU: 1}))
    fake_api.delete("Pod", "job-03-0", "team-a")
    fake_api.set_annotations("Namespace", "team-a", {"gpu-placement.io/gpu-memory": "20Gi"})
    wait_for(lambda: "gpu-new" in h.view.nodes and "team-a/pending" in h.view.pods
             and "team-a/job-03-0" not in h.view.pods, what="ADDED and DELETED applied")
    wait_for(lambda: h.view.namespaces["team-a"].get("gpu-placement.io/gpu-memory") == "20Gi",
             what="the namespace annotation")
    assert h.view.pods["team-a/pending"].node is None
    fake_api.bind("team-a", "pending", "gpu-new")  # MODIFIED: now bound
    wait_for(lambda: h.view.pods["team-a/pending"].node == "gpu-new", what="the pod bound")
    fake_api.delete("Node", "gpu-new")
    wait_for(lambda: "gpu-new" not in h.view.nodes, what="the node deleted")
    assert gauge(metrics.WATCH_EVENTS, "pods", "MODIFIED") >= 1


def test_decisions_follow_a_driver_upgrade_label_within_a_second(live: Callable[..., Harness],
                                                                 fake_api: FakeApiServer) -> None:
    h = live()
    placement = Placement(h.view, h.config)
    req = placement.requirements(make_pod("team-a", "trainer", gpus={GPU: 1}))
    names = ["gpu-00", "gpu-01"]
    assert sorted(placement.filter(req, names).passed) == names  # passed: in no particular order
    fake_api.patch_labels("Node", "gpu-01", {"nvidia.com/gpu-driver-upgrade-state": "drain-required"})
    start = time.monotonic()

    def rejected() -> FilterResult | None:
        result = placement.filter(req, names)
        return result if "gpu-01" in result.unresolvable else None

    result = wait_for(rejected, timeout=1.0, what="gpu-01 rejected")
    assert time.monotonic() - start < 1.0
    assert result.unresolvable["gpu-01"].startswith("DriverUpgrade") and result.passed == ["gpu-00"]
    fake_api.patch_labels("Node", "gpu-01", {"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"})
    wait_for(lambda: sorted(placement.filter(req, names).passed) == names, timeout=1.0, what="gpu-01 back")


def test_events_for_objects_the_view_never_had(live: Callable[..., Harness], fake_api: FakeApiServer) -> None:
    h = live()
    h.view.delete_pod("team-a/job-01-0")  # as if the list had never carried it
    h.view.delete_pod("team-a/job-02-0")
    fake_api.set_annotations("Pod", "job-01-0", {"touched": "yes"}, namespace="team-a")  # MODIFIED of unknown
    fake_api.delete("Pod", "job-02-0", "team-a")  # DELETED of unknown
    fake_api.add(make_node("after", None))  # and the stream goes on
    wait_for(lambda: "after" in h.view.nodes and "team-a/job-01-0" in h.view.pods, what="events applied")
    assert h.view.pods["team-a/job-01-0"].node == "gpu-01"
    assert "team-a/job-02-0" not in h.view.pods
    assert h.source.last_error is None


# -- recovery --------------------------------------------------------------------------------------

def test_cut_stream_resumes_from_the_last_version_without_relisting(live: Callable[..., Harness],
                                                                   fake_api: FakeApiServer) -> None:
    h = live()
    fake_api.patch_labels("Node", "gpu-02", {"pool": "a"})
    wait_for(lambda: h.source.resource_versions["nodes"] == fake_api.resource_version, what="the event seen")
    seen = h.source.resource_versions["nodes"]
    fake_api.clear_log()
    assert fake_api.cut_watches() == 3
    wait_for(lambda: h.watches_from("/api/v1/nodes"), what="a new nodes watch")
    assert h.watches_from("/api/v1/nodes") == [seen]
    fake_api.patch_labels("Node", "gpu-02", {"pool": "b"})
    wait_for(lambda: h.view.nodes["gpu-02"] and h.source.resource_versions["nodes"] == fake_api.resource_version,
             what="events after the resume")
    assert h.lists() == 0  # resumed, not relisted


def test_gone_relists_and_drops_what_was_deleted_meanwhile(live: Callable[..., Harness],
                                                          fake_api: FakeApiServer) -> None:
    h = live()
    gone_before = gauge(metrics.WATCH_RESTARTS, "pods", "gone")
    fake_api.down()
    fake_api.delete("Pod", "job-04-0", "team-a")  # while nobody watches
    fake_api.delete("Node", "gpu-09")
    fake_api.compact()  # and the history that would have told us is gone
    fake_api.clear_log()
    fake_api.up()
    wait_for(lambda: "team-a/job-04-0" not in h.view.pods and "gpu-09" not in h.view.nodes,
             what="the relisted view")
    assert h.lists("/api/v1/pods") >= 1 and h.lists("/api/v1/nodes") >= 1
    assert gauge(metrics.WATCH_RESTARTS, "pods", "gone") == gone_before + 1
    assert len(h.view.nodes) == 9 and "team-a/job-05-0" in h.view.pods


def test_http_410_on_the_watch_request_relists(live: Callable[..., Harness], fake_api: FakeApiServer) -> None:
    h = live()
    fake_api.clear_log()
    fake_api.fail_next(1, 410, method="GET", path="/api/v1/namespaces", message="too old resource version: 1 (2)")
    fake_api.cut_watches()
    wait_for(lambda: h.lists("/api/v1/namespaces") >= 1 and h.source.resource_versions["namespaces"],
             what="a namespaces relist")
    assert h.lists("/api/v1/nodes") == 0  # only the kind that was told so


def test_api_server_down_keeps_the_view_then_converges(live: Callable[..., Harness],
                                                       fake_api: FakeApiServer) -> None:
    h = live()
    wait_for(lambda: gauge(metrics.SOURCE_UP) == 1, what="SOURCE_UP 1")
    placement = Placement(h.view, h.config)
    req = placement.requirements(make_pod("team-a", "trainer", gpus={GPU: 1}))
    fake_api.down()
    wait_for(lambda: gauge(metrics.SOURCE_UP) == 0, what="SOURCE_UP 0")
    fake_api.patch_labels("Node", "gpu-05", {"nvidia.com/gpu-driver-upgrade-state": "drain-required"})
    fake_api.add(make_node("gpu-late", "h100"))
    down_until = time.monotonic() + 2.0
    while time.monotonic() < down_until:  # ~2 s of outage: the last view keeps serving decisions
        assert len(h.view.nodes) == 10 and h.source.readiness() == (True, "")
        assert "gpu-05" in placement.filter(req, ["gpu-05"]).passed
        time.sleep(0.1)
    assert "unreachable" in (h.source.last_error or "")
    fake_api.up()
    wait_for(lambda: "gpu-late" in h.view.nodes, what="the view to converge")
    wait_for(lambda: "gpu-05" in placement.filter(req, ["gpu-05"]).unresolvable, what="the label seen")
    wait_for(lambda: gauge(metrics.SOURCE_UP) == 1, what="SOURCE_UP back to 1")
    assert h.source.last_error is None


def test_slow_answers_below_the_read_timeout_still_work(live: Callable[..., Harness],
                                                        fake_api: FakeApiServer) -> None:
    fake_api.delay = 0.4  # every request, lists and watches, waits this long (read timeout 2 s)
    h = live(ready=False)
    wait_for(lambda: h.source.ready, what="lists through a slow API server")
    fake_api.patch_labels("Node", "gpu-01", {"slow": "yes"})
    wait_for(lambda: h.source.resource_versions["nodes"] == fake_api.resource_version, what="the event")
    assert h.source.last_error is None and h.fake.count("list", "/api/v1/nodes") == 4


def test_answers_slower_than_the_read_timeout_are_retried(fake_api: FakeApiServer) -> None:
    fake_api.load(cluster(2))
    fake_api.delay = 0.6
    settings = WatchSettings(connect_timeout=1.0, read_timeout=0.3, server_timeout=30, client_timeout=35.0,
                             backoff_initial=0.05, backoff_max=0.2)
    h = Harness(fake_api, settings).start(ready=False)
    try:
        wait_for(lambda: "did not answer within 0.3 s" in (h.source.last_error or ""), what="the timeout")
        assert not h.source.ready
        fake_api.delay = 0.0
        wait_for(lambda: h.source.ready, what="ready once the server is fast again")
    finally:
        h.stop()
        gc.unfreeze()


def test_retry_after_waits(fake_api: FakeApiServer) -> None:
    fake_api.load(cluster(2))
    fake_api.fail_next(1, 429, retry_after=1, path="/api/v1/nodes")
    h = Harness(fake_api, WatchSettings(server_timeout=30, client_timeout=35.0, backoff_initial=0.05, backoff_max=2.0))
    start = time.monotonic()
    h.start(ready=True)
    try:
        assert time.monotonic() - start >= 0.9  # 1 s asked, the backoff alone would be 0.05 s
        assert fake_api.count("list", "/api/v1/nodes") == 2  # the refused first page, then the one page
        assert gauge(metrics.WATCH_RESTARTS, "nodes", "throttled") >= 1
    finally:
        h.stop()
        gc.unfreeze()


def test_bookmarks_move_the_resume_point(live: Callable[..., Harness], fake_api: FakeApiServer) -> None:
    h = live()
    fake_api.patch_labels("Node", "gpu-00", {"x": "1"})  # the global version moves; no pod changes
    target = fake_api.resource_version
    bookmarks = gauge(metrics.WATCH_EVENTS, "pods", "BOOKMARK")
    wait_for(lambda: h.source.resource_versions["pods"] == target, what="a pods bookmark at the new version")
    assert gauge(metrics.WATCH_EVENTS, "pods", "BOOKMARK") > bookmarks
    fake_api.clear_log()
    fake_api.cut_watches()
    wait_for(lambda: h.watches_from("/api/v1/pods"), what="the pods watch again")
    assert h.watches_from("/api/v1/pods") == [target]


def test_a_silent_watch_is_noticed_within_two_bookmark_intervals(live: Callable[..., Harness],
                                                                 fake_api: FakeApiServer) -> None:
    """A half-open connection: the stream stays open but nothing comes, not even bookmarks. The watch
    gives up after two bookmark intervals of silence and resumes where it was, missing nothing."""
    interval = fake_api.bookmark_interval
    settings = WatchSettings(connect_timeout=1.0, read_timeout=2.0, server_timeout=30, bookmark_interval=interval,
                             client_timeout=2 * interval, backoff_initial=0.05, backoff_max=0.3)
    h = live(settings)
    restarts = gauge(metrics.WATCH_RESTARTS, "pods", "stalled")
    bookmarks = gauge(metrics.WATCH_EVENTS, "pods", "BOOKMARK")
    # Healthy and quiet: bookmarks keep the stream alive. Three more, one an interval: more than the two
    # intervals of silence that would have ended it.
    wait_for(lambda: gauge(metrics.WATCH_EVENTS, "pods", "BOOKMARK") >= bookmarks + 3, 6 * interval,
             "three bookmarks on the quiet stream")
    assert gauge(metrics.WATCH_RESTARTS, "pods", "stalled") == restarts
    fake_api.clear_log()
    assert fake_api.stall_watches("pods") == 1
    start = time.monotonic()
    fake_api.add(make_pod("team-a", "late", gpus={GPU: 1}))
    wait_for(lambda: "team-a/late" in h.view.pods, 4 * interval, "the pod after the silent stream")
    assert time.monotonic() - start <= 2 * interval + 1.0  # two intervals of silence, then a resume
    assert gauge(metrics.WATCH_RESTARTS, "pods", "stalled") == restarts + 1
    assert h.lists() == 0  # resumed from its version, not relisted


def test_watch_settings_default_to_two_bookmark_intervals() -> None:
    settings = WatchSettings()
    assert settings.client_timeout == 2 * settings.bookmark_interval == 120.0 < settings.server_timeout


def test_stop_is_prompt(live: Callable[..., Harness], fake_api: FakeApiServer) -> None:
    h = live()
    fake_api.wait_for_watches(3)
    start = time.monotonic()
    h.source.stop()
    assert time.monotonic() - start < 1.0
    assert not [t for t in threading.enumerate() if t.name.startswith("watch-")]


# -- configuration ---------------------------------------------------------------------------------

def test_load_api_client_from_a_kubeconfig(fake_api: FakeApiServer, tmp_path: Path) -> None:
    api = load_api_client(str(fake_api.write_kubeconfig(tmp_path / "config")))
    try:
        assert api.configuration.host == fake_api.url and api.configuration.retries is False
        settings = WatchSettings(server_timeout=30, client_timeout=35.0)
        source = LiveSource(ClusterView(Config()), Ingest(Config()), api, settings, kinds=("namespaces",))
        source.start()
        try:
            wait_for(lambda: source.ready, what="namespaces through the kubeconfig's client")
        finally:
            source.stop()
            gc.unfreeze()
    finally:
        api.close()


def test_kubeconfig_errors_are_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(KubeConfigError, match=r"kubeconfig .*missing does not exist"):
        load_api_client(str(tmp_path / "missing"))
    broken = tmp_path / "broken"
    broken.write_text("apiVersion: v1\nclusters: [\n")
    with pytest.raises(KubeConfigError, match=r"^cannot load kubeconfig .*broken: ") as info:
        load_api_client(str(broken))
    assert "\n" not in str(info.value)
    empty = tmp_path / "empty"
    empty.write_text("apiVersion: v1\nkind: Config\n")
    with pytest.raises(KubeConfigError, match=r"cannot load kubeconfig .*empty: "):
        load_api_client(str(empty))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    with pytest.raises(KubeConfigError, match=r"in-cluster config: Service host/port is not set.*--kubeconfig"):
        load_api_client(None)


def test_watch_settings_are_checked() -> None:
    with pytest.raises(ValueError, match="client_timeout"):
        WatchSettings(server_timeout=60, client_timeout=30.0)
    settings = WatchSettings(backoff_initial=1.0, backoff_max=8.0, backoff_factor=2.0, backoff_jitter=0.0)
    assert [settings.backoff(n, 0.5) for n in range(1, 6)] == [1.0, 2.0, 4.0, 8.0, 8.0]
    jittered = WatchSettings(backoff_initial=1.0, backoff_jitter=0.2)
    assert jittered.backoff(1, 0.0) == pytest.approx(0.8) and jittered.backoff(1, 0.999) == pytest.approx(1.2, 0.01)
