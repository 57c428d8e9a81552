"""The webhooks, written into the chart's empty configurations by a replica once it answers
(webhook/registration.py), against the fake API server through the real client."""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any

import helm_python
import kubernetes_validate
import pytest
import yaml

from tests.fakeapi import FakeApiServer
from tests.support.chart import CHART, offline
from webhook.registration import (
    REGISTERED_ANNOTATION,
    RegistrationSettings,
    WebhookRegistration,
    load_webhook_spec,
)

pytestmark = pytest.mark.timeout(30)

NAME, NS, SERVICE = "gpu-placement", "gpu-placement", "gpu-placement-webhook"
NOW = RegistrationSettings(interval_seconds=0.05, recheck_seconds=0.05, settle_seconds=0.0)


def spec() -> dict[str, list[dict[str, Any]]]:
    def hook(name: str, path: str) -> dict[str, Any]:
        return {"name": name, "admissionReviewVersions": ["v1"], "sideEffects": "None", "failurePolicy": "Fail",
                "clientConfig": {"service": {"name": SERVICE, "namespace": NS, "path": path, "port": 443}},
                "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}]}
    return {"mutating": [hook("mutate.gpu-placement.io", "/mutate")],
            "validating": [hook("validate.gpu-placement.io", "/validate")]}


def empty_configurations(fake: FakeApiServer) -> None:
    """What the chart installs: both configurations, no webhooks."""
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        fake.add({"kind": kind, "metadata": {"name": NAME, "annotations": {"gpu-placement.io/webhooks": "later"}}})


def endpoint(fake: FakeApiServer, ready: bool) -> None:
    fake.upsert({"kind": "EndpointSlice", "apiVersion": "discovery.k8s.io/v1", "addressType": "IPv4",
                 "metadata": {"name": f"{SERVICE}-abcde", "namespace": NS,
                              "labels": {"kubernetes.io/service-name": SERVICE}},
                 "endpoints": [{"addresses": ["10.0.0.7"], "conditions": {"ready": ready}}]})


def webhooks(fake: FakeApiServer, kind: str) -> list[dict[str, Any]] | None:
    obj = fake.get(kind, NAME)
    return None if obj is None else obj.get("webhooks")


@pytest.fixture
def registration(fake_api: FakeApiServer, tmp_path: Path) -> Any:
    state = {"ready": False}
    ca = tmp_path / "ca.crt"
    ca.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    api = fake_api.api_client()
    made = WebhookRegistration(api, NAME, NS, SERVICE, spec(), lambda: state["ready"], ca, "pod-a", NOW)
    made.state = state  # type: ignore[attr-defined]
    yield made
    made.stop()
    api.close()


def test_nothing_is_sent_to_the_webhook_until_a_replica_is_ready_and_the_service_has_an_endpoint(
        fake_api: FakeApiServer, registration: Any) -> None:
    empty_configurations(fake_api)
    registration.step()
    assert webhooks(fake_api, "ValidatingWebhookConfiguration") is None, "not ready: nothing written"
    registration.state["ready"] = True
    registration.step()
    assert webhooks(fake_api, "ValidatingWebhookConfiguration") is None, "no endpoint: nothing written"
    endpoint(fake_api, ready=False)
    registration.step()
    assert webhooks(fake_api, "ValidatingWebhookConfiguration") is None, "an endpoint that is not ready"
    endpoint(fake_api, ready=True)
    registration.step()
    assert registration.registered
    bundle = base64.b64encode(registration.ca_file.read_bytes()).decode()
    for kind, key in (("MutatingWebhookConfiguration", "mutating"), ("ValidatingWebhookConfiguration", "validating")):
        written = fake_api.get(kind, NAME)
        assert written is not None
        expected = [{**hook, "clientConfig": {**hook["clientConfig"], "caBundle": bundle}} for hook in spec()[key]]
        assert written["webhooks"] == expected
        assert written["metadata"]["annotations"]["gpu-placement.io/webhooks"] == "later"  # the chart's own kept
        assert written["metadata"]["annotations"][REGISTERED_ANNOTATION].endswith(" by pod-a")


def test_the_settle_time_runs_from_the_first_ready_endpoint(fake_api: FakeApiServer, tmp_path: Path) -> None:
    empty_configurations(fake_api)
    endpoint(fake_api, ready=True)
    api = fake_api.api_client()
    slow = WebhookRegistration(api, NAME, NS, SERVICE, spec(), lambda: True, None, "pod-a",
                               RegistrationSettings(interval_seconds=0.05, recheck_seconds=0.05, settle_seconds=0.3))
    try:
        slow.step()
        assert not slow.registered
        slow._stop.wait(0.35)
        slow.step()
        assert slow.registered
    finally:
        api.close()


def test_on_a_rolling_update_a_new_replica_writes_as_soon_as_it_is_ready(fake_api: FakeApiServer) -> None:
    """The old replicas are the Service's endpoints already: the settle time runs while it starts."""
    empty_configurations(fake_api)
    endpoint(fake_api, ready=True)
    state = {"ready": False}
    api = fake_api.api_client()
    new = WebhookRegistration(api, NAME, NS, SERVICE, spec(), lambda: state["ready"], None, "pod-new",
                              RegistrationSettings(interval_seconds=0.05, recheck_seconds=0.05, settle_seconds=0.3))
    try:
        new.step()  # starting: the endpoint is seen, the settle time starts
        new._stop.wait(0.35)
        state["ready"] = True
        new.step()
        assert new.registered
    finally:
        api.close()


def test_a_replica_writes_once_so_old_and_new_replicas_never_write_in_turn(fake_api: FakeApiServer,
                                                                           registration: Any) -> None:
    """Rolling update: the new replica's webhooks stay; only an emptied configuration is written again."""
    empty_configurations(fake_api)
    endpoint(fake_api, ready=True)
    registration.state["ready"] = True
    registration.step()
    newer = [{**spec()["validating"][0], "timeoutSeconds": 3}]
    fake_api.patch("ValidatingWebhookConfiguration", NAME, {"webhooks": newer})
    for _ in range(3):
        registration.step()
    assert webhooks(fake_api, "ValidatingWebhookConfiguration") == newer
    fake_api.patch("ValidatingWebhookConfiguration", NAME, {"webhooks": []})  # emptied by hand or a sync
    registration.step()
    assert [h["name"] for h in webhooks(fake_api, "ValidatingWebhookConfiguration") or []] == [
        "validate.gpu-placement.io"]


def test_without_a_ca_file_the_live_ca_bundle_is_kept(fake_api: FakeApiServer, tmp_path: Path) -> None:
    """cert-manager's cainjector may have written it already."""
    empty_configurations(fake_api)
    fake_api.patch("MutatingWebhookConfiguration", NAME, {"webhooks": [
        {**spec()["mutating"][0], "clientConfig": {**spec()["mutating"][0]["clientConfig"], "caBundle": "Q0E="}}]})
    endpoint(fake_api, ready=True)
    api = fake_api.api_client()
    try:
        made = WebhookRegistration(api, NAME, NS, SERVICE, spec(), lambda: True, tmp_path / "none.crt", "pod-a", NOW)
        made.step()
    finally:
        api.close()
    assert (webhooks(fake_api, "MutatingWebhookConfiguration") or [])[0]["clientConfig"]["caBundle"] == "Q0E="
    assert "caBundle" not in (webhooks(fake_api, "ValidatingWebhookConfiguration") or [])[0]["clientConfig"]


def test_a_missing_configuration_is_not_created(fake_api: FakeApiServer, registration: Any,
                                                caplog: pytest.LogCaptureFixture) -> None:
    """Deleted by hand (the emergency stop) or by helm uninstall: it stays gone until Helm puts it back."""
    endpoint(fake_api, ready=True)
    registration.state["ready"] = True
    registration.step()
    assert not registration.registered
    assert fake_api.get("ValidatingWebhookConfiguration", NAME) is None
    assert "does not exist" in caplog.text
    empty_configurations(fake_api)  # helm upgrade
    registration.step()
    assert registration.registered


@pytest.mark.parametrize("text, problem", [
    ("[]", "expected a mapping"),
    ("mutating: []\nextra: []\n", "expected a mapping"),
    ("mutating: [{name: x}]\n", "each with a name and a clientConfig"),
    ("validating: {name: x}\n", "must be a list"),
])
def test_a_bad_webhooks_file_is_named(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "webhooks.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=problem):
        load_webhook_spec(path)


def test_the_charts_webhooks_file_loads_and_the_written_configurations_are_valid(tmp_path: Path) -> None:
    with helm_python.Chart.load(CHART) as chart:
        files = chart.render(offline({}), name=NAME, namespace=NS)
    docs = [d for path, text in files.items() if path.endswith(".yaml") for d in yaml.safe_load_all(text) if d]
    [configmap] = [d for d in docs if d.get("kind") == "ConfigMap" and d["metadata"]["name"] == f"{NAME}-webhooks"]
    path = tmp_path / "webhooks.yaml"
    path.write_text(configmap["data"]["webhooks.yaml"])
    loaded = load_webhook_spec(path)
    for kind, key in (("MutatingWebhookConfiguration", "mutating"), ("ValidatingWebhookConfiguration", "validating")):
        [empty] = [d for d in docs if d.get("kind") == kind]
        assert "webhooks" not in empty, "the chart installs the configurations without webhooks"
        armed = {**empty, "webhooks": loaded[key]}
        kubernetes_validate.validate(armed, kubernetes_validate.utils.latest_version(), strict=True)
