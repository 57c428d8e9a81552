"""The ResourceQuota mirror against the fake API server: the view fed by the real list+watch loop,
the mirror writing through the real client; one replica leads, the others stand by."""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpu_placement.base.config import Config
from gpu_placement.controllers.quota_mirror import MirrorSettings, QuotaMirror
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from gpu_placement.view.live import LiveSource
from tests.fakeapi import ApiStatusError, FakeApiServer
from tests.support.quota import FAST, FAST_WATCH, QUOTA, a_turn_ends, mirrored
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(30)


class Replica:
    """One webhook replica's view (namespaces only) and mirror."""

    def __init__(self, fake: FakeApiServer, identity: str, settings: MirrorSettings = FAST) -> None:
        self.config = Config()
        self.view = ClusterView(self.config)
        self.api = fake.api_client()
        self.source = LiveSource(self.view, Ingest(self.config), self.api, FAST_WATCH, kinds=("namespaces",))
        self.mirror = QuotaMirror(self.api, self.view, self.config, "gpu-placement", identity, settings)

    def start(self) -> Replica:
        self.source.start()
        wait_for(lambda: self.source.ready, what="the namespace list")
        self.mirror.start()
        return self

    def stop(self) -> None:
        self.mirror.stop()
        self.source.stop()
        self.api.close()


@pytest.fixture
def replicas(fake_api: FakeApiServer) -> Iterator[Callable[..., Replica]]:
    fake_api.add({"kind": "Namespace", "metadata": {"name": "gpu-placement"}})
    made: list[Replica] = []

    def make(identity: str = "replica-a", settings: MirrorSettings = FAST) -> Replica:
        replica = Replica(fake_api, identity, settings)
        made.append(replica)
        return replica.start()

    yield make
    for replica in made:
        replica.stop()
    gc.unfreeze()


def namespace(fake: FakeApiServer, name: str, quota: str | None) -> dict[str, Any]:
    annotations = {QUOTA: quota} if quota is not None else {}
    return fake.add({"kind": "Namespace", "metadata": {"name": name, "annotations": annotations}})


def test_a_quota_annotation_becomes_a_resourcequota_owned_by_the_namespace(fake_api: FakeApiServer,
                                                                            replicas: Callable[..., Replica]) -> None:
    team = namespace(fake_api, "team-a", "nvidia.com/gpu=4,nvidia.com/gpu.shared=16")
    namespace(fake_api, "web", None)
    replicas()
    wait_for(lambda: mirrored(fake_api, "team-a"), what="the ResourceQuota")
    quota = fake_api.get("ResourceQuota", "gpu-placement", "team-a")
    assert quota is not None
    assert quota["spec"] == {"hard": {"requests.nvidia.com/gpu": "4", "requests.nvidia.com/gpu.shared": "16"}}
    assert quota["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpu-placement"}
    assert quota["metadata"]["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Namespace", "name": "team-a", "uid": team["metadata"]["uid"]}]
    assert fake_api.list("ResourceQuota", "web") == []


def test_the_mirror_follows_the_annotation_and_goes_with_it(fake_api: FakeApiServer,
                                                           replicas: Callable[..., Replica]) -> None:
    namespace(fake_api, "team-a", "nvidia.com/gpu=4")
    replicas()
    wait_for(lambda: mirrored(fake_api, "team-a") == {"requests.nvidia.com/gpu": "4"}, what="the first mirror")
    fake_api.set_annotations("Namespace", "team-a", {QUOTA: "nvidia.com/gpu=2,nvidia.com/mig-1g.10gb=7"})
    wait_for(lambda: mirrored(fake_api, "team-a") == {"requests.nvidia.com/gpu": "2",
                                                      "requests.nvidia.com/mig-1g.10gb": "7"}, what="the update")
    fake_api.set_annotations("Namespace", "team-a", {QUOTA: None})
    wait_for(lambda: mirrored(fake_api, "team-a") is None, what="the delete")


def test_a_namespace_event_costs_requests_for_that_namespace_only(fake_api: FakeApiServer,
                                                                  replicas: Callable[..., Replica]) -> None:
    for i in range(20):
        namespace(fake_api, f"team-{i:02d}", f"nvidia.com/gpu={i + 1}")
    replica = replicas()
    wait_for(lambda: replica.mirror.writes == 20, what="20 mirrors")
    fake_api.clear_log()
    fake_api.set_annotations("Namespace", "team-07", {QUOTA: "nvidia.com/gpu=99"})
    wait_for(lambda: mirrored(fake_api, "team-07") == {"requests.nvidia.com/gpu": "99"}, what="the update")
    wait_for(lambda: replica.mirror.writes == 21, what="the write counted")
    wait_for(a_turn_ends(replica.mirror), what="the end of the turn that wrote it")
    quota_calls = {(r.verb, r.path) for r in fake_api.requests_log if "resourcequotas" in r.path}
    assert quota_calls == {("get", "/api/v1/namespaces/team-07/resourcequotas/gpu-placement"),
                           ("update", "/api/v1/namespaces/team-07/resourcequotas/gpu-placement")}


def test_resourcequotas_it_does_not_own_are_never_touched(fake_api: FakeApiServer,
                                                         replicas: Callable[..., Replica]) -> None:
    namespace(fake_api, "team-a", "nvidia.com/gpu=4")
    namespace(fake_api, "team-b", None)
    theirs = fake_api.add({"kind": "ResourceQuota", "metadata": {"name": "gpu-placement", "namespace": "team-a"},
                           "spec": {"hard": {"requests.nvidia.com/gpu": "1", "pods": "10"}}})
    other = fake_api.add({"kind": "ResourceQuota", "metadata": {"name": "compute", "namespace": "team-b",
                                                                "labels": {"app.kubernetes.io/managed-by": "x"}},
                          "spec": {"hard": {"requests.cpu": "8"}}})
    replica = replicas()
    wait_for(a_turn_ends(replica.mirror), what="the first pass")
    replica.mirror.resync()
    assert fake_api.get("ResourceQuota", "gpu-placement", "team-a") == theirs
    assert fake_api.get("ResourceQuota", "compute", "team-b") == other
    assert replica.mirror.writes == 0


def test_a_periodic_resync_mends_a_hand_edited_mirror(fake_api: FakeApiServer,
                                                     replicas: Callable[..., Replica]) -> None:
    namespace(fake_api, "team-a", "nvidia.com/gpu=4")
    namespace(fake_api, "team-b", "nvidia.com/gpu=1")
    replica = replicas(settings=MirrorSettings(lease_name="quota-lock", lease_seconds=1, renew_seconds=0.05,
                                               resync_seconds=0.3))
    wait_for(lambda: mirrored(fake_api, "team-b"), what="the mirrors")
    fake_api.patch("ResourceQuota", "gpu-placement", {"spec": {"hard": {"requests.nvidia.com/gpu": "40"}}}, "team-a")
    fake_api.delete("ResourceQuota", "gpu-placement", "team-b")
    wait_for(lambda: mirrored(fake_api, "team-a") == {"requests.nvidia.com/gpu": "4"}, what="the mend")
    wait_for(lambda: mirrored(fake_api, "team-b") == {"requests.nvidia.com/gpu": "1"}, what="the re-create")
    assert replica.mirror.leading


def test_an_annotation_that_does_not_parse_leaves_the_mirror_as_it_was(fake_api: FakeApiServer,
                                                                      replicas: Callable[..., Replica]) -> None:
    namespace(fake_api, "team-a", "nvidia.com/gpu=4")
    replica = replicas()
    wait_for(lambda: mirrored(fake_api, "team-a"), what="the mirror")
    fake_api.set_annotations("Namespace", "team-a", {QUOTA: "nvidia.com/gpu=lots"})
    wait_for(lambda: replica.view.namespaces["team-a"].get(QUOTA) == "nvidia.com/gpu=lots", what="the event")
    replica.mirror.resync()
    assert mirrored(fake_api, "team-a") == {"requests.nvidia.com/gpu": "4"}


def test_one_replica_writes_and_another_takes_over_when_it_stops(fake_api: FakeApiServer,
                                                                replicas: Callable[..., Replica]) -> None:
    # A lease that outlasts a leader's thread held up by load: with FAST's 1 s, a renewal a second late
    # let the standby take the lease before the test looked at who leads.
    held = MirrorSettings(lease_name="quota-lock", lease_seconds=5, renew_seconds=0.05, resync_seconds=3600)
    namespace(fake_api, "team-a", "nvidia.com/gpu=4")
    first = replicas("replica-a", held)
    wait_for(lambda: mirrored(fake_api, "team-a"), what="the mirror")
    second = replicas("replica-b", held)
    # A standby's turn counts nothing of its own (its stamp and gauge share the leader's series): a spy on its Lease.
    answers: list[bool] = []
    acquire = second.mirror.lease.acquire

    def answered() -> bool:
        answers.append(answer := acquire())
        return answer

    second.mirror.lease.acquire = answered  # type: ignore[method-assign]  # a spy on this instance only
    wait_for(lambda: answers, what="the standby's next ask for the Lease")
    assert first.mirror.leading and not second.mirror.leading
    first.stop()
    fake_api.set_annotations("Namespace", "team-a", {QUOTA: "nvidia.com/gpu=6"})
    # The stopping leader releases the lease; the standby takes it and does a full pass.
    wait_for(lambda: mirrored(fake_api, "team-a") == {"requests.nvidia.com/gpu": "6"}, what="the take-over")
    wait_for(lambda: second.mirror.writes == 1, what="the write counted")  # counted once its answer is read
    assert second.mirror.leading and first.mirror.writes == 1
    lease = fake_api.get("Lease", "quota-lock", "gpu-placement")
    assert lease is not None and lease["spec"]["holderIdentity"] == "replica-b"


def test_a_clean_stop_hands_the_lease_over_at_once(fake_api: FakeApiServer,
                                                 replicas: Callable[..., Replica]) -> None:
    """A rolling update: the stopping leader releases its Lease, so the next one need not wait out
    the lease duration (30 s here) before mirroring a change."""
    slow = MirrorSettings(lease_name="quota-lock", lease_seconds=30, renew_seconds=0.05, resync_seconds=3600)
    namespace(fake_api, "team-a", "nvidia.com/gpu=4")
    first = replicas("replica-a", slow)
    wait_for(lambda: mirrored(fake_api, "team-a"), what="the mirror")
    second = replicas("replica-b", slow)
    first.stop()
    fake_api.set_annotations("Namespace", "team-a", {QUOTA: "nvidia.com/gpu=5"})
    # Well inside the 30 s lease: only a released Lease is taken this soon.
    wait_for(lambda: mirrored(fake_api, "team-a") == {"requests.nvidia.com/gpu": "5"}, 15.0, what="the hand-over")
    assert second.mirror.leading


def test_nothing_is_done_before_the_namespaces_are_listed(fake_api: FakeApiServer) -> None:
    fake_api.add({"kind": "Namespace", "metadata": {"name": "gpu-placement"}})
    fake_api.add({"kind": "ResourceQuota", "metadata": {"name": "gpu-placement", "namespace": "default",
                                                        "labels": {"app.kubernetes.io/managed-by": "gpu-placement"}},
                  "spec": {"hard": {"requests.nvidia.com/gpu": "3"}}})
    config = Config()
    view = ClusterView(config)  # empty and not listed: "default" would look unannotated
    with fake_api.api_client() as api:
        mirror = QuotaMirror(api, view, config, "gpu-placement", "replica-a", FAST)
        mirror.step()
        assert mirror.leading and mirror.writes == 0
        assert mirrored(fake_api, "default") == {"requests.nvidia.com/gpu": "3"}
        Ingest(config).replace(view, "namespaces", fake_api.list("Namespace"))
        mirror.step()
        assert mirrored(fake_api, "default") is None  # listed now: ours, and no annotation says keep it


def test_the_fake_api_server_validates_resourcequotas_as_the_real_one(fake_api: FakeApiServer) -> None:
    with fake_api.api_client() as api:
        from gpu_placement.kube.api import api_error, request

        def create(hard: dict[str, str]) -> int:
            body = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "q"}, "spec": {"hard": hard}}
            response = request(api, "POST", "/api/v1/namespaces/default/resourcequotas", body=body,
                               timeout=(2, 5))
            if response.status >= 300:
                return api_error(response).status
            response.read()
            fake_api.delete("ResourceQuota", "q", "default")
            return response.status

        assert create({"requests.nvidia.com/gpu": "4"}) == 201
        assert create({"requests.cpu": "500m", "count/pods": "3"}) == 201
        assert create({"gpus": "4"}) == 422  # no slash: must be a standard quota resource
        assert create({"requests.nvidia.com/gpu": "four"}) == 422
        assert create({"requests.nvidia.com/gpu": "-1"}) == 422
    with pytest.raises(ApiStatusError):
        fake_api.get("ResourceQuota", "q", "default") or fake_api.delete("ResourceQuota", "q", "default")


def sample(name: str, **labels: str) -> float:
    from prometheus_client import REGISTRY

    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_say_who_leads_what_it_wrote_and_when_it_last_managed(fake_api: FakeApiServer) -> None:
    """What an operator sees on /metrics: the leader's gauge, its writes by outcome (a refused PUT
    too), and a last-success stamp that stops moving while the writes fail."""
    fake_api.add({"kind": "Namespace", "metadata": {"name": "gpu-placement"}})
    namespace(fake_api, "team-a", "nvidia.com/gpu=4")
    config = Config()
    view = ClusterView(config)
    Ingest(config).replace(view, "namespaces", fake_api.list("Namespace"))
    writes = "gpu_placement_quota_mirror_writes_total"
    stamp = "gpu_placement_quota_mirror_last_success_timestamp_seconds"
    before = {(a, o): sample(writes, action=a, outcome=o) for a in ("create", "update", "delete")
              for o in ("ok", "refused")}
    with fake_api.api_client() as api:
        leader = QuotaMirror(api, view, config, "gpu-placement", "replica-a", FAST)
        standby = QuotaMirror(api, view, config, "gpu-placement", "replica-b",
                              MirrorSettings(lease_name="other-lock", lease_seconds=1, renew_seconds=0.05))
        leader.step()
        assert sample("gpu_placement_quota_mirror_leading", lease="quota-lock") == 1.0
        assert sample(writes, action="create", outcome="ok") == before["create", "ok"] + 1
        first = sample(stamp, lease="quota-lock")
        assert first >= time.time() - 5

        # An update the API server refuses (RBAC edited): counted, stamp kept, retried next turn.
        fake_api.set_annotations("Namespace", "team-a", {QUOTA: "nvidia.com/gpu=6"})
        Ingest(config).replace(view, "namespaces", fake_api.list("Namespace"))
        fake_api.fail_next(1, 403, reason="Forbidden", method="PUT",
                           path="/api/v1/namespaces/team-a/resourcequotas")
        time.sleep(0.01)  # a stamp of the next good turn is later than the first
        leader.step()
        assert sample(writes, action="update", outcome="refused") == before["update", "refused"] + 1
        assert sample(stamp, lease="quota-lock") == first
        assert leader.last_error is not None and "403" in leader.last_error
        leader.step()
        assert mirrored(fake_api, "team-a") == {"requests.nvidia.com/gpu": "6"}
        assert sample(writes, action="update", outcome="ok") == before["update", "ok"] + 1
        assert sample(stamp, lease="quota-lock") > first

        fake_api.set_annotations("Namespace", "team-a", {QUOTA: None})
        Ingest(config).replace(view, "namespaces", fake_api.list("Namespace"))
        leader.step()
        assert sample(writes, action="delete", outcome="ok") == before["delete", "ok"] + 1

        # A replica that loses the lease (or never had it) says 0; a stopped leader too.
        fake_api.add({"kind": "Lease", "metadata": {"name": "other-lock", "namespace": "gpu-placement"},
                      "spec": {"holderIdentity": "someone-else", "leaseDurationSeconds": 3600,
                               "renewTime": time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())}})
        standby.step()
        assert not standby.leading and sample("gpu_placement_quota_mirror_leading", lease="other-lock") == 0.0
        assert sample(stamp, lease="other-lock") >= time.time() - 5  # a standby's turn is its Lease check
        leader.stop()
        assert sample("gpu_placement_quota_mirror_leading", lease="quota-lock") == 0.0


def test_a_lease_in_a_namespace_that_does_not_exist_is_an_error_not_a_lost_race(
        fake_api: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    """`serve --kubeconfig` with a wrong --namespace: NamespaceLifecycle answers the Lease's create with
    404 `namespaces "X" not found`. That is no other replica winning: the loop says so and never looks
    healthy, where it used to stand by silently for ever."""
    config = Config()
    view = ClusterView(config)
    stamp = "gpu_placement_quota_mirror_last_success_timestamp_seconds"
    with fake_api.api_client() as api:
        mirror = QuotaMirror(api, view, config, "no-such-namespace", "replica-a",
                             MirrorSettings(lease_name="missing-ns-lock", lease_seconds=30, renew_seconds=0.05))
        started = sample(stamp, lease="missing-ns-lock")
        time.sleep(0.01)
        mirror.step()
        assert not mirror.leading
        assert mirror.last_error == ('HTTP 404 NotFound: Lease no-such-namespace/missing-ns-lock: namespaces '
                                     '"no-such-namespace" not found')
        assert sample(stamp, lease="missing-ns-lock") == started  # not a standby's healthy turn
        assert sample("gpu_placement_quota_mirror_leading", lease="missing-ns-lock") == 0.0
        assert 'quota mirror: HTTP 404 NotFound: Lease no-such-namespace/missing-ns-lock: namespaces ' \
               '"no-such-namespace" not found' in caplog.text
        # RBAC that does not allow the Lease: a 403 says so too.
        fake_api.add({"kind": "Namespace", "metadata": {"name": "gpu-placement"}})
        fake_api.fail_next(1, 403, reason="Forbidden", method="POST",
                           path="/apis/coordination.k8s.io/v1/namespaces/gpu-placement/leases")
        other = QuotaMirror(api, view, config, "gpu-placement", "replica-b",
                            MirrorSettings(lease_name="rbac-lock", lease_seconds=30, renew_seconds=0.05))
        other.step()
        assert not other.leading and other.last_error is not None and other.last_error.startswith(
            "HTTP 403 Forbidden: Lease gpu-placement/rbac-lock: ")
        other.step()  # the refusal gone: it takes the Lease
        assert other.leading and other.last_error is None


def terminating(fake: FakeApiServer, name: str, quota: str) -> dict[str, Any]:
    """A namespace being deleted and held by a finalizer nobody removes (common): its annotations stay."""
    return fake.add({"kind": "Namespace", "metadata": {
        "name": name, "annotations": {QUOTA: quota}, "deletionTimestamp": "2026-12-01T00:00:00Z",
        "finalizers": ["example.com/stuck"]}, "status": {"phase": "Terminating"}})


def test_a_namespace_stuck_in_terminating_does_not_stop_the_mirror_for_the_namespaces_after_it(
        fake_api: FakeApiServer, replicas: Callable[..., Replica]) -> None:
    terminating(fake_api, "batch-old", "nvidia.com/gpu=2")
    namespace(fake_api, "team-b", "nvidia.com/gpu=4")
    replica = replicas()
    wait_for(lambda: mirrored(fake_api, "team-b") == {"requests.nvidia.com/gpu": "4"}, what="team-b's quota")
    wait_for(lambda: replica.mirror.last_error is None, what="a turn without error")
    assert fake_api.get("ResourceQuota", "gpu-placement", "batch-old") is None
    assert not fake_api.count("create", "/api/v1/namespaces/batch-old/resourcequotas")  # nothing is wanted there
    assert sample("gpu_placement_quota_mirror_failing_objects", lease="quota-lock") == 0.0


def test_a_create_refused_because_the_namespace_is_being_deleted_is_settled(
        fake_api: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    """The view has not seen the deletion yet: NamespaceLifecycle's 403 says nothing is wanted there."""
    caplog.set_level(logging.INFO, "gpu_placement")
    fake_api.add({"kind": "Namespace", "metadata": {"name": "gpu-placement"}})
    old = terminating(fake_api, "batch-old", "nvidia.com/gpu=2")
    namespace(fake_api, "team-b", "nvidia.com/gpu=4")
    config = Config()
    view = ClusterView(config)
    still_active = {**old, "metadata": {k: v for k, v in old["metadata"].items() if k != "deletionTimestamp"}}
    Ingest(config).replace(view, "namespaces", [still_active, *(ns for ns in fake_api.list("Namespace")
                                                                 if ns["metadata"]["name"] != "batch-old")])
    with fake_api.api_client() as api:
        mirror = QuotaMirror(api, view, config, "gpu-placement", "replica-a", FAST)
        mirror.step()
        assert fake_api.count("create", "/api/v1/namespaces/batch-old/resourcequotas") == 1
        assert mirrored(fake_api, "team-b") == {"requests.nvidia.com/gpu": "4"}
        assert mirror.last_error is None and mirror.failures.errors == {}
        assert "namespace batch-old is being deleted, so no ResourceQuota is written there" in caplog.text


def test_one_namespace_refused_is_retried_later_and_the_rest_of_the_pass_goes_on(
        fake_api: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    """Each namespace's ResourceQuota is its own unit of work: a refusal for one (an admission policy, a
    validation) is logged once, counted, kept failing in a gauge and retried, and the others are written."""
    caplog.set_level(logging.INFO, "gpu_placement")
    fake_api.add({"kind": "Namespace", "metadata": {"name": "gpu-placement"}})
    for name in ("team-a", "team-b", "team-c"):
        namespace(fake_api, name, "nvidia.com/gpu=4")
    config = Config()
    view = ClusterView(config)
    Ingest(config).replace(view, "namespaces", fake_api.list("Namespace"))
    refused = 'admission webhook "policy.example.com" denied the request: quotas need an owner label'
    fake_api.fail_next(100, 400, message=refused, reason="BadRequest", method="POST",
                       path="/api/v1/namespaces/team-b/resourcequotas")
    stamp = "gpu_placement_quota_mirror_last_success_timestamp_seconds"
    before = sample("gpu_placement_quota_mirror_writes_total", action="create", outcome="refused")
    with fake_api.api_client() as api:
        mirror = QuotaMirror(api, view, config, "gpu-placement", "replica-a",
                             MirrorSettings(lease_name="unit-lock", lease_seconds=30, renew_seconds=0.05))
        started = sample(stamp, lease="unit-lock")
        mirror.step()
        assert mirrored(fake_api, "team-a") and mirrored(fake_api, "team-c")
        assert mirrored(fake_api, "team-b") is None
        assert mirror.failures.errors == {"team-b/gpu-placement": f"HTTP 400 BadRequest: {refused}"}
        assert mirror.last_error == f"HTTP 400 BadRequest: {refused}"
        assert sample("gpu_placement_quota_mirror_failing_objects", lease="unit-lock") == 1.0
        assert sample(stamp, lease="unit-lock") == started  # something is failing: not a success
        mirror.step()  # the next turn tries team-b again, and only team-b
        assert fake_api.count("create", "/api/v1/namespaces/team-b/resourcequotas") == 2
        assert fake_api.count("create", "/api/v1/namespaces/team-a/resourcequotas") == 1
        assert sample("gpu_placement_quota_mirror_writes_total", action="create", outcome="refused") == before + 2
        assert caplog.text.count(refused) == 1  # logged once per distinct error
        fake_api.stop_failing()
        mirror.step()
        assert mirrored(fake_api, "team-b") == {"requests.nvidia.com/gpu": "4"}
        assert mirror.last_error is None and mirror.failures.errors == {}
        assert sample("gpu_placement_quota_mirror_failing_objects", lease="unit-lock") == 0.0
        assert sample(stamp, lease="unit-lock") > started
        assert "quota mirror: team-b/gpu-placement written now, after its earlier failure" in caplog.text


def test_a_pass_longer_than_the_lease_renews_it_and_stops_when_another_replica_took_it(
        fake_api: FakeApiServer, caplog: pytest.LogCaptureFixture) -> None:
    """A first pass over many namespaces (two calls each) can outlast the Lease: the leader renews it
    between namespaces, so no other replica writes beside it; and if another replica holds it all the
    same, the pass stops there."""
    import threading

    caplog.set_level(logging.INFO, "gpu_placement")
    fake_api.add({"kind": "Namespace", "metadata": {"name": "gpu-placement"}})
    for i in range(30):
        namespace(fake_api, f"team-{i:02d}", "nvidia.com/gpu=1")
    config = Config()
    view = ClusterView(config)
    Ingest(config).replace(view, "namespaces", fake_api.list("Namespace"))
    held = MirrorSettings(lease_name="long-pass-lock", lease_seconds=3, renew_seconds=0.3, resync_seconds=3600)
    fake_api.delay = 0.1  # each call: the pass takes at least 30 x 2 x 0.1 s = 6 s, twice the Lease
    with fake_api.api_client() as api:
        leader = QuotaMirror(api, view, config, "gpu-placement", "replica-a", held)
        standby = QuotaMirror(api, view, config, "gpu-placement", "replica-b", held)
        passing = threading.Thread(target=leader.step)
        passing.start()
        try:
            wait_for(lambda: leader.writes >= 20, what="two thirds of the pass (more than the Lease's 3 s)")
            standby.step()
            assert not standby.leading  # the Lease was renewed during the pass
            lease = fake_api.get("Lease", "long-pass-lock", "gpu-placement")
            assert lease is not None and lease["spec"]["holderIdentity"] == "replica-a"
            # Another replica holds it now (say the leader was partitioned for a moment): the pass stops.
            lease["spec"].update(holderIdentity="replica-c", leaseDurationSeconds=3600,
                                 renewTime=time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime()))
            fake_api.update(lease)
        finally:
            passing.join(30)
        assert not leader.leading and leader.writes < 30  # the last namespaces were left to replica-c
        assert "quota mirror: pass interrupted: another replica took the lease in the middle of a pass" in caplog.text
