"""A namespace the view has not seen yet (over HTTPS, the fake API server behind): read from the API
server, so a Namespace and its Deployment applied in one go get their policy; when it cannot be read,
GPU pods are refused with a retriable answer (audit mode: allowed with a warning)."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import orjson
import pytest

from gpu_placement.base.config import parse_config
from gpu_placement.samples.cluster import namespace
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import KINDS, Ingest
from gpu_placement.web.certs import CertBundle
from gpu_placement.web.serving import ServerThread
from gpu_placement.web.tls import ReloadingTLS, make_server
from tests.fakeapi import FakeApiServer
from tests.support.metrics import sample
from tests.support.webhook import NAMESPACES, TEST_CONFIG, Webhook, find, review, trusting, user_pod
from webhook.app import create_app
from webhook.namespace_reader import NamespaceReader

pytestmark = pytest.mark.timeout(30)

FRESH = namespace("fresh", {"gpu-placement.io/sharing": "shared", "gpu-placement.io/quota": "nvidia.com/gpu.shared=2",
                            "gpu-placement.io/pools": "inference"})


@contextmanager
def webhook(fake: FakeApiServer, bundle: CertBundle, config: dict[str, Any] | None = None) -> Iterator[Webhook]:
    """The app with an API client, its view listed but without the namespaces created just now."""
    parsed = parse_config(config or TEST_CONFIG)
    view = ClusterView(parsed)
    ingest = Ingest(parsed)
    for kind in KINDS:
        ingest.replace(view, kind, copy.deepcopy(NAMESPACES) if kind == "namespaces" else [])
    with fake.api_client() as api:
        app = create_app(view, parsed, lambda: (True, ""), api)
        tls = ReloadingTLS(bundle.cert, bundle.key)
        with ServerThread(make_server(app, "127.0.0.1", 0, tls=tls)) as server, httpx.Client(
                base_url=f"https://localhost:{server.port}", verify=trusting(bundle), timeout=10) as client:
            yield Webhook(parsed, view, ingest, app, client, [0.0])


def test_a_namespace_and_its_pod_in_one_apply_are_shaped_and_metered(fake_api: FakeApiServer,
                                                                     bundle: CertBundle) -> None:
    fake_api.add(FRESH)  # the API server has it; the view's watch event has not come yet
    with webhook(fake_api, bundle) as hook:
        assert "fresh" not in hook.view.namespaces
        big, verdict = hook.admit(user_pod("fresh", None, gpus={"nvidia.com/gpu": 4}), "fresh")
        container = big["spec"]["containers"][0]["resources"]
        assert container["limits"] == {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu.shared": "4"}
        assert big["spec"]["nodeSelector"] == {"nvidia.com/gpu.present": "true", "example.com/pool": "inference",
                                               "zone": "a"}
        assert verdict["allowed"] is False and verdict["status"]["message"] == (
            "namespace fresh may use 2 nvidia.com/gpu.shared (gpu-placement.io/quota); 0 are in use and this pod "
            "asks 4 more: lower the request or raise the quota on the namespace")
        for name in ("a", "b", "c"):
            _, verdict = hook.admit(user_pod("fresh", name, gpus={"nvidia.com/gpu": 1}), "fresh")
            assert verdict["allowed"] is True, verdict
            assert ("warnings" in verdict) is (name == "c"), verdict  # holds are told, never refuse
        assert hook.app.state.admission.reservations.pending("fresh") == {"nvidia.com/gpu.shared": 3}
        assert fake_api.count("get", "/api/v1/namespaces/fresh") == 1  # one GET, then the cache
        # The view's record wins once it has one.
        hook.ingest.event(hook.view, "namespaces", "ADDED", namespace("fresh", {"gpu-placement.io/quota": "x=1"}))
        _, verdict = hook.admit(user_pod("fresh", "d", gpus={"nvidia.com/gpu": 1}), "fresh")
        assert "gpu-placement.io/quota=\"x=1\" on namespace fresh" in verdict["status"]["message"]
        assert fake_api.count("get", "/api/v1/namespaces/fresh") == 1


def test_pods_in_namespaces_the_view_has_cost_no_request(fake_api: FakeApiServer, bundle: CertBundle) -> None:
    with webhook(fake_api, bundle) as hook:
        fake_api.clear_log()
        for ns in ("team-a", "web", "kube-system"):
            hook.admit(user_pod(ns, "p", gpus={"nvidia.com/gpu": 1}), ns)
        assert fake_api.requests_log == []


def test_a_namespace_that_cannot_be_read_is_a_retriable_refusal(fake_api: FakeApiServer,
                                                                bundle: CertBundle) -> None:
    fake_api.add(FRESH)
    fake_api.fail_next(1, 503, path="/api/v1/namespaces/fresh")
    with webhook(fake_api, bundle) as hook:
        pod = user_pod("fresh", "a", gpus={"nvidia.com/gpu": 1})
        mutated, ops, response = hook.mutate(pod, "fresh")
        assert ops == [] and response["warnings"][0].startswith("namespace fresh is not in gpu-placement's view yet")
        verdict = hook.validate(mutated, "fresh")
        assert verdict["allowed"] is False
        assert verdict["status"]["code"] == 503 and verdict["status"]["reason"] == "ServiceUnavailable"
        assert verdict["status"]["message"] == (
            "namespace fresh is not in gpu-placement's view yet and could not be read from the API server (the API "
            "server answered HTTP 503 ServiceUnavailable: the server is currently unable to handle the request), so "
            "its GPU policy (the gpu-placement.io/* annotations) is unknown: try again in a few seconds")
        # A pod without GPUs is not held up by it.
        assert hook.validate(user_pod("fresh", "cpu"), "fresh")["allowed"] is True
        hook.app.state.admission.reader.retry_seconds = 0.0  # a moment later: read again, and decided normally
        assert hook.admit(pod, "fresh")[1]["allowed"] is True


def test_audit_mode_allows_with_the_sentence_as_a_warning(fake_api: FakeApiServer, bundle: CertBundle) -> None:
    with webhook(fake_api, bundle, {**TEST_CONFIG, "mode": "audit"}) as hook:
        _, verdict = hook.admit(user_pod("gone", "a", gpus={"nvidia.com/gpu": 1}), "gone")
        assert verdict["allowed"] is True
        assert verdict["warnings"] == [
            "namespace gone is not in gpu-placement's view yet and could not be read from the API server (the API "
            "server answered HTTP 404 NotFound: namespaces \"gone\" not found), so its GPU policy (the "
            "gpu-placement.io/* annotations) is unknown: try again in a few seconds"]


def test_the_mutate_patch_is_unchanged_by_where_the_namespace_came_from(fake_api: FakeApiServer,
                                                                        bundle: CertBundle) -> None:
    fake_api.add(FRESH)
    with webhook(fake_api, bundle) as hook:
        _, from_api, _ = hook.mutate(user_pod("fresh", "x", gpus={"nvidia.com/gpu": 1}), "fresh")
        hook.ingest.event(hook.view, "namespaces", "ADDED", FRESH)
        _, from_view, _ = hook.mutate(user_pod("fresh", "x", gpus={"nvidia.com/gpu": 1}), "fresh")
        assert from_api == from_view and find(from_api, "/spec/schedulerName")


# -- forged reviews: the webhook port is reachable from every pod (issue 36) --------------------------

@pytest.mark.parametrize(("forged", "got"), [
    ("../../apis/x", 'a string "../../apis/x"'), ("a?watch=true", 'a string "a?watch=true"'), ("A", 'a string "A"'),
    ("a" * 64, "64 characters"), ("-a", 'a string "-a"'), ("a.b", 'a string "a.b"')])
def test_a_forged_namespace_is_refused_and_never_reaches_the_api_server(fake_api: FakeApiServer, bundle: CertBundle,
                                                                         forged: str, got: str) -> None:
    with webhook(fake_api, bundle) as hook:
        fake_api.clear_log()
        for path in ("/mutate", "/validate"):
            answer = hook.post(path, review(user_pod("fresh", "a", gpus={"nvidia.com/gpu": 1}), forged))
            assert answer.status_code == 400
            status = answer.json()
            assert (status["kind"], status["reason"], status["code"]) == ("Status", "BadRequest", 400)
            assert status["message"] == (
                "request.namespace: expected a namespace name (at most 63 lowercase letters, digits and '-', starting "
                f"and ending with a letter or digit, as the API server names namespaces), got {got}")
        assert fake_api.requests_log == []


def test_a_pod_namespace_read_from_the_object_is_held_to_the_same_rule(fake_api: FakeApiServer,
                                                                      bundle: CertBundle) -> None:
    """A review without request.namespace (the API server always sends one for a pod) falls back to the
    pod's own metadata.namespace: a refusal naming that field, and no GET."""
    with webhook(fake_api, bundle) as hook:
        fake_api.clear_log()
        body = review(user_pod("../x", "a", gpus={"nvidia.com/gpu": 1}), "")
        del body["request"]["namespace"]
        verdict = hook.answer("/validate", body)
        assert verdict["allowed"] is False and verdict["status"]["code"] == 400
        assert verdict["status"]["message"].startswith('request.object.metadata.namespace: expected a namespace name')
        assert fake_api.requests_log == []


def test_the_namespace_goes_into_the_path_as_one_segment(fake_api: FakeApiServer) -> None:
    """Quoted where it goes into the GET's path, should anything but a namespace name get that far."""
    with fake_api.api_client() as api:
        reader = NamespaceReader(ClusterView(parse_config(TEST_CONFIG)), api)
        asyncio.run(reader.read("a?watch=true"))
    [record] = [r for r in fake_api.requests_log if r.path.startswith("/api/v1/namespaces/")]
    assert (record.verb, record.path, record.query) == ("get", "/api/v1/namespaces/a%3Fwatch=true", {})  # no watch


def test_a_namespace_that_does_not_exist_is_not_read_again_and_again(fake_api: FakeApiServer,
                                                                     bundle: CertBundle) -> None:
    """The API server never sends a review for a namespace that does not exist (NamespaceLifecycle
    refuses the create first): a 404 is kept for a while, so forged reviews naming it cost one GET."""
    with webhook(fake_api, bundle) as hook:
        reader = hook.app.state.admission.reader
        reader.retry_seconds = 0.0  # other failures: asked again at once
        for name in ("a", "b", "c"):
            verdict = hook.validate(user_pod("nowhere", name, gpus={"nvidia.com/gpu": 1}), "nowhere")
            assert verdict["allowed"] is False and verdict["status"]["code"] == 503
            assert 'namespaces \\"nowhere\\" not found' in orjson.dumps(verdict["status"]["message"]).decode()
        assert fake_api.count("get", "/api/v1/namespaces/nowhere") == 1
        reader.missing_seconds = 0.0  # its time is up: asked again
        hook.validate(user_pod("nowhere", "d", gpus={"nvidia.com/gpu": 1}), "nowhere")
        assert fake_api.count("get", "/api/v1/namespaces/nowhere") == 2


def test_reviews_naming_many_unknown_namespaces_are_refused_without_a_read(fake_api: FakeApiServer,
                                                                           bundle: CertBundle) -> None:
    """Past its rate of reads, a namespace the view lacks is not read: the pod is refused retriably,
    the sentence says why, and the metric counts it."""
    limited = sample("gpu_placement_namespace_reads_total", outcome="limited")
    with webhook(fake_api, bundle) as hook:
        reader = hook.app.state.admission.reader
        reader.burst, reader.reads_per_second = 5, 0.001  # five reads, then none within the test's time
        fake_api.clear_log()
        verdicts = [hook.validate(user_pod(f"forged-{i}", "p", gpus={"nvidia.com/gpu": 1}), f"forged-{i}")
                    for i in range(12)]
        reads = [r for r in fake_api.requests_log if r.path.startswith("/api/v1/namespaces/forged-")]
        assert len(reads) == 5
        for verdict in verdicts[5:]:
            assert verdict["allowed"] is False and verdict["status"]["code"] == 503
            namespace = verdict["status"]["message"].split()[1]
            assert verdict["status"]["message"] == (
                f"namespace {namespace} is not in gpu-placement's view yet and could not be read from the API server "
                "(not asked: reviews named namespaces it lacks faster than it reads them (5 at once, then 0.001 a "
                "second), which only reviews the API server did not send do), so its GPU policy (the "
                "gpu-placement.io/* annotations) is unknown: try again in a few seconds")
        assert sample("gpu_placement_namespace_reads_total", outcome="limited") == limited + 7
        fake_api.add(FRESH)  # a real namespace the view has: no read needed, decided as ever
        hook.ingest.event(hook.view, "namespaces", "ADDED", FRESH)
        assert hook.admit(user_pod("fresh", "a", gpus={"nvidia.com/gpu": 1}), "fresh")[1]["allowed"] is True
