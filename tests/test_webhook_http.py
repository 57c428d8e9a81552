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

from gpu_placement.web.certs import CertBundle
from tests.hostile import deep, paths
from tests.support.webhook import Webhook, certificates, patch_of, review, user_pod
from webhook.app import MAX_BODY

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


def shaped(hook: Webhook, **kwargs: Any) -> dict[str, Any]:
    """good()'s pod as /validate gets it: shaped by /mutate first."""
    return review(hook.mutate(user_pod("team-a", "p", gpus={"nvidia.com/gpu": 1}), "team-a")[0], "team-a", **kwargs)


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
                   "request": {"uid": "u", "dryRun": "yes"}}),
     'request.dryRun: expected true or false, got a string "yes"'),
    (orjson.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                   "request": {"uid": "u", "namespace": ["a"]}}), "request.namespace: expected a string, got a list"),
    (orjson.dumps({"apiVersion": "\u202eadmission\U0001f680", "kind": "AdmissionReview"}), '"\\u202eadmission🚀"'),
])
def test_malformed_reviews_are_400_with_a_status_body(hook: Webhook, body: bytes, phrase: str) -> None:
    for path in ("/mutate", "/validate?timeout=10s"):
        assert phrase in status_of(hook.post(path, body), 400)


@pytest.mark.parametrize(("change", "phrase"), [
    (lambda r: r["request"].pop("object"), "request.object is missing"),
    (lambda r: r["request"].update(object=[1]), "request.object: expected a v1.Pod object, got a list"),
    (lambda r: r["request"]["object"].update(kind="Deployment", apiVersion="apps/v1"),
     'request.object is "apps/v1" "Deployment", but the review is about a v1 Pod'),
    (lambda r: r["request"].update(kind={"group": "", "version": "v1", "kind": "Service"}),
     "request.kind is v1 Service but request.resource is pods"),
    (lambda r: r["request"]["object"].pop("spec"),
     "request.object.spec: expected an object (a pod has a spec), got null"),
    (lambda r: r["request"]["object"]["spec"].update(containers={"main": {}}),
     "request.object.spec.containers: expected a list of objects, got an object"),
    (lambda r: r["request"]["object"]["metadata"].update(annotations={"a": 1}),
     "request.object.metadata.annotations[a]: expected a string, got a number 1"),
    (lambda r: r["request"]["object"]["spec"].update(tolerations={"key": "x"}),
     "request.object.spec.tolerations: expected a list of objects, got an object"),
    (lambda r: r["request"]["object"]["spec"].update(resourceClaims=5),
     "request.object.spec.resourceClaims: expected a list of objects, got a number 5"),
    (lambda r: r["request"]["object"]["spec"].update(resourceClaims=[{"name": "gpu",
                                                                      "resourceClaimTemplateName": ["t"]}]),
     "request.object.spec.resourceClaims[0].resourceClaimTemplateName: expected a string, got a list"),
    (lambda r: r["request"]["object"]["spec"].update(affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": {"a": 1}}}}), "nodeSelectorTerms"),
    (lambda r: r["request"]["object"]["spec"]["containers"][0]["resources"]["limits"].update(
        {"nvidia.com/gpu": "1e999999999"}), 'limits[nvidia.com/gpu]: "1e999999999" is not a quantity'),
    (lambda r: r["request"]["object"]["spec"]["containers"][0]["resources"]["limits"].update(
        {"nvidia.com/gpu": "０"}), "U+FF10 FULLWIDTH DIGIT ZERO"),
    (lambda r: r["request"]["object"]["spec"]["containers"][0]["resources"]["limits"].update(
        {"nvidia.com/gpu": "0.5"}), "is not a whole number of devices"),
    (lambda r: r["request"]["object"]["spec"]["containers"][0]["resources"].update(limits=["1"]),
     "request.object.spec.containers[0].resources.limits: expected an object, got a list"),
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
    body = shaped(hook)
    body["request"]["object"]["metadata"]["annotations"]["filler"] = "x" * (MAX_BODY - 2048)
    assert hook.answer("/validate", body)["allowed"] is True


def test_query_strings_are_ignored(hook: Webhook) -> None:
    for path in ("/mutate?timeout=10s", "/validate?timeout=10s", "/mutate?timeout=30s&x=1", "/validate?"):
        assert hook.answer(path, shaped(hook))["allowed"] is True


def test_unknown_paths_and_methods_are_json(hook: Webhook) -> None:
    assert "is not a webhook endpoint" in status_of(hook.client.get("/mutate"), 405)
    assert "is not a webhook endpoint" in status_of(hook.post("/admit", good()), 404)


def test_a_crash_is_a_500_with_a_body_and_is_logged(hook: Webhook, monkeypatch: pytest.MonkeyPatch,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    def boom(_request: Any) -> Any:
        raise RuntimeError("the view is on fire")

    body = shaped(hook)
    monkeypatch.setattr(hook.app.state.admission, "mutate", boom)
    with caplog.at_level(logging.ERROR, logger="gpu_placement.webhook"):
        message = status_of(hook.post("/mutate", good()), 500)
    assert message == "internal error in the gpu-placement webhook: RuntimeError: the view is on fire"
    assert any(r.levelno == logging.ERROR and r.exc_info for r in caplog.records)
    assert hook.answer("/validate", body)["allowed"] is True


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
    pod = hook.mutate(user_pod("team-a", "p", gpus={"nvidia.com/gpu": 1}), "team-a")[0]
    for index in range(50):
        pod["metadata"]["name"] = f"p{index}"
        body = review(pod, "team-a", dry_run=True)
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
    places = list(paths(base))[1:]
    rng = random.Random(7)
    for _ in range(150):
        pod = copy.deepcopy(base)
        for _ in range(rng.randint(1, 3)):
            path = rng.choice(places)
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


# -- hostile input (issue 14) ----------------------------------------------------------------------
@pytest.mark.parametrize("group", [5, ["apps"], {"a": 1}, True])
def test_a_review_kind_of_the_wrong_type_is_400(hook: Webhook, group: Any) -> None:
    """Reproduction 5: `request.kind.group` a number, list or object was a 500 (TypeError building the
    message for a wrong kind)."""
    body = good()
    body["request"]["kind"] = {"group": group, "version": "v1", "kind": "Service"}
    for path in ("/mutate", "/validate"):
        assert status_of(hook.post(path, body), 400).startswith("request.kind.group: expected a string, got ")


@pytest.mark.parametrize("count", [b"18446744073709551616", b'"18446744073709551616"', b"18446744073709551615",
                                   b'"1e30"', b"1025", b'"1025"', b"1e300"])
def test_counts_no_node_has_are_a_bad_pod_in_mutate_and_validate(hook: Webhook, count: bytes) -> None:
    """Reproduction 6: a GPU count of 2**64 was a 500 in /mutate (the admitted annotation's integer past
    64 bits) and allowed by /validate. Past what any node has (1024 of one resource), both refuse it
    alike, naming the field."""
    body = good()
    body["request"]["object"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "COUNT"
    raw = orjson.dumps(body).replace(b'"COUNT"', count)  # as written: orjson encodes no integer past 64 bits
    for path in ("/mutate", "/validate"):
        response = hook.post(path, raw)
        assert response.status_code == 200, response.text
        answer = response.json()["response"]
        assert answer["allowed"] is False and answer["status"]["code"] == 400, answer
        message = answer["status"]["message"]
        assert message.startswith("request.object.spec.containers[0].resources.limits[nvidia.com/gpu]: "), message
        assert message.endswith(("1e+300 is out of range", "devices is more than any node has (at most 1024 of "
                                 "one resource for one pod); ask for what one node can give")), message


def test_a_pod_total_past_any_node_is_a_bad_pod(hook: Webhook) -> None:
    body = review(user_pod("team-a", "p", gpus={"nvidia.com/gpu": 1000}), "team-a")
    pod = body["request"]["object"]
    pod["spec"]["containers"].append(copy.deepcopy(pod["spec"]["containers"][0]) | {"name": "second"})
    for path in ("/mutate", "/validate"):
        response = hook.answer(path, body)
        assert response["allowed"] is False and response["status"]["code"] == 400
        assert response["status"]["message"].startswith("request.object asks for nvidia.com/gpu in total: 2000 "
                                                         "devices is more than any node has")
    body = review(user_pod("team-a", "p", gpus={"nvidia.com/gpu": 1024}), "team-a", dry_run=True)
    assert hook.answer("/mutate", body)["allowed"] is True  # the bound itself is a count, if a large one


def test_node_selector_terms_too_deep_to_patch_are_a_bad_pod(hook: Webhook) -> None:
    """A pod's node selector terms are copied into the patch that adds ours: nested too deep to encode
    (orjson stops at 254 levels) they are a bad pod, not a 500."""
    pod = user_pod("team-a", "p", gpus={"nvidia.com/gpu": 1})
    term = b'{"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}], "x": ' + deep(300) + b"}"
    body = orjson.dumps(review(pod, "team-a")).replace(
        b'"spec":{', b'"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":'
                     b'{"nodeSelectorTerms":[' + term + b"]}}},", 1)
    for path in ("/mutate", "/validate"):
        response = hook.post(path, body)
        assert response.status_code == 200, response.text
        answer = response.json()["response"]
        assert answer["allowed"] is False and answer["status"]["code"] == 400
        assert answer["status"]["message"] == ("request.object.spec.affinity.nodeAffinity.requiredDuringScheduling"
                                               "IgnoredDuringExecution.nodeSelectorTerms[0]: expected at most 64 "
                                               "levels of nesting, got deeper")


def test_huge_values_are_quoted_cut(hook: Webhook) -> None:
    """Every quoted user value is cut at 120 characters: a pod's annotation, a GPU quantity."""
    pod = user_pod("team-a", "p", gpus={"nvidia.com/gpu": 1}, annotations={"gpu-placement.io/cuda": "1" * 4000})
    message = hook.answer("/validate", review(pod, "team-a"))["status"]["message"]
    assert 'gpu-placement.io/cuda="' + "1" * 120 + '..."' in message and len(message) < 1000
    body = good()
    body["request"]["object"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1x" * 2**19
    message = hook.answer("/mutate", body)["status"]["message"]
    assert '"' + "1x" * 60 + '..." is not a quantity' in message and len(message) < 400
