"""The webhook's HTTP edge over real HTTPS: malformed reviews (400 with a v1.Status body), bad pods
(200, allowed false, code 400), the body limit (413), unknown paths, crashes (500 with a body), query
strings, keep-alive, the ops routes and the per-decision debug log line."""

from __future__ import annotations

import copy
import logging
import random
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonpatch
import orjson
import pytest

from tests.test_webhook_helpers import Webhook, certificates, patch_of, review, user_pod
from webhook.app import MAX_BODY
from webhook.certs import CertBundle

pytestmark = pytest.mark.timeout(30)


def status_of(response: httpx.Response, code: int) -> str:
    """The v1.Status body of an error answer; returns its message."""
    assert response.status_code == code, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert body["kind"] == "Status" and body["apiVersion"] == "v1" and body["status"] == "Failure"
    assert body["code"] == code
    return body["message"]


def good() -> dict[str, Any]:
    return review(user_pod("team-a", "p", gpus={"nvidia.com/gpu": 1}), "team-a")


@pytest.mark.parametrize(("body", "phrase"), [
    (b"", "empty body"),
    (b"{not json", "body is not valid JSON"),
    (b"\xff\xfe", "body is not valid JSON"),
    (b"[1, 2]", "body must be a JSON object (an AdmissionReview), got a list"),
    (b'"review"', "got a string"),
    (orjson.dumps({**good(), "apiVersion": "admission.k8s.io/v1beta1"}),
     'got apiVersion "admission.k8s.io/v1beta1" and kind "AdmissionReview"'),
    (orjson.dumps({**good(), "kind": "Pod"}), 'kind "Pod"'),
    (orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}), "has no request object"),
    (orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": []}),
     "request must be an object, got a list"),
    (orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"object": {}}}),
     "request.uid is missing"),
    (orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": 7}}),
     "request.uid is missing or not a non-empty string"),
    (orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "request": {"uid": "u", "dryRun": "yes"}}), 'dryRun must be true or false, got "yes"'),
    (orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "request": {"uid": "u", "namespace": ["a"]}}), "request.namespace must be a string"),
    (orjson.dumps({"apiVersion": "\u202eadmission\U0001f680", "kind": "AdmissionReview"}), '"\\u202eadmission🚀"'),
])
def test_malformed_reviews_are_400_with_a_status_body(hook: Webhook, body: bytes, phrase: str) -> None:
    for path in ("/mutate", "/validate?timeout=10s"):
        assert phrase in status_of(hook.post(path, body), 400)


@pytest.mark.parametrize(("change", "phrase"), [
    (lambda r: r["request"].pop("object"), "request.object is missing"),
    (lambda r: r["request"].update(object=[1]), "request.object must be a Pod object, got a list"),
    (lambda r: r["request"]["object"].update(kind="Deployment", apiVersion="apps/v1"),
     'request.object is "apps/v1" "Deployment", but the review is about a v1 Pod'),
    (lambda r: r["request"].update(kind={"group": "", "version": "v1", "kind": "Service"}),
     "request.kind is v1 Service but request.resource is pods"),
    (lambda r: r["request"]["object"].pop("spec"), "request.object has no spec"),
    (lambda r: r["request"]["object"]["spec"].update(containers={"main": {}}), "spec.containers must be a list"),
    (lambda r: r["request"]["object"]["metadata"].update(annotations={"a": 1}), "metadata.annotations must map"),
    (lambda r: r["request"]["object"]["spec"].update(tolerations={"key": "x"}), "spec.tolerations must be a list"),
    (lambda r: r["request"]["object"]["spec"].update(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": {"a": 1}}}}), "nodeSelectorTerms"),
    (lambda r: r["request"]["object"]["spec"]["containers"][0]["resources"]["limits"].update(
        {"nvidia.com/gpu": "1e999999999"}), 'limits[nvidia.com/gpu]: "1e999999999" is not a quantity'),
    (lambda r: r["request"]["object"]["spec"]["containers"][0]["resources"]["limits"].update(
        {"nvidia.com/gpu": "０"}), "U+FF10 FULLWIDTH DIGIT ZERO"),
    (lambda r: r["request"]["object"]["spec"]["containers"][0]["resources"]["limits"].update(
        {"nvidia.com/gpu": "0.5"}), "is not a whole number of devices"),
    (lambda r: r["request"]["object"]["spec"]["containers"][0]["resources"].update(limits=["1"]),
     "resources.limits must map resource names to quantities"),
])
def test_a_well_formed_review_with_a_bad_pod_is_a_clean_refusal(hook: Webhook, change: Any, phrase: str) -> None:
    body = good()
    change(body)
    for path in ("/mutate", "/validate"):
        start = time.perf_counter()
        response = hook.answer(path, body)
        assert time.perf_counter() - start < 1.0
        assert response["allowed"] is False
        assert response["status"]["code"] == 400 and response["status"]["reason"] == "BadRequest"
        assert phrase in response["status"]["message"]


def test_an_oversized_body_is_413(hook: Webhook) -> None:
    body = good()
    body["request"]["object"]["metadata"]["annotations"]["filler"] = "x" * MAX_BODY
    message = status_of(hook.post("/mutate", body), 413)
    assert "exceeds the limit of 3145728 bytes" in message
    # Streamed without a Content-Length: refused as soon as it passes the limit.
    def chunks() -> Iterator[bytes]:
        yield b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": {"uid": "u", "x": "'
        for _ in range(64):
            yield b"y" * 65536
        yield b'"}}'
    response = hook.client.post("/validate", content=chunks(), headers={"Content-Type": "application/json"})
    assert "exceeds the limit" in status_of(response, 413)
    assert hook.answer("/mutate", good())["allowed"] is True  # and the server is fine


def test_a_review_just_under_the_limit_is_answered(hook: Webhook) -> None:
    body = good()
    body["request"]["object"]["metadata"]["annotations"]["filler"] = "x" * (MAX_BODY - 2048)
    assert hook.answer("/validate", body)["allowed"] is True


def test_query_strings_are_ignored(hook: Webhook) -> None:
    for path in ("/mutate?timeout=10s", "/validate?timeout=10s", "/mutate?timeout=30s&x=1", "/validate?"):
        assert hook.answer(path, good())["allowed"] is True


def test_unknown_paths_and_methods_are_json(hook: Webhook) -> None:
    assert "is not a webhook endpoint" in status_of(hook.client.get("/mutate"), 405)
    assert "is not a webhook endpoint" in status_of(hook.post("/admit", good()), 404)


def test_a_crash_is_a_500_with_a_body_and_is_logged(hook: Webhook, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    def boom(_request: Any) -> Any:
        raise RuntimeError("the view is on fire")

    monkeypatch.setattr(hook.app.state.admission, "mutate", boom)
    with caplog.at_level(logging.ERROR, logger="gpu_placement.webhook"):
        message = status_of(hook.post("/mutate", good()), 500)
    assert message == "internal error in the gpu-placement webhook: RuntimeError: the view is on fire"
    assert any(r.levelno == logging.ERROR and r.exc_info for r in caplog.records)
    assert hook.answer("/validate", good())["allowed"] is True


def test_one_json_debug_line_per_decision(hook: Webhook, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG, logger="gpu_placement.webhook"):
        hook.answer("/mutate", good())
        hook.answer("/validate", review(user_pod("web", "w", gpus={"nvidia.com/gpu": 1}), "web", uid="u-web"))
    lines = [r for r in caplog.records if r.name == "gpu_placement.webhook" and r.levelno == logging.DEBUG]
    assert len(lines) == 2
    assert all(r.msg == "webhook decision %s" for r in lines)  # %s arguments, not pre-formatted
    mutate, validate = (orjson.loads(r.getMessage().removeprefix("webhook decision ")) for r in lines)
    assert mutate["verb"] == "mutate" and mutate["reason"] == "Mutated" and mutate["patched"] is True
    assert validate == {"verb": "validate", "uid": "u-web", "namespace": "web", "pod": "w", "allowed": False,
                        "reason": "NoGpuAccess", "problems": [validate["problems"][0]]}


def test_keep_alive_many_requests_one_connection(hook: Webhook) -> None:
    for index in range(50):
        body = review(user_pod("team-a", f"p{index}", gpus={"nvidia.com/gpu": 1}), "team-a", dry_run=True)
        assert hook.answer("/mutate" if index % 2 else "/validate", body)["allowed"] is True


def test_only_the_generated_ca_is_trusted(hook: Webhook, bundle: CertBundle, tmp_path: Path) -> None:
    port = hook.client.base_url.port
    other = certificates(tmp_path / "other")
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(other.ca_cert))
    with httpx.Client(verify=context, timeout=5) as stranger, pytest.raises(httpx.ConnectError):
        stranger.post(f"https://localhost:{port}/mutate", content=orjson.dumps(good()))


def test_ops_routes_and_metrics(hook: Webhook) -> None:
    assert hook.client.get("/healthz").text == "ok"
    assert hook.client.get("/readyz").status_code == 200
    hook.answer("/mutate", good())
    hook.post("/mutate", b"nope")
    metrics = hook.client.get("/metrics").text
    assert 'gpu_placement_request_seconds_count{component="webhook",verb="mutate"}' in metrics
    assert 'gpu_placement_requests_total{component="webhook",status="200",verb="mutate"}' in metrics
    assert 'gpu_placement_bad_requests_total{component="webhook",problem="not_json"}' in metrics
    assert 'gpu_placement_decisions_total{component="webhook",reason="Mutated"}' in metrics


def _paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    if prefix:
        yield prefix
    if isinstance(doc, dict):
        for key, value in doc.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc):
            yield from _paths(value, (*prefix, index))


def test_hostile_pods_never_crash_the_webhook(hook: Webhook) -> None:
    """Fields of a rich pod replaced by values of the wrong type or odd text: every answer is a 200
    AdmissionReview, and every patch applies and is idempotent."""
    base = user_pod("multi", "f", gpus={"nvidia.com/gpu": 1}, annotations={"gpu-placement.io/sharing": "shared"})
    spec = base["spec"]
    spec["initContainers"] = [{"name": "i", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    spec["nodeSelector"] = {"a": "b"}
    spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}], "matchFields": []}]}}}
    base["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "r"}]
    odd = [None, 0, -1, 1e300, 1.5, "", "x", [], {}, [1], [None], {"a": 1}, True, "４", "1e999999999", "\u200f",
           [{}], [{"a": []}], "🚀"]
    paths = list(_paths(base))
    rng = random.Random(7)
    for _ in range(150):
        pod = copy.deepcopy(base)
        for _ in range(rng.randint(1, 3)):
            path = rng.choice(paths)
            node: Any = pod
            try:
                for key in path[:-1]:
                    node = node[key]
                if isinstance(node, dict) == isinstance(path[-1], str):
                    node[path[-1]] = copy.deepcopy(rng.choice(odd))
            except (KeyError, IndexError, TypeError):
                pass  # an earlier change replaced the parent
        ns = rng.choice(["multi", "inference", "web", "mig-lab"])
        response = hook.answer("/mutate", review(pod, ns))
        if response["allowed"] and "patch" in response:
            mutated = jsonpatch.apply_patch(pod, patch_of(response))
            assert "patch" not in hook.answer("/mutate", review(mutated, ns))
        hook.answer("/validate", review(pod, ns, dry_run=True))
