"""A ResourceClaimTemplate (or claim) and the pod that names it, applied in one go: the API server has the
template before the pod's admission, our watch may not. /mutate reads what the view lacks from the API
server (webhook/claim_reader.py) and routes the pod to gpu-placement as it would with the view's
record; when the API server is slow, down or has no such object, the pod is left to its scheduler with
a warning that says which object and what the API server did."""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import pytest

from gpu_placement.base.config import parse_config
from gpu_placement.observe import metrics
from gpu_placement.samples.dra import device_classes
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import KINDS, Ingest
from gpu_placement.web.certs import CertBundle
from gpu_placement.web.serving import ServerThread
from gpu_placement.web.tls import ReloadingTLS, make_server
from tests.fakeapi import FakeApiServer
from tests.support.dra import bare, claim_pod, template
from tests.support.webhook import NAMESPACES, TEST_CONFIG, Webhook, review, trusting
from webhook.app import create_app

pytestmark = pytest.mark.timeout(60)
TEMPLATES = "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaimtemplates"


@pytest.fixture
def fake_api() -> Iterator[FakeApiServer]:
    """The fake API server serving resource.k8s.io/v1, as 1.34 and later do."""
    with FakeApiServer(dra="v1") as server:
        yield server


@contextmanager
def webhook(fake: FakeApiServer, bundle: CertBundle) -> Iterator[Webhook]:
    """The app with an API client, its view listed (DRA served: the device classes, no template yet)."""
    parsed = parse_config(TEST_CONFIG)
    view = ClusterView(parsed)
    ingest = Ingest(parsed)
    for kind in KINDS:
        ingest.replace(view, kind, copy.deepcopy(NAMESPACES) if kind == "namespaces" else [])
    with view.lock:
        ingest.replace(view, "deviceclasses", copy.deepcopy(device_classes()))
        ingest.replace(view, "resourceclaimtemplates", [])
        ingest.replace(view, "resourceclaims", [])
    with fake.api_client() as api:
        app = create_app(view, parsed, lambda: (True, ""), api, dra_version="v1")
        tls = ReloadingTLS(bundle.cert, bundle.key)
        with ServerThread(make_server(app, "127.0.0.1", 0, tls=tls)) as server, httpx.Client(
                base_url=f"https://localhost:{server.port}", verify=trusting(bundle), timeout=20) as client:
            yield Webhook(parsed, view, ingest, app, client, [0.0])


def reads(outcome: str) -> float:
    return float(metrics.CLAIM_READS.labels(outcome)._value.get())


def test_a_pod_applied_with_its_template_is_routed_to_gpu_placement(fake_api: FakeApiServer,
                                                                   bundle: CertBundle) -> None:
    fake_api.add(template("team-a", "one-gpu", "gpu.nvidia.com"))  # created; its watch event not here yet
    with webhook(fake_api, bundle) as hook:
        assert "team-a/one-gpu" not in hook.view.dra.templates
        before = reads("ok")
        mutated, _, response = hook.mutate(bare(claim_pod("team-a", "train", "one-gpu")), "team-a")
        assert mutated["spec"]["schedulerName"] == "gpu-placement", response
        assert mutated["spec"]["nodeSelector"] == {"pool": "training"}  # the namespace's pool, as from the view
        assert orjson.loads(mutated["metadata"]["annotations"]["gpu-placement.io/admitted"]) == {
            "claims": ["gpu.nvidia.com"], "pools": ["training"], "scheduler": "gpu-placement"}
        assert "warnings" not in response
        assert fake_api.count("get", f"{TEMPLATES}/one-gpu") == 1 and reads("ok") == before + 1
        hook.mutate(bare(claim_pod("team-a", "second", "one-gpu")), "team-a")  # the answer is kept
        assert fake_api.count("get", f"{TEMPLATES}/one-gpu") == 1
        # The view's record wins once it has one (here: it says the template asks for a NIC, not a GPU).
        nic = template("team-a", "one-gpu", "nic.example.com")
        hook.ingest.event(hook.view, "resourceclaimtemplates", "ADDED", nic)
        mutated, ops, _ = hook.mutate(bare(claim_pod("team-a", "third", "one-gpu")), "team-a")
        assert ops == [] and "schedulerName" not in mutated["spec"]


def test_a_claim_named_by_the_pod_is_read_as_well(fake_api: FakeApiServer, bundle: CertBundle) -> None:
    claim = template("team-a", "shared-gpu", "gpu.nvidia.com")
    claim.update(kind="ResourceClaim", spec=claim["spec"]["spec"])
    fake_api.add(claim)
    with webhook(fake_api, bundle) as hook:
        mutated, _, _ = hook.mutate(bare(claim_pod("team-a", "user", claim="shared-gpu")), "team-a")
        assert mutated["spec"]["schedulerName"] == "gpu-placement"
        assert fake_api.count("get", "/apis/resource.k8s.io/v1/namespaces/team-a/resourceclaims/shared-gpu") == 1


def test_pods_whose_claims_the_view_has_cost_no_request(fake_api: FakeApiServer, bundle: CertBundle) -> None:
    with webhook(fake_api, bundle) as hook:
        hook.ingest.event(hook.view, "resourceclaimtemplates", "ADDED", template("team-a", "one-gpu", "gpu.nvidia.com"))
        fake_api.clear_log()
        mutated, _, _ = hook.mutate(bare(claim_pod("team-a", "train", "one-gpu")), "team-a")
        assert mutated["spec"]["schedulerName"] == "gpu-placement"
        hook.validate(mutated, "team-a")
        assert fake_api.requests_log == []


def test_a_template_the_api_server_does_not_have_is_told(fake_api: FakeApiServer, bundle: CertBundle) -> None:
    with webhook(fake_api, bundle) as hook:
        mutated, ops, response = hook.mutate(bare(claim_pod("team-a", "early", "not-yet")), "team-a")
        assert ops == [] and "schedulerName" not in mutated["spec"]
        assert response["warnings"] == [
            "pod team-a/early uses ResourceClaimTemplate team-a/not-yet, which is not in gpu-placement's view yet and "
            "could not be read from the API server (the API server answered HTTP 404 NotFound: "
            "resourceclaimtemplates.resource.k8s.io \"not-yet\" not found): if it asks for a GPU, the pod is not "
            "routed to the gpu-placement scheduler and its GPUs are not checked by gpu-placement's node rules "
            "(create the claim or template before the pod, or create the pod again)"]
        # A moment later (retry_seconds) the template exists: read again, and routed.
        fake_api.add(template("team-a", "not-yet", "gpu.nvidia.com"))
        hook.app.state.admission.claim_reader.retry_seconds = 0.0
        mutated, _, _ = hook.mutate(bare(claim_pod("team-a", "later", "not-yet")), "team-a")
        assert mutated["spec"]["schedulerName"] == "gpu-placement"


def test_a_slow_api_server_holds_the_pod_for_the_read_timeout_only(fake_api: FakeApiServer,
                                                                   bundle: CertBundle) -> None:
    fake_api.add(template("team-a", "one-gpu", "gpu.nvidia.com"))
    with webhook(fake_api, bundle) as hook:
        reader = hook.app.state.admission.claim_reader
        reader.timeout = (0.5, 0.5)
        delay = fake_api.delay = 5.0  # every request: longer than the read's timeouts
        before = reads("timeout")
        start = time.monotonic()
        try:
            mutated, ops, response = hook.mutate(bare(claim_pod("team-a", "train", "one-gpu")), "team-a")
        finally:
            fake_api.delay = 0.0
        took = time.monotonic() - start
        assert ops == [] and "schedulerName" not in mutated["spec"]
        assert "could not be read from the API server (the API server did not answer within 1 s)" in \
            response["warnings"][0], response
        assert reads("timeout") == before + 1
        assert took < delay, took  # the read gave up: the pod was not held as long as the API server took


def test_an_api_server_that_is_down_is_told(fake_api: FakeApiServer, bundle: CertBundle) -> None:
    with webhook(fake_api, bundle) as hook:
        fake_api.down()
        try:
            _, ops, response = hook.mutate(bare(claim_pod("team-a", "train", "one-gpu")), "team-a")
        finally:
            fake_api.up()
        assert ops == []
        assert "ResourceClaimTemplate team-a/one-gpu, which is not in gpu-placement's view yet and could not be " \
               "read from the API server (the API server could not be reached" in response["warnings"][0], response


def test_names_that_are_not_kubernetes_names_are_not_read(fake_api: FakeApiServer, bundle: CertBundle) -> None:
    """A forged review (finding 5) must not turn into GETs of other paths with the webhook's token."""
    with webhook(fake_api, bundle) as hook:
        fake_api.clear_log()
        for name in ("../../../api/v1/secrets", "x?watch=true", "Upper", "a" * 254):
            pod: dict[str, Any] = bare(claim_pod("team-a", "odd", name))
            response = hook.answer("/mutate", review(pod, "team-a"))
            assert "patch" not in response, response  # allowed as is, or refused at the edge (BadPod)
            assert response["allowed"] is False or "was not read from the API server" in response["warnings"][0]
        assert fake_api.requests_log == []


def test_a_new_namespace_and_a_new_template_are_read_at_the_same_time(fake_api: FakeApiServer,
                                                                      bundle: CertBundle) -> None:
    """A Namespace, a template and a pod in one apply, the API server slow: the two reads run side by
    side, so the pod waits for one read's timeout, within the API server's timeoutSeconds (5 s), not
    for their sum."""
    fake_api.add({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "fresh"}})
    fake_api.add(template("fresh", "one-gpu", "gpu.nvidia.com"))
    with webhook(fake_api, bundle) as hook:
        admission = hook.app.state.admission
        admission.reader.timeout = admission.claim_reader.timeout = (1.0, 1.0)  # 2 s each, 4 s one after another
        fake_api.delay = 6.0
        start = time.monotonic()
        try:
            response = hook.answer("/mutate", review(bare(claim_pod("fresh", "train", "one-gpu")), "fresh"))
        finally:
            fake_api.delay = 0.0
        took = time.monotonic() - start
        assert response["allowed"] is True and "did not answer within 2 s" in response["warnings"][0], response
        assert admission.reader.reads == 1 and admission.claim_reader.reads == 1
        assert took < 3.5, took  # one timeout (2 s) and the answer; the two in a row would be 4 s
