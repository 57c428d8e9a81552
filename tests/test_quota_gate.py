"""The quota is hard from the first second (webhook/quota_gate.py): /validate admits a quota namespace's
GPU pods only while the API server enforces the quota, as the namespace's `gpu-placement`
ResourceQuota, watched by the real list+watch loop from the fake API server, shows it.

The fake API server has no quota controller: the test writes the ResourceQuota's status itself, as
Kubernetes' controller would (tests/e2e/test_13_quota_from_the_first_second.py runs the real one)."""

from __future__ import annotations

import base64
import gc
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import jsonpatch
import orjson
import pytest

from gpu_placement.base.config import Config
from gpu_placement.facts.resourcequotas import SETTLE_SECONDS
from gpu_placement.kube.api import WatchSettings
from gpu_placement.samples.cluster import namespace
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import KINDS, Ingest
from gpu_placement.view.live import LiveSource
from gpu_placement.web.certs import CertBundle
from gpu_placement.web.serving import ServerThread
from gpu_placement.web.tls import ReloadingTLS, make_server
from tests.fakeapi import FakeApiServer
from tests.support.dra import dra_namespace
from tests.support.waiting import wait_for
from tests.support.webhook import Webhook, review, trusting, user_pod
from webhook.app import create_app

pytestmark = pytest.mark.timeout(60)

GPU = "nvidia.com/gpu"
QUOTA = "gpu-placement.io/quota"


class Gated:
    def __init__(self, fake: FakeApiServer, hook: Webhook) -> None:
        self.fake, self.hook = fake, hook

    def later(self, seconds: float = SETTLE_SECONDS) -> None:
        self.hook.clock[0] += seconds

    def create(self, name: str, ns: str = "fresh") -> dict[str, Any]:
        """What the API server does: /mutate, name and uid the pod, /validate, store it if allowed."""
        mutated, _, _ = self.hook.mutate(user_pod(ns, name, gpus={GPU: 1}), ns)
        named = {**mutated, "metadata": {**mutated["metadata"], "namespace": ns, "uid": str(uuid.uuid4())}}
        verdict = self.hook.validate(named, ns)
        if verdict["allowed"]:
            self.fake.add(named, keep_uid=True)
        return verdict

    def quota_status(self, hard: dict[str, str] | None, used: dict[str, str] | None, ns: str = "fresh",
                     settled: bool = True) -> None:
        """The mirror's ResourceQuota (spec as the annotation says) and what the quota controller wrote; with
        `settled`, seen for long enough that the API server's quota admission reads it too."""
        annotation = self.fake.get("Namespace", ns)["metadata"]["annotations"][QUOTA]  # type: ignore[index]
        spec = {f"requests.{item.split('=')[0]}": item.split("=")[1] for item in annotation.split(",")}
        status = {key: value for key, value in (("hard", hard), ("used", used)) if value is not None}
        self.fake.upsert({"kind": "ResourceQuota", "metadata": {"name": "gpu-placement", "namespace": ns},
                          "spec": {"hard": spec}, "status": status})
        wanted = ({key: int(value) for key, value in (hard or {}).items()}, {f"requests.{GPU}"} & set(used or {}))

        def watched() -> bool:
            record = self.hook.view.resourcequotas.get(ns)
            return record is not None and (dict(record.hard), set(record.used)) == wanted

        wait_for(watched, what="the quota watched")
        if settled:
            self.later()

    def annotate(self, quota: str, ns: str = "fresh") -> None:
        self.fake.set_annotations("Namespace", ns, {QUOTA: quota})
        wait_for(lambda: self.hook.view.namespaces[ns].get(QUOTA) == quota, what="the annotation seen")


@pytest.fixture
def gated(fake_api: FakeApiServer, bundle: CertBundle) -> Iterator[Gated]:
    fake_api.load([namespace("fresh", {QUOTA: f"{GPU}=2"}), namespace("open")])
    config = Config()
    clock = [1000.0]  # the view's: when the gate saw a figure counted
    view = ClusterView(config, clock=lambda: clock[0])
    api = fake_api.api_client()
    source = LiveSource(view, Ingest(config), api, WatchSettings(connect_timeout=1.0, read_timeout=2.0,
                                                                 server_timeout=30, client_timeout=35.0,
                                                                 backoff_initial=0.05, backoff_max=0.3),
                        kinds=(*KINDS, "resourcequotas"))
    app = create_app(view, config, source.readiness, api, quota_gate=True)
    source.start()
    wait_for(lambda: source.ready, what="the first lists")
    try:
        tls = ReloadingTLS(bundle.cert, bundle.key)
        with ServerThread(make_server(app, "127.0.0.1", 0, tls=tls)) as server, httpx.Client(
                base_url=f"https://localhost:{server.port}", verify=trusting(bundle), timeout=10) as client:
            yield Gated(fake_api, Webhook(config, view, Ingest(config), app, client, clock))
    finally:
        source.stop()
        api.close()
        gc.unfreeze()


def pending(verdict: dict[str, Any]) -> str:
    assert verdict["allowed"] is False, verdict
    assert verdict["status"]["code"] == 503 and verdict["status"]["reason"] == "ServiceUnavailable", verdict
    return str(verdict["status"]["message"])


def test_gpu_pods_wait_until_the_api_server_enforces_the_quota(gated: Gated) -> None:
    message = pending(gated.create("first"))
    assert message == (
        f"namespace fresh may use 2 {GPU} ({QUOTA}), but ResourceQuota fresh/gpu-placement does not exist yet: "
        "gpu-placement writes it and Kubernetes' quota controller counts it within seconds of the annotation, and "
        "until then GPU pods are refused so that never more than the quota is admitted: try again in a few seconds "
        "(if this lasts, check the gpu-placement webhook's quota mirror: its log and gpu_placement_quota_mirror_* "
        "metrics)")
    gated.quota_status(hard=None, used=None)  # written by the mirror, not counted yet: enforces nothing
    assert "has not been counted for requests.nvidia.com/gpu yet" in pending(gated.create("second"))
    gated.quota_status(hard={f"requests.{GPU}": "2"}, used={f"requests.{GPU}": "0"}, settled=False)
    # Counted, as the webhook's watch shows it; the API server's quota admission reads its own informer, which
    # may not show it yet: a pod let in now could be admitted uncharged.
    assert pending(gated.create("third")).startswith(
        f"namespace fresh may use 2 {GPU} ({QUOTA}), but ResourceQuota fresh/gpu-placement was counted at 2 only a "
        "moment ago: the API server's quota admission reads it from its cache, which may lag, so 2 s pass first, and "
        "until then GPU pods are refused")
    gated.later(SETTLE_SECONDS - 0.1)
    assert "only a moment ago" in pending(gated.create("third"))
    gated.later(0.1)
    assert gated.create("third")["allowed"] is True  # the API server's atomic check decides from here
    assert gated.create("fourth")["allowed"] is True
    # What exists is refused with the friendly sentence first (pods admitted a moment ago and not seen yet
    # only warn: the API server decides the last unit).
    wait_for(lambda: {"fresh/third", "fresh/fourth"} <= gated.hook.view.pods.keys(), what="the pods in the view")
    assert "2 are in use" in gated.create("fifth")["status"]["message"]


def test_a_lowered_quota_refuses_pods_until_the_lower_figure_is_in_force(gated: Gated) -> None:
    gated.quota_status(hard={f"requests.{GPU}": "2"}, used={f"requests.{GPU}": "0"})
    gated.annotate(f"{GPU}=1")
    assert "but the API server still enforces 2" in pending(gated.create("a"))
    gated.quota_status(hard={f"requests.{GPU}": "1"}, used={f"requests.{GPU}": "0"}, settled=False)
    assert "was counted at 1 only a moment ago" in pending(gated.create("b"))  # the API server may still read 2
    gated.later()
    assert gated.create("b")["allowed"] is True


def test_a_raised_quota_is_enforced_at_its_old_figure_meanwhile(gated: Gated) -> None:
    """The API server still enforces the lower figure until its controller catches up: hard either way,
    so the webhook lets pods through to that check."""
    gated.quota_status(hard={f"requests.{GPU}": "2"}, used={f"requests.{GPU}": "0"})
    gated.annotate(f"{GPU}=3")
    assert gated.create("a")["allowed"] is True
    # Counted at 3 a moment ago: the API server enforces 2 or 3, both at most the annotation's figure.
    gated.quota_status(hard={f"requests.{GPU}": "3"}, used={f"requests.{GPU}": "1"}, settled=False)
    assert gated.create("b")["allowed"] is True


def test_namespaces_without_a_quota_and_other_resourcequotas_are_not_concerned(gated: Gated) -> None:
    gated.fake.add({"kind": "ResourceQuota", "metadata": {"name": "tenant-limits", "namespace": "fresh"},
                    "spec": {"hard": {f"requests.{GPU}": "64"}},
                    "status": {"hard": {f"requests.{GPU}": "64"}, "used": {f"requests.{GPU}": "0"}}})
    gated.quota_status(hard=None, used=None)  # waits until the view applied its event, which the tenant's precedes
    assert set(gated.hook.view.resourcequotas) == {"fresh"}  # watched by name: the tenant's own is not read
    assert "has not been counted" in pending(gated.create("x"))
    assert gated.create("y", ns="open")["allowed"] is True  # no quota annotation: nothing to wait for


# -- `dra` namespaces: claim pods are gated on every key they are charged (issue 36) ------------------------

STANDIN = "requests.gpu-placement.io/gpu"
DEVICES = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"
IN_FORCE = {STANDIN: "2", DEVICES: "2", f"requests.{GPU}": "2"}  # what the mirror writes for nvidia.com/gpu=2


@pytest.fixture
def dra_gated(hook: Webhook, monkeypatch: pytest.MonkeyPatch) -> Iterator[Webhook]:
    """Namespace `ai` (DRA, nvidia.com/gpu=2) with NVIDIA's classes and its templates in the view, and the
    quota gate on, as with the chart's quota mirror."""
    monkeypatch.setattr(hook.app.state.admission, "quota_gate", True)
    with dra_namespace(hook, "nvidia.com/gpu=2", name="ai"):
        yield hook


def in_force(hook: Webhook, hard: dict[str, str] | None, ns: str = "ai", settled: bool = True) -> None:
    """The ResourceQuota the quota controller counted, as the webhook's watch of it has shown it for long
    enough that the API server's quota admission reads it too."""
    quotas = [] if hard is None else [{"kind": "ResourceQuota", "metadata": {"name": "gpu-placement", "namespace": ns},
                                       "spec": {"hard": hard}, "status": {"hard": hard,
                                                                          "used": {key: "0" for key in hard}}}]
    with hook.view.lock:
        hook.ingest.replace(hook.view, "resourcequotas", quotas)
    if settled:
        hook.clock[0] += SETTLE_SECONDS


def test_claim_pods_wait_until_every_key_they_are_charged_is_in_force(dra_gated: Webhook) -> None:
    """Two replicas admitted 4 claim pods against a quota of 2 while the ResourceQuota was not in force,
    and the API server created every claim: the gate now covers `dra` namespaces."""
    hook = dra_gated
    in_force(hook, None)
    _, verdict = hook.admit(user_pod("ai", "first", gpus={GPU: 1}), "ai")
    assert pending(verdict).startswith(
        f"namespace ai may use 2 {DEVICES} ({QUOTA}), but ResourceQuota ai/gpu-placement does not exist yet")
    in_force(hook, {f"requests.{GPU}": "2"})  # the mirror of a device-plugin namespace: no devices, no stand-ins
    _, verdict = hook.admit(user_pod("ai", "second", gpus={GPU: 1}), "ai")
    assert f"has not been counted for {DEVICES} yet" in pending(verdict)
    in_force(hook, {DEVICES: "2", f"requests.{GPU}": "2"})
    _, verdict = hook.admit(user_pod("ai", "third", gpus={GPU: 1}), "ai")
    assert pending(verdict).startswith(f"namespace ai may use 2 {GPU} ({QUOTA}), but ResourceQuota ai/gpu-placement "
                                       f"has not been counted for {STANDIN} yet")
    in_force(hook, {**IN_FORCE, STANDIN: "3"})  # a quota just lowered from 3: the old figure is still enforced
    _, verdict = hook.admit(user_pod("ai", "fourth", gpus={GPU: 1}), "ai")
    assert "but the API server still enforces 3 (ResourceQuota ai/gpu-placement)" in pending(verdict)
    in_force(hook, IN_FORCE, settled=False)  # lowered to 2 a moment ago: the API server may read 3 yet
    _, verdict = hook.admit(user_pod("ai", "fifth", gpus={GPU: 1}), "ai")
    assert "but ResourceQuota ai/gpu-placement was counted at 2 only a moment ago" in pending(verdict)
    hook.clock[0] += SETTLE_SECONDS
    assert hook.admit(user_pod("ai", "fifth", gpus={GPU: 1}), "ai")[1]["allowed"] is True


# -- holds from callers that are not the API server (review finding 5) -------------------------------------

def forge(hook: Webhook, ns: str, name: str, gpus: int) -> bool:
    """What any pod that reaches the webhook port can send: no client certificate, no token, the shaped pod
    from the open /mutate."""
    port = hook.client.base_url.port
    with httpx.Client(base_url=f"https://127.0.0.1:{port}", verify=False, timeout=10) as attacker:
        pod = user_pod(ns, name, gpus={GPU: gpus}, uid=f"forged-{name}")
        mutated = attacker.post("/mutate", content=orjson.dumps(review(pod, ns))).json()["response"]
        if mutated.get("patch"):
            pod = jsonpatch.apply_patch(pod, orjson.loads(base64.b64decode(mutated["patch"])))
        answer = attacker.post("/validate", content=orjson.dumps(review(pod, ns))).json()["response"]
    return bool(answer["allowed"])


def test_forged_reviews_do_not_make_the_teams_pods_be_refused(gated: Gated) -> None:
    """With the quota in force the API server refuses the pod itself at its create, atomically: a hold, which
    anyone can make, only warns. The repro of the review (repro_unauth_quota_holds.py) with the chart's gate on."""
    gated.quota_status(hard={f"requests.{GPU}": "2"}, used={f"requests.{GPU}": "0"})
    assert forge(gated.hook, "fresh", "never-created", 2) is True
    with gated.hook.view.lock:
        assert gated.hook.app.state.admission.reservations.pending("fresh") == {GPU: 2}
    verdict = gated.create("train-0")
    assert verdict["allowed"] is True, verdict
    assert verdict["warnings"] == [
        f"namespace fresh may use 2 {GPU} ({QUOTA}); 0 are in use, 2 more admitted moments ago may yet be created, "
        "and this pod asks 1 more: if they all are, this one goes over the quota (where gpu-placement mirrors the "
        "quota into a ResourceQuota, the API server refuses it)"]
    # What the view shows exists still refuses, with the sentence.
    wait_for(lambda: "fresh/train-0" in gated.hook.view.pods, what="the pod in the view")
    gated.create("train-1")
    wait_for(lambda: "fresh/train-1" in gated.hook.view.pods, what="the second pod in the view")
    assert "2 are in use and this pod asks 1 more" in gated.create("train-2")["status"]["message"]


def test_forged_reviews_do_not_make_a_teams_claim_pods_be_refused(dra_gated: Webhook) -> None:
    hook = dra_gated
    in_force(hook, IN_FORCE)
    assert forge(hook, "ai", "never-created", 2) is True
    _, verdict = hook.admit(user_pod("ai", "train", gpus={GPU: 1}), "ai")
    assert verdict["allowed"] is True, verdict
    assert "2 more admitted moments ago may yet be created" in verdict["warnings"][0]
    # A pod without its stand-ins (another scheduler's) is charged only when its claims are made: told too,
    # and its claims are refused by the API server if they do not fit.
    other = user_pod("ai", "other", gpus={GPU: 1})
    other["spec"]["schedulerName"] = "volcano"
    _, verdict = hook.admit(other, "ai")
    assert verdict["allowed"] is True and "more admitted moments ago may yet be created" in verdict["warnings"][0]
