"""The ResourceQuota mirror and adoption: only in the namespaces gpu-placement acts in
(namespaceSelection), none in audit mode (the ones kept before are deleted), and owned by the
release's ValidatingWebhookConfiguration, so they go with it (the fake API server has no garbage
collector: the e2e suite shows the deletion itself, tests/e2e/test_0_adoption.py)."""

from __future__ import annotations

import gc
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpu_placement.base.config import parse_config
from gpu_placement.controllers.quota_mirror import MirrorSettings, QuotaMirror
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from gpu_placement.view.live import LiveSource
from tests.fakeapi import FakeApiServer
from tests.support.quota import FAST, FAST_WATCH, QUOTA, a_turn_ends, mirrored
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(30)

OWNED = MirrorSettings(lease_name="quota-lock", lease_seconds=1, renew_seconds=0.05, resync_seconds=3600,
                       owner="gpu-placement")


class Replica:
    def __init__(self, fake: FakeApiServer, config: dict[str, Any], settings: MirrorSettings) -> None:
        self.config = parse_config(config)
        self.view = ClusterView(self.config)
        self.api = fake.api_client()
        self.source = LiveSource(self.view, Ingest(self.config), self.api, FAST_WATCH, kinds=("namespaces",))
        self.mirror = QuotaMirror(self.api, self.view, self.config, "gpu-placement", "replica", settings)
        self.source.start()
        wait_for(lambda: self.source.ready, what="the namespace list")
        self.mirror.start()

    def stop(self) -> None:
        self.mirror.stop()
        self.source.stop()
        self.api.close()


@pytest.fixture
def replica(fake_api: FakeApiServer) -> Iterator[Callable[..., Replica]]:
    fake_api.add({"kind": "Namespace", "metadata": {"name": "gpu-placement"}})
    made: list[Replica] = []

    def make(config: dict[str, Any] | None = None, settings: MirrorSettings = FAST) -> Replica:
        made.append(Replica(fake_api, config or {}, settings))
        return made[-1]

    yield make
    for one in made:
        one.stop()
    gc.unfreeze()


def namespace(fake: FakeApiServer, name: str, quota: str, enabled: str | None = None) -> None:
    labels = {"gpu-placement.io/enabled": enabled} if enabled is not None else {}
    fake.add({"kind": "Namespace", "metadata": {"name": name, "labels": labels, "annotations": {QUOTA: quota}}})


def test_opt_in_mirrors_only_the_namespaces_labelled_in(fake_api: FakeApiServer,
                                                        replica: Callable[..., Replica]) -> None:
    namespace(fake_api, "team-in", "nvidia.com/gpu=4", enabled="true")
    namespace(fake_api, "team-unlabelled", "nvidia.com/gpu=4")
    namespace(fake_api, "team-out", "nvidia.com/gpu=4", enabled="false")
    one = replica({"namespaceSelection": "optIn"})
    wait_for(lambda: mirrored(fake_api, "team-in"), what="the opted-in namespace's quota")
    one.mirror.resync()
    assert mirrored(fake_api, "team-unlabelled") is None and mirrored(fake_api, "team-out") is None
    # A namespace that leaves the selection loses its mirror; one that joins gets it.
    fake_api.patch_labels("Namespace", "team-in", {"gpu-placement.io/enabled": None})
    fake_api.patch_labels("Namespace", "team-unlabelled", {"gpu-placement.io/enabled": "true"})
    wait_for(lambda: mirrored(fake_api, "team-in") is None and mirrored(fake_api, "team-unlabelled"),
             what="the mirror to follow the labels")


def test_opt_out_mirrors_all_but_the_namespaces_labelled_out(fake_api: FakeApiServer,
                                                             replica: Callable[..., Replica]) -> None:
    namespace(fake_api, "team-unlabelled", "nvidia.com/gpu=4")
    namespace(fake_api, "team-out", "nvidia.com/gpu=4", enabled="false")
    namespace(fake_api, "gpu-operator", "nvidia.com/gpu=4", enabled="true")  # exempt: never touched
    one = replica({"namespaceSelection": "optOut"})
    # The first pass goes through the namespaces in order: gpu-operator and team-out came before team-unlabelled.
    wait_for(lambda: mirrored(fake_api, "team-unlabelled"), what="the quota")
    assert one.mirror.last_error is None
    assert mirrored(fake_api, "team-out") is None
    assert mirrored(fake_api, "gpu-operator") is None


def test_audit_mode_deletes_the_quotas_enforce_mode_kept(fake_api: FakeApiServer,
                                                         replica: Callable[..., Replica]) -> None:
    namespace(fake_api, "team-a", "nvidia.com/gpu=4")
    namespace(fake_api, "team-b", "nvidia.com/gpu=2")
    theirs = fake_api.add({"kind": "ResourceQuota", "metadata": {"name": "compute", "namespace": "team-a"},
                           "spec": {"hard": {"requests.cpu": "8"}}})
    enforce = replica()
    wait_for(lambda: mirrored(fake_api, "team-a") and mirrored(fake_api, "team-b"), what="enforce's quotas")
    enforce.stop()  # the rollout to audit mode: the old replica goes, the new one takes the Lease
    replica({"mode": "audit"})
    wait_for(lambda: mirrored(fake_api, "team-a") is None and mirrored(fake_api, "team-b") is None,
             what="audit mode to delete them")
    assert fake_api.get("ResourceQuota", "compute", "team-a") == theirs


def test_the_quotas_are_owned_by_the_validating_webhook_configuration(fake_api: FakeApiServer,
                                                                     replica: Callable[..., Replica]) -> None:
    """Owner: what helm uninstall deletes. Missing (being uninstalled, deleted by hand): nothing is
    written, since the garbage collector would not take it; back with a new uid: rewritten to it."""
    namespace(fake_api, "team-a", "nvidia.com/gpu=4")
    wait_for(a_turn_ends(replica(settings=OWNED).mirror), what="the first pass")
    assert mirrored(fake_api, "team-a") is None, "no owner yet: nothing written"
    vwc = fake_api.add({"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "gpu-placement"}})

    def owner_uid() -> str | None:
        quota = fake_api.get("ResourceQuota", "gpu-placement", "team-a")
        return None if quota is None else quota["metadata"]["ownerReferences"][0]["uid"]

    wait_for(lambda: owner_uid() == vwc["metadata"]["uid"], what="the quota, owned by it")
    quota = fake_api.get("ResourceQuota", "gpu-placement", "team-a")
    assert quota is not None and quota["metadata"]["ownerReferences"] == [
        {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
         "name": "gpu-placement", "uid": vwc["metadata"]["uid"]}]
    fake_api.delete("ValidatingWebhookConfiguration", "gpu-placement")
    again = fake_api.add({"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "gpu-placement"}})
    wait_for(lambda: owner_uid() == again["metadata"]["uid"], what="the quota owned by the new one")


def test_when_the_owner_comes_back_the_quotas_are_written_at_once(fake_api: FakeApiServer,
                                                                  replica: Callable[..., Replica]) -> None:
    """The emergency stop (configurations deleted by hand; the garbage collector takes the quotas), then
    helm upgrade puts them back: the mirror does not wait for its next full pass."""
    namespace(fake_api, "team-a", "nvidia.com/gpu=4")
    first = replica(settings=OWNED)  # resync_seconds 3600: only the owner's return can bring the quota
    wait_for(a_turn_ends(first.mirror), what="the first pass")
    assert mirrored(fake_api, "team-a") is None
    fake_api.add({"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "gpu-placement"}})
    wait_for(lambda: mirrored(fake_api, "team-a"), what="the quota written once the owner is back")
