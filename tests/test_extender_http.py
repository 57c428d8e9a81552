"""The extender over real HTTP on loopback, fed what kube-scheduler sends (contract sections 3, 6, 7, 11).

Requests are the JSON kube-scheduler's `HTTPExtender` marshals from `k8s.io/kube-scheduler/extender/v1`
(Go structs without JSON tags: capitalised field names), with the Pod as the scheduler caches it.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import orjson
import pytest

from gpu_placement.base.config import Config, Scoring
from gpu_placement.samples.cluster import demo_objects, make_node, make_pod, validator_pod
from tests.hostile import deep, held_by_the_service
from tests.support.extender import DEMO_NODES, GPU, SHARED, Extender, _shape, api_node, api_pod

FILTER_KEYS = {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
RESOLVABLE = {"InsufficientGPUMemory", "InsufficientGPU"}
APP_IMAGE = "registry.example.com/inference/chat:1.4"  # says nothing about CUDA: the T4's old driver is fine

# Golden strings of k8s.io/kube-scheduler/extender/v1 types_test.go (TestCompatibility): json.Marshal
# of each wire type. (The stored upstream copy predates FailedAndUnresolvableNodes, which the current
# ExtenderFilterResult adds beside FailedNodes.)
GOLDEN_EXTENDER_ARGS = (
    '{"Pod":{"metadata":{"name":"podname","creationTimestamp":null},"spec":{"containers":null},"status":{}},'
    '"Nodes":{"metadata":{},"items":[{"metadata":{"name":"nodename","creationTimestamp":null},"spec":{},'
    '"status":{"daemonEndpoints":{"kubeletEndpoint":{"Port":0}},"nodeInfo":{"machineID":"","systemUUID":"",'
    '"bootID":"","kernelVersion":"","osImage":"","containerRuntimeVersion":"","kubeletVersion":"",'
    '"kubeProxyVersion":"","operatingSystem":"","architecture":""}}}]},"NodeNames":["node1"]}')
GOLDEN_FILTER_RESULT = (
    '{"Nodes":{"metadata":{},"items":[{"metadata":{"name":"nodename","creationTimestamp":null},"spec":{},'
    '"status":{"daemonEndpoints":{"kubeletEndpoint":{"Port":0}},"nodeInfo":{"machineID":"","systemUUID":"",'
    '"bootID":"","kernelVersion":"","osImage":"","containerRuntimeVersion":"","kubeletVersion":"",'
    '"kubeProxyVersion":"","operatingSystem":"","architecture":""}}}]},"NodeNames":["node1"],'
    '"FailedNodes":{"foo":"bar"},"Error":"myerror"}')
GOLDEN_BINDING_ARGS = '{"PodName":"mypodname","PodNamespace":"mypodnamespace","PodUID":"mypoduid","Node":"mynode"}'
GOLDEN_BINDING_RESULT = '{"Error":"myerror"}'
GOLDEN_HOST_PRIORITY = '{"Host":"myhost","Score":1}'


# -- servers -----------------------------------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def _no_leftover_server_threads() -> Iterator[None]:
    yield
    assert not [t.name for t in threading.enumerate() if t.name.startswith("uvicorn-")]


@pytest.fixture(scope="module")
def demo() -> Iterator[Extender]:
    extender = Extender(demo_objects())
    yield extender
    extender.close()


@pytest.fixture
def fresh() -> Iterator[Extender]:
    """A demo cluster of its own, for tests that bind; plus a GPU pod still waiting to be scheduled."""
    extender = Extender([*demo_objects(), make_pod("team-a", "queued", gpus={GPU: 2})])
    yield extender
    extender.close()


def _codes(messages: dict[str, str]) -> dict[str, str]:
    return {node: message.split(":", 1)[0] for node, message in messages.items()}


# -- /filter -----------------------------------------------------------------------------------
def test_the_same_nodes_in_any_order_get_the_same_answer(demo: Extender) -> None:
    """kube-scheduler's feasible list is filled by parallel workers: the same nodes come in another
    order every cycle, and fewer when one fills up. The answer is a function of the set asked."""
    rng = random.Random(7)
    first = demo.post("filter", {"Pod": api_pod(), "Nodes": None, "NodeNames": DEMO_NODES}).json()
    for asked in (DEMO_NODES[::-1], rng.sample(DEMO_NODES, len(DEMO_NODES)), DEMO_NODES[2:], DEMO_NODES):
        raw = demo.post("filter", {"Pod": api_pod(), "Nodes": None, "NodeNames": asked}).json()
        assert len(raw["NodeNames"]) == len(set(raw["NodeNames"]))
        assert set(raw["NodeNames"]) == set(first["NodeNames"]) & set(asked)
        for key in ("FailedNodes", "FailedAndUnresolvableNodes"):
            assert raw[key] == {name: why for name, why in first[key].items() if name in asked}, key


def test_a_node_named_twice_is_answered_once(demo: Extender) -> None:
    """kube-scheduler never names a node twice; a client that does gets each node once, not an
    error, and the cached answer for the nodes as a set is unchanged by it."""
    answer = demo.post("filter", {"Pod": api_pod(), "Nodes": None,
                                  "NodeNames": ["h100-single", "v100-legacy", "h100-single", "v100-legacy"]}).json()
    assert answer["NodeNames"] == ["h100-single"] and list(answer["FailedAndUnresolvableNodes"]) == ["v100-legacy"]
    assert demo.filter(api_pod(), ["v100-legacy", "h100-single"]) == answer


def test_filter_node_names_form(demo: Extender) -> None:
    asked = [*DEMO_NODES, "ghost-node"]
    answer = demo.filter(api_pod(), asked)
    assert set(answer) == FILTER_KEYS
    assert answer["Nodes"] is None and answer["Error"] == ""
    assert answer["NodeNames"] == ["a100-vgpu", "h100-single", "h100-train-1", "h100-train-2"]
    failed, unresolvable = answer["FailedNodes"], answer["FailedAndUnresolvableNodes"]
    assert failed == {}
    assert set(answer["NodeNames"]) | set(unresolvable) == set(asked)
    assert _codes(unresolvable) == {
        "a10g-unregistered": "NoGPU", "cpu-1": "NoGPU", "h100-mig": "NoGPU", "t4-shared": "NoGPU",
        "t4-replicas": "SharingMismatch",
        "h100-bad-label": "BadLabel", "h100-down": "NodeNotReady", "h100-mig-pending": "MIGReconfiguring",
        "h100-not-validated": "NotValidated", "h100-upgrading": "DriverUpgrade",
        "l4-no-driver-labels": "UnknownDriver", "v100-legacy": "DriverTooOld", "ghost-node": "UnknownNode"}
    assert unresolvable["h100-not-validated"] == (
        "NotValidated: the nvidia-operator-validator pod on the node is not Ready "
        "(namespace gpu-operator, app=nvidia-operator-validator)")
    assert unresolvable["ghost-node"].startswith("UnknownNode: the node is not in gpu-placement's view")


def test_filter_nodes_form_answers_with_the_passing_node_objects(demo: Extender) -> None:
    items = [api_node(obj) for obj in demo_objects() if obj["kind"] == "Node"]
    response = demo.post("filter", {"Pod": api_pod(), "Nodes": {"metadata": {"resourceVersion": "1001"},
                                                                "items": items}, "NodeNames": None})
    assert response.status_code == 200 and response.headers["content-type"].startswith("application/json")
    answer = response.json()
    assert set(answer) == FILTER_KEYS and answer["NodeNames"] is None and answer["Error"] == ""
    passed = [node["metadata"]["name"] for node in answer["Nodes"]["items"]]
    assert passed == ["h100-train-1", "h100-train-2", "h100-single", "a100-vgpu"]  # in the order sent
    by_name = {node["metadata"]["name"]: node for node in items}
    assert answer["Nodes"]["items"] == [by_name[name] for name in passed]  # the objects, unchanged
    assert set(passed) | set(answer["FailedNodes"]) | set(answer["FailedAndUnresolvableNodes"]) == set(by_name)


def test_filter_null_and_empty_node_lists(demo: Extender) -> None:
    for body in ({"Pod": api_pod(), "Nodes": None, "NodeNames": []}, {"Pod": api_pod(), "Nodes": None,
                                                                      "NodeNames": None}, {"Pod": api_pod()}):
        response = demo.post("filter", body)
        assert response.status_code == 200, body
        answer = response.json()
        assert set(answer) == FILTER_KEYS and answer["Error"] == ""
        assert answer["NodeNames"] in ([], None) and not answer["FailedNodes"]
        assert not answer["FailedAndUnresolvableNodes"]
    answer = demo.post("filter", {"Pod": api_pod(), "Nodes": {"metadata": {}, "items": []}, "NodeNames": None}).json()
    assert answer["Nodes"]["items"] == [] and answer["NodeNames"] is None


def test_filter_never_returns_a_node_not_asked_about(demo: Extender) -> None:
    for asked in (["h100-single"], ["ghost-a", "ghost-b"], ["h100-down", "h100-train-1"], DEMO_NODES[::2]):
        answer = demo.filter(api_pod(), asked)
        returned = set(answer["NodeNames"]) | set(answer["FailedNodes"]) | set(answer["FailedAndUnresolvableNodes"])
        assert returned == set(asked)
        assert len(answer["NodeNames"]) + len(answer["FailedNodes"]) + len(answer["FailedAndUnresolvableNodes"]) \
            == len(asked)  # each node once


def test_failed_nodes_are_what_preemption_can_fix(demo: Extender) -> None:
    eight = demo.filter(api_pod(gpus=8), DEMO_NODES)
    assert eight["NodeNames"] == []
    assert _codes(eight["FailedNodes"]) == {"h100-train-1": "InsufficientGPU", "h100-train-2": "InsufficientGPU",
                                            "h100-single": "InsufficientGPU", "a100-vgpu": "InsufficientGPU"}
    # one sentence for every node short of devices, whatever each has free: kube-scheduler counts them
    assert set(eight["FailedNodes"].values()) == {
        "InsufficientGPU: the pod needs 8 nvidia.com/gpu free and the node has fewer"}
    share = demo.filter(api_pod(namespace="inference", resource=SHARED, image=APP_IMAGE,
                                annotations={"gpu-placement.io/gpu-memory": "4Gi"}), ["t4-shared"])
    # the T4 has 15360 MiB; embed-0 holds 2 x 6Gi of it
    assert share["FailedNodes"] == {"t4-shared": f"InsufficientGPUMemory: the pod needs 4096 MiB of {SHARED} "
                                                 "memory free and the node has less (per-node figures: "
                                                 "gpu-placement explain)"}
    assert demo.core.view.free_mib[SHARED]["t4-shared"] == 3072  # the figure itself: explain's, not the reason's
    for answer in (eight, share):
        assert set(_codes(answer["FailedNodes"]).values()) <= RESOLVABLE
        assert not set(_codes(answer["FailedAndUnresolvableNodes"]).values()) & {"InsufficientGPU"}


def test_an_ask_bigger_than_any_device_is_unresolvable(demo: Extender) -> None:
    """Preemption cannot make a device bigger: 120Gi per device fails every node for good."""
    answer = demo.filter(api_pod(namespace="research", annotations={"gpu-placement.io/gpu-memory": "120Gi"}),
                         ["h100-single", "a100-vgpu"])
    assert answer["FailedNodes"] == {}
    assert answer["FailedAndUnresolvableNodes"]["h100-single"] == (
        "InsufficientGPUMemory: the pod asks 122880 MiB per device (pod annotation); each nvidia.com/gpu on "
        "the node has 81559 MiB (NVIDIA-H100-80GB-HBM3)")


def test_broken_annotation_fails_every_node_with_its_name_and_value(demo: Extender) -> None:
    answer = demo.filter(api_pod(annotations={"gpu-placement.io/cuda": "twelve"}), DEMO_NODES)
    assert answer["NodeNames"] == [] and answer["FailedNodes"] == {}
    assert set(answer["FailedAndUnresolvableNodes"]) == set(DEMO_NODES)
    for message in answer["FailedAndUnresolvableNodes"].values():
        assert message.startswith('BadAnnotation: gpu-placement.io/cuda="twelve" on pod team-a/train-7f9c')


def test_pod_without_gpus_passes_every_node_with_score_zero(demo: Extender) -> None:
    pod = api_pod()
    for container in pod["spec"]["containers"]:
        container["resources"] = {"requests": {"cpu": "1"}}
    answer = demo.filter(pod, DEMO_NODES)
    assert answer["NodeNames"] == DEMO_NODES and not answer["FailedNodes"] and not answer["FailedAndUnresolvableNodes"]
    scores = demo.post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": DEMO_NODES}).json()
    assert scores == []  # 0 everywhere: every node left out, which kube-scheduler counts as 0


def test_junk_labels_on_one_node_do_not_change_the_others(demo: Extender) -> None:
    others = ["h100-single", "a100-vgpu", "h100-train-1", "v100-legacy"]
    alone = demo.filter(api_pod(), others)
    mixed = demo.filter(api_pod(), ["h100-single", "h100-bad-label", "a100-vgpu", "h100-train-1", "v100-legacy"])
    assert mixed["NodeNames"] == alone["NodeNames"]
    assert mixed["FailedAndUnresolvableNodes"] == {**alone["FailedAndUnresolvableNodes"], "h100-bad-label": (
        "BadLabel: nvidia.com/gpu.memory='abc' is not a whole number; fix GPU Feature Discovery on the node")}


# -- /prioritize -------------------------------------------------------------------------------
def _scoring_cluster() -> list[dict[str, Any]]:
    objects = [make_node("busy", "h100x8"), make_node("idle", "h100x8"),
               make_node("upgrading", "h100x8", labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-required"}),
               make_node("unhealthy", "h100x8", allocatable={GPU: "7"}, capacity={GPU: "8"}),
               make_pod("ml", "running", gpus={GPU: 4}, node="busy")]
    return [*objects, *(validator_pod(n) for n in ("busy", "idle", "upgrading", "unhealthy"))]


@pytest.fixture(scope="module", params=["binpack", "spread", "fragmentation"])
def scoring(request: pytest.FixtureRequest) -> Iterator[tuple[str, Extender]]:
    extender = Extender(_scoring_cluster(), Config(scoring=Scoring(strategy=request.param)))
    yield request.param, extender
    extender.close()


def test_prioritize_scores_every_node_asked_less_the_lowest(scoring: tuple[str, Extender]) -> None:
    strategy, extender = scoring
    asked = ["idle", "busy", "upgrading", "unhealthy", "ghost"]
    response = extender.post("prioritize", {"Pod": api_pod(namespace="ml"), "Nodes": None, "NodeNames": asked})
    assert response.status_code == 200
    scores = response.json()
    hosts = [entry["Host"] for entry in scores]
    assert hosts == [name for name in asked if name in hosts]  # in the order asked
    assert all(set(entry) == {"Host", "Score"} and type(entry["Score"]) is int and 1 <= entry["Score"] <= 10
               for entry in scores)  # the lowest (0 once shifted) left out: kube-scheduler gives it 0
    score = {name: 0 for name in asked} | {entry["Host"]: entry["Score"] for entry in scores}
    assert score["ghost"] == 0
    if strategy == "binpack":
        assert score["busy"] > score["idle"]  # fill the node already in use
    elif strategy == "spread":
        assert score["idle"] > score["busy"]  # spread: the emptier node
    else:  # one GPU adds no fragment for a pod like it on either: the emptier node's GPUs (the spread part)
        assert score["idle"] == 7 and score["busy"] == 5
    assert score["upgrading"] < score["idle"]  # upgrade-required only lowers the score
    assert score["unhealthy"] < score["idle"] or score["idle"] == 0
    # and upgrade-required still passes the filter
    assert "upgrading" in extender.filter(api_pod(namespace="ml"), asked)["NodeNames"]


def test_prioritize_answers_the_scores_less_the_lowest_asked(scoring: tuple[str, Extender]) -> None:
    """Every node's score less the lowest among those asked, that lowest left out: the totals
    kube-scheduler adds up all move by the same amount, so the ranking is the scores' own."""
    _, extender = scoring
    placement = extender.core.placement
    pod = api_pod(namespace="ml")
    for asked in (["idle", "busy", "upgrading", "unhealthy"], ["idle", "busy"], ["busy", "upgrading"], ["idle"],
                  ["unhealthy", "upgrading", "idle"]):
        full = dict(placement.scores(placement.requirements(pod), asked))
        low = min(full.values())
        answer = extender.post("prioritize", {"Pod": pod, "Nodes": None, "NodeNames": asked}).json()
        assert answer == [{"Host": name, "Score": full[name] - low} for name in asked if full[name] > low], asked


def test_prioritize_nodes_form(scoring: tuple[str, Extender]) -> None:
    _, extender = scoring
    items = [api_node(obj) for obj in _scoring_cluster() if obj["kind"] == "Node"]
    scores = extender.post("prioritize", {"Pod": api_pod(namespace="ml"), "Nodes": {"items": items},
                                          "NodeNames": None}).json()
    names = [node["metadata"]["name"] for node in items]
    hosts = [entry["Host"] for entry in scores]
    assert hosts and hosts == [name for name in names if name in hosts]


def test_prioritize_leaves_failing_nodes_out(demo: Extender) -> None:
    scores = demo.post("prioritize", {"Pod": api_pod(), "Nodes": None,
                                      "NodeNames": ["h100-down", "cpu-1", "h100-single"]}).json()
    assert [entry["Host"] for entry in scores] == ["h100-single"] and scores[0]["Score"] > 0


# -- /bind -------------------------------------------------------------------------------------
def _bind(extender: Extender, namespace: str, name: str, node: str, uid: str = "") -> httpx.Response:
    return extender.post("bind", {"PodName": name, "PodNamespace": namespace, "PodUID": uid, "Node": node})


def test_bind_a_pod_the_view_holds(fresh: Extender) -> None:
    one = api_pod(name="next-1")
    assert "h100-train-1" in fresh.filter(one, ["h100-train-1"])["NodeNames"]  # 2 of 8 free
    unfiltered = _bind(fresh, "team-a", "queued", "h100-train-1", uid="uid-team-a-queued").json()["Error"]
    assert unfiltered.startswith("pod team-a/queued was not filtered by this extender")  # nothing to re-check
    assert fresh.core.view.pods["team-a/queued"].node is None and not fresh.core.view.reservations
    queued = make_pod("team-a", "queued", gpus={GPU: 2})
    assert fresh.filter(queued, ["h100-train-1"])["NodeNames"] == ["h100-train-1"]
    response = _bind(fresh, "team-a", "queued", "h100-train-1", uid="uid-team-a-queued")
    assert response.status_code == 200 and response.json() == {"Error": ""}
    assert fresh.core.view.pods["team-a/queued"].node == "h100-train-1"
    assert fresh.filter(one, ["h100-train-1"])["FailedNodes"] == {
        "h100-train-1": "InsufficientGPU: the pod needs 1 nvidia.com/gpu free and the node has fewer"}
    assert fresh.core.view.free_units[GPU]["h100-train-1"] == 0


def test_bind_a_pod_seen_only_in_filter_reserves_its_memory(fresh: Extender) -> None:
    ask = {"gpu-placement.io/gpu-memory": "2Gi"}
    first = api_pod(name="chat-1", namespace="inference", resource=SHARED, image=APP_IMAGE, annotations=ask)
    second = api_pod(name="chat-2", namespace="inference", resource=SHARED, image=APP_IMAGE, annotations=ask)
    assert fresh.filter(first, ["t4-shared"])["NodeNames"] == ["t4-shared"]
    assert fresh.filter(second, ["t4-shared"])["NodeNames"] == ["t4-shared"]  # the same answer, from the cache
    assert _bind(fresh, "inference", "chat-1", "t4-shared").json() == {"Error": ""}
    assert fresh.core.view.reservations["inference/chat-1"].node == "t4-shared"
    assert _codes(fresh.filter(second, ["t4-shared"])["FailedNodes"]) == {"t4-shared": "InsufficientGPUMemory"}
    assert fresh.core.view.free_mib[SHARED]["t4-shared"] == 1024


def test_bind_refusals_are_error_sentences(fresh: Extender) -> None:
    fresh.filter(make_pod("team-a", "queued", gpus={GPU: 2}), ["h100-train-1"])
    unknown = _bind(fresh, "team-a", "queued", "ghost-node")
    assert unknown.status_code == 200
    assert unknown.json()["Error"].startswith("UnknownNode: ")
    already = _bind(fresh, "team-a", "pretrain-0", "h100-single").json()["Error"]
    assert already == "pod team-a/pretrain-0 is already assigned to node h100-train-1"
    replaced = _bind(fresh, "team-a", "queued", "h100-train-1", uid="some-other-uid").json()["Error"]
    assert "uid-team-a-queued" in replaced and "some-other-uid" in replaced and "replaced" in replaced
    assert fresh.core.view.pods["team-a/queued"].node is None  # nothing was bound
    assert fresh.core.view.reservations == {}


def test_bind_malformed(fresh: Extender) -> None:
    cases: list[tuple[Any, str]] = [
        ({"PodName": "x", "PodNamespace": "team-a"}, "Node: expected a non-empty name, got null"),
        ({"PodName": 7, "PodNamespace": "team-a", "Node": "h100-single"}, "PodName: expected a non-empty name, got a"),
        ({"PodName": "x", "PodNamespace": "n" * 64, "Node": "h100-single"},
         "PodNamespace: expected at most 63 characters, got 64"),
        # Issue 14, reproduction 4: a PodUID that is not a string was bound as its Python text.
        ({"PodName": "queued", "PodNamespace": "team-a", "Node": "h100-single", "PodUID": {"a": 1}},
         "PodUID: expected a string, got an object"),
        (b'{"PodName": "queued", "PodNamespace": "team-a", "Node": "h100-single", "PodUID": ' + deep(1000) + b"}",
         "PodUID: expected a string, got a list"),
        ([], "JSON object"), (b"{", "not valid JSON")]
    for body, problem in cases:
        response = fresh.post("bind", body)
        assert response.status_code == 400, body
        assert problem in response.json()["Error"]
    assert fresh.core.view.pods["team-a/queued"].node is None  # nothing was bound


# -- the upstream wire goldens -----------------------------------------------------------------
def test_golden_extender_args_both_forms(demo: Extender) -> None:
    response = demo.post("filter", GOLDEN_EXTENDER_ARGS.encode())
    assert response.status_code == 200
    answer = response.json()
    golden = orjson.loads(GOLDEN_FILTER_RESULT)
    assert set(answer) == set(golden) | {"FailedAndUnresolvableNodes"}
    assert answer["NodeNames"] == ["node1"]  # NodeNames wins when both are sent; a pod without GPUs passes
    for key in ("NodeNames", "FailedNodes", "Error"):
        assert type(answer[key]) is type(golden[key]), key
    nodes_only = orjson.loads(GOLDEN_EXTENDER_ARGS)
    nodes_only["NodeNames"] = None
    answer = demo.post("filter", nodes_only).json()
    assert answer["NodeNames"] is None
    assert [node["metadata"]["name"] for node in answer["Nodes"]["items"]] == ["nodename"]
    assert _shape(answer["Nodes"]["items"][0]) == _shape(golden["Nodes"]["items"][0])  # passed through as sent


def test_golden_style_args_with_a_gpu_pod(demo: Extender) -> None:
    plain = demo.post("filter", b'{"Pod":{"metadata":{"name":"pod1"}},"Nodes":null,"NodeNames":["node1","node2"]}')
    assert plain.json()["NodeNames"] == ["node1", "node2"]
    body = (b'{"Pod":{"metadata":{"name":"pod1"},"spec":{"containers":[{"name":"c","resources":{"limits":'
            b'{"nvidia.com/gpu":"1"}}}]}},"Nodes":null,"NodeNames":["node1","node2"]}')
    answer = demo.post("filter", body).json()
    assert answer["NodeNames"] == [] and answer["Nodes"] is None and answer["Error"] == ""
    assert _codes(answer["FailedAndUnresolvableNodes"]) == {"node1": "UnknownNode", "node2": "UnknownNode"}


def test_golden_host_priority_shape(demo: Extender) -> None:
    scores = demo.post("prioritize", {"Pod": api_pod(), "Nodes": None, "NodeNames": DEMO_NODES}).json()
    golden = orjson.loads(GOLDEN_HOST_PRIORITY)
    assert isinstance(scores, list) and 0 < len(scores) < len(DEMO_NODES)  # the lowest left out
    assert all(_shape(entry) == _shape(golden) for entry in scores)


def test_golden_binding_args_and_result(demo: Extender) -> None:
    response = demo.post("bind", GOLDEN_BINDING_ARGS.encode())
    assert response.status_code == 200
    answer = response.json()
    assert _shape(answer) == _shape(orjson.loads(GOLDEN_BINDING_RESULT))
    assert answer["Error"].startswith("UnknownNode: the node is not in gpu-placement's view")


# -- malformed requests ------------------------------------------------------------------------
MALFORMED = [
    (b'{"Pod": {', "not valid JSON"),
    (b"", "empty body"),
    (b"[]", "must be a JSON object"),
    (b'"ExtenderArgs"', "must be a JSON object"),
    (b'{"Nodes": null, "NodeNames": ["n1"]}', "ExtenderArgs.Pod is missing"),
    (b'{"Pod": "pod1", "NodeNames": ["n1"]}', 'Pod: expected a v1.Pod object, got a string "pod1"'),
    (b'{"Pod": [], "NodeNames": ["n1"]}', "Pod: expected a v1.Pod object, got a list"),
    (b'{"Pod": {}, "NodeNames": "n1"}', 'NodeNames: expected a list of node names, got a string "n1"'),
    (b'{"Pod": {}, "NodeNames": ["n1", 2]}', "NodeNames[1]: expected a string, got a number 2"),
    (b'{"Pod": {}, "NodeNames": ["n1", null]}', "NodeNames[1]: expected a string, got null"),
    (b'{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "n1"}}, {"metadata": {}}]}}',
     "Nodes.items[1].metadata.name: expected a non-empty name, got null"),
    (b'{"Pod": {}, "Nodes": {"items": ["n1"]}}', 'Nodes.items[0]: expected an object, got a string "n1"'),
    (b'{"Pod": {}, "Nodes": {"items": "n1"}}', 'Nodes.items: expected a list of objects, got a string "n1"'),
    (b'{"Pod": {}, "Nodes": ["n1"]}', "Nodes: expected a v1.NodeList object, got a list"),
    (b'{"Pod": {}, "Nodes": "n1"}', 'Nodes: expected a v1.NodeList object, got a string "n1"'),
    # Issue 14, reproduction 2: an item whose metadata is null.
    (b'{"Pod": {}, "Nodes": {"items": [{"metadata": null}]}}', "Nodes.items[0].metadata: expected an object, got null"),
    # Issue 14, reproduction 1: a Pod with wrong-typed fields.
    (b'{"Pod": {"metadata": 1}, "NodeNames": ["n1"]}', "Pod.metadata: expected an object, got a number 1"),
    (b'{"Pod": {"metadata": {"namespace": ["a"]}}, "NodeNames": ["n1"]}',
     "Pod.metadata.namespace: expected a string, got a list"),
    (b'{"Pod": {"spec": {"containers": {"c": 1}}}, "NodeNames": ["n1"]}',
     "Pod.spec.containers: expected a list of objects, got an object"),
    (b'{"Pod": {"spec": {"containers": [1]}}, "NodeNames": ["n1"]}',
     "Pod.spec.containers[0]: expected an object, got a number 1"),
    (b'{"Pod": {"spec": {"initContainers": [{"resources": "1"}]}}, "NodeNames": ["n1"]}',
     'Pod.spec.initContainers[0].resources: expected an object, got a string "1"'),
    (b'{"Pod": {"spec": {"containers": [{"resources": {"limits": "nvidia.com/gpu=1"}}]}}, "NodeNames": ["n1"]}',
     'Pod.spec.containers[0].resources.limits: expected an object, got a string "nvidia.com/gpu=1"'),
    (b'{"Pod": {"spec": {"containers": [{"resources": {"requests": [1]}}]}}, "NodeNames": ["n1"]}',
     "Pod.spec.containers[0].resources.requests: expected an object, got a list"),
    (b'{"Pod": {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": {"n": 1}}}}]}}, "NodeNames": []}',
     "Pod.spec.containers[0].resources.limits[nvidia.com/gpu]: expected a quantity (a string or a number), got an "
     "object"),
    (b'{"Pod": {"metadata": {"annotations": {"gpu-placement.io/gpu-memory": 20}}}, "NodeNames": ["n1"]}',
     "Pod.metadata.annotations[gpu-placement.io/gpu-memory]: expected a string, got a number 20"),
    (b'{"Pod": {"spec": {"containers": [{"env": {"NVIDIA_REQUIRE_CUDA": "cuda>=12.4"}}]}}, "NodeNames": []}',
     "Pod.spec.containers[0].env: expected a list of objects, got an object"),
    (b'{"Pod": {"spec": {"containers": [{"env": ["cuda>=12.4"]}]}}, "NodeNames": []}',
     'Pod.spec.containers[0].env[0]: expected an object, got a string "cuda>=12.4"'),
    (b'{"Pod": {"spec": {"resourceClaims": true}}, "NodeNames": ["n1"]}',
     "Pod.spec.resourceClaims: expected a list of objects, got true"),
    (b'{"Pod": {"spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": 7}]}}, "NodeNames": ["n1"]}',
     "Pod.spec.resourceClaims[0].resourceClaimName: expected a string, got a number 7"),
    # Issue 14, reproduction 4: values nested 1,000 deep where the code would turn them into text.
    (b'{"Pod": {"metadata": {"name": ' + deep(1000) + b'}}, "NodeNames": ["n1"]}',
     "Pod.metadata.name: expected a string, got a list"),
    (b'{"Pod": {"spec": {"containers": [{"env": [{"name": "NVIDIA_REQUIRE_CUDA", "value": ' + deep(1000) +
     b'}]}]}}, "NodeNames": ["n1"]}', "Pod.spec.containers[0].env[0].value: expected a string, got a list"),
    (b'{"Pod": {"spec": {"containers": [{"resources": {"limits": {"nvidia.com/gpu": ' + deep(1000) +
     b'}}}]}}, "NodeNames": ["n1"]}',
     "Pod.spec.containers[0].resources.limits[nvidia.com/gpu]: expected a quantity (a string or a number), got a list"),
    (b'{"Pod": {"metadata": {"name": "' + b"p" * 254 + b'"}}, "NodeNames": ["n1"]}',
     "Pod.metadata.name: expected at most 253 characters, got 254"),
]


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
@pytest.mark.parametrize(("body", "problem"), MALFORMED, ids=[body.decode()[:60] or "empty" for body, _ in MALFORMED])
def test_malformed_args_are_400_with_the_problem(demo: Extender, verb: str, body: bytes, problem: str) -> None:
    response = demo.post(verb, body)
    assert response.status_code == 400, f"{body!r}: {response.status_code} {response.text}"
    assert response.headers["content-type"].startswith("application/json")
    assert problem in response.json()["Error"]


def test_wrong_path_and_method(demo: Extender) -> None:
    missing = demo.post("predicates", {"Pod": {}})
    assert missing.status_code == 404
    assert "/predicates" in missing.json()["Error"] and "POST /filter" in missing.json()["Error"]
    get = demo.http.get("/filter")
    assert get.status_code == 405 and "POST /filter" in get.json()["Error"]


@pytest.fixture(scope="module")
def small() -> Iterator[Extender]:
    extender = Extender(demo_objects(), max_body=4096)
    yield extender
    extender.close()


def test_oversized_body_is_413_naming_the_limit(small: Extender) -> None:
    big = {"Pod": api_pod(), "Nodes": None, "NodeNames": [f"node-{i:05d}" for i in range(1000)]}
    for verb in ("filter", "prioritize", "bind"):
        response = small.post(verb, big)
        assert response.status_code == 413, verb
        assert "4096 bytes" in response.json()["Error"]
    chunks = iter([orjson.dumps(big)[i:i + 1000] for i in range(0, len(orjson.dumps(big)), 1000)])
    streamed = small.http.post("/filter", content=chunks, headers={"Content-Type": "application/json"})
    assert streamed.status_code == 413 and "4096 bytes" in streamed.json()["Error"]  # no Content-Length
    assert small.filter(api_pod(), ["h100-single"])["NodeNames"] == ["h100-single"]  # a body under the limit


# -- operations --------------------------------------------------------------------------------
def test_health_ready_metrics(demo: Extender) -> None:
    assert demo.http.get("/healthz").status_code == 200
    ready = demo.http.get("/readyz")
    assert ready.status_code == 200 and ready.text == "ok"
    demo.filter(api_pod(), ["h100-single"])
    metrics = demo.http.get("/metrics")
    assert metrics.status_code == 200
    assert 'gpu_placement_request_seconds_count{component="extender",verb="filter"}' in metrics.text
    assert "gpu_placement_request_seconds_bucket" in metrics.text


def test_not_ready_says_why() -> None:
    extender = Extender(demo_objects(), ready=lambda: (False, "waiting for the first full list of pods"))
    try:
        response = extender.http.get("/readyz")
        assert response.status_code == 503 and "waiting for the first full list of pods" in response.text
    finally:
        extender.close()


# -- hostile input (issue 14) ------------------------------------------------------------------
def test_a_passing_node_too_deep_to_echo_is_refused_by_name(demo: Extender) -> None:
    """Reproduction 3: in the `Nodes` form passing nodes are echoed back, and orjson encodes at most 254
    levels: a node nested deeper is a 400 naming it, one level less is echoed intact."""
    def args(levels: int) -> bytes:  # the node object itself is the first level
        deep = b"[" * (levels - 1) + b"1" + b"]" * (levels - 1)
        return (b'{"Pod": {}, "Nodes": {"items": [{"metadata": {"name": "h100-single"}}, '
                b'{"metadata": {"name": "h100-train-1"}, "x": ' + deep + b"}]}}")
    refused = demo.post("filter", args(252))
    assert refused.status_code == 400
    assert refused.json()["Error"] == "Nodes.items[1]: expected at most 251 levels of nesting, got deeper"
    assert demo.post("filter", args(1000)).status_code == 400
    echoed = demo.post("filter", args(251))
    assert echoed.status_code == 200, echoed.text
    assert [node["metadata"]["name"] for node in echoed.json()["Nodes"]["items"]] == ["h100-single", "h100-train-1"]


@pytest.mark.parametrize("value", ["x" * 2**20, "x" * 4000, "\u202e" * 5000])
def test_a_huge_annotation_is_quoted_cut_in_every_reason(demo: Extender, value: str) -> None:
    """Reproduction 7: a 1 MiB annotation was quoted whole into every node's reason (37.7 MB for 18
    nodes). The value is quoted at most 120 characters (escapes included), once, and an over-long one
    is refused by its length."""
    response = demo.post("filter", {"Pod": api_pod(annotations={"gpu-placement.io/gpu-memory": value}),
                                    "Nodes": None, "NodeNames": DEMO_NODES})
    assert response.status_code == 200
    reasons = response.json()["FailedAndUnresolvableNodes"]
    assert set(reasons) == set(DEMO_NODES)
    for reason in reasons.values():
        assert reason.startswith('BadAnnotation: gpu-placement.io/gpu-memory="') and len(reason) < 1500, reason[:300]
    if len(value) > 4096:
        assert f"the value is {len(value)} characters long; keep it under 4096" in reasons[DEMO_NODES[0]]
    assert len(response.content) < 1500 * len(DEMO_NODES)


def test_a_huge_gpu_quantity_is_quoted_cut(demo: Extender) -> None:
    pod = api_pod()
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = "1" * 2**20
    response = demo.post("filter", {"Pod": pod, "Nodes": None, "NodeNames": DEMO_NODES})
    assert response.status_code == 200
    for reason in response.json()["FailedAndUnresolvableNodes"].values():
        assert "is not a Kubernetes quantity" in reason and len(reason) < 500, reason[:300]


def test_hostile_pods_do_not_grow_memory(demo: Extender) -> None:
    """Reproduction 7, memory: 150 pods with a 1 MiB annotation took the service from 70 MiB to 2.7 GiB,
    the verdict cache keeping their reasons. Here 60 pods with their own 256 KiB annotation each (each a
    new kind of pod for the cache): what the service's own code holds afterwards stays under 4 MiB."""
    def pods(start: int, count: int) -> Iterator[dict[str, Any]]:
        for index in range(start, start + count):
            value = f"{index}-" + "x" * 2**18
            yield {"Pod": api_pod(f"hostile-{index}", annotations={"gpu-placement.io/gpu-memory": value}),
                   "Nodes": None, "NodeNames": DEMO_NODES}

    for args in pods(0, 70):  # warm: the caches fill to their bounds with ordinary entries
        assert demo.post("filter", args).status_code == 200
    with held_by_the_service() as growth:
        for args in pods(100, 60):
            assert demo.post("filter", args).status_code == 200
    assert growth[0] < 4 * 2**20, f"{growth[0] / 2**20:.1f} MiB held after 60 hostile pods"
