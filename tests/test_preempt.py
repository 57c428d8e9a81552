"""`POST /preempt` over real HTTP, fed what kube-scheduler's HTTPExtender.ProcessPreemption sends.

The cluster: two time-sliced T4 nodes (8 shares of 15360 MiB each) full to the last share, and an
H100 a shared pod may not use. kube-scheduler's in-tree dry run counts shares only, so on each T4 it
proposes the one lowest-priority pod; what that pod gives back in memory decides the rest.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from gpu_placement.facts.pods import pod_key
from gpu_placement.samples.cluster import make_node, make_pod, validator_pod
from tests.support.extender import SHARED, Extender, _shape
from tests.support.preempt import (
    PREEMPTOR_PRIORITY,
    _running,
    _t4,
    cluster,
    meta_args,
    preempt,
    preemptor,
    uid,
    victim_uids,
)

# Golden strings of k8s.io/kube-scheduler/extender/v1 types_test.go (TestCompatibility): json.Marshal of
# ExtenderPreemptionArgs with both maps set, and of ExtenderPreemptionResult.
GOLDEN_PREEMPTION_ARGS = (
    '{"Pod":{"metadata":{"name":"podname","creationTimestamp":null},"spec":{"containers":null},"status":{}},'
    '"NodeNameToVictims":{"foo":{"Pods":[{"metadata":{"name":"podname","creationTimestamp":null},'
    '"spec":{"containers":null},"status":{}}],"NumPDBViolations":1}},'
    '"NodeNameToMetaVictims":{"foo":{"Pods":[{"UID":"myuid"}],"NumPDBViolations":1}}}')
GOLDEN_PREEMPTION_RESULT = '{"NodeNameToMetaVictims":{"foo":{"Pods":[{"UID":"myuid"}],"NumPDBViolations":1}}}'


def _cached_pod(obj: dict[str, Any]) -> dict[str, Any]:
    """A victim as kube-scheduler's NodeInfo holds it: no kind or apiVersion."""
    return {key: copy.deepcopy(value) for key, value in obj.items() if key not in ("kind", "apiVersion")}


def full_args(victims: dict[str, list[str]], objects: list[dict[str, Any]]) -> dict[str, Any]:
    """ExtenderPreemptionArgs as a plain (not nodeCacheCapable) HTTPExtender marshals it: v1.Pods."""
    by_name = {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == "Pod"}
    return {"Pod": preemptor(), "NodeNameToVictims": {
        node: {"Pods": [_cached_pod(by_name[name]) for name in names], "NumPDBViolations": 0}
        for node, names in victims.items()}, "NodeNameToMetaVictims": None}


@pytest.fixture
def extender() -> Iterator[Extender]:
    server = Extender(cluster())
    yield server
    server.close()


# -- what kube-scheduler sees -------------------------------------------------------------------
def test_filter_sends_the_full_t4s_to_preemption(extender: Extender) -> None:
    answer = extender.filter(preemptor(), ["t4-a", "t4-b", "h100-1"])
    assert answer["NodeNames"] == []
    assert set(answer["FailedNodes"]) == {"t4-a", "t4-b"}  # preemption may help there
    assert answer["FailedAndUnresolvableNodes"]["h100-1"].startswith("NoGPU: ")


def test_adds_the_victims_that_free_the_memory(extender: Extender) -> None:
    """The in-tree set (batch-low) frees a share and 2 GiB; 4 GiB needs batch-big too, not the
    prio-20 pods (two of them would also do, but they rank higher)."""
    answer = preempt(extender, meta_args({"t4-a": ["batch-low"]}))
    assert list(answer) == ["t4-a"]
    assert victim_uids(answer, "t4-a") == [uid("batch-big"), uid("batch-low")]  # highest priority first
    assert answer["t4-a"]["NumPDBViolations"] == 0


def test_drops_a_node_where_no_lower_priority_pods_would_do(extender: Extender) -> None:
    answer = preempt(extender, meta_args({"t4-a": ["batch-low"], "t4-b": ["b-low"]}))
    assert list(answer) == ["t4-a"]  # t4-b: the rest of its memory is held by pods of priority 2000


def test_never_proposes_a_pod_of_equal_or_higher_priority(extender: Extender) -> None:
    view = extender.core.view
    answer = preempt(extender, meta_args({"t4-a": ["batch-low"], "t4-b": ["b-low"]}))
    by_uid = {pod.uid: pod for pod in view.pods.values()}
    proposed = [by_uid[item["UID"]] for entry in answer.values() for item in entry["Pods"]]
    assert proposed and all(pod.priority < PREEMPTOR_PRIORITY for pod in proposed)
    equal = preempt(extender, meta_args({"t4-a": ["batch-low"]}, priority=10))  # batch-big is 10: not a victim
    assert equal == {}  # and the six prio-20 pods are above 10: nothing else frees 4 GiB


def test_a_proposal_that_already_frees_enough_is_kept_as_sent(extender: Extender) -> None:
    answer = preempt(extender, meta_args({"t4-a": ["batch-big", "batch-low"]}, pdb={"t4-a": 1}))
    assert answer == {"t4-a": {"Pods": [{"UID": uid("batch-big")}, {"UID": uid("batch-low")}],
                               "NumPDBViolations": 1}}  # kube-scheduler's PDB count, passed on


def test_reservations_count(extender: Extender) -> None:
    """A pod bound a moment ago (reserved, not yet seen bound) holds a share and 6 GiB more of t4-a:
    batch-low and batch-big give back 2 shares and 8 GiB, which leaves 1 share but 3 GiB; the
    first prio-20 pod makes it 4 GiB."""
    extender.core.view.reserve(pod_key("inference", "just-bound"), "t4-a", ((SHARED, 1),), "6Gi")
    answer = preempt(extender, meta_args({"t4-a": ["batch-low"]}))
    assert victim_uids(answer, "t4-a") == [uid("batch-small-0"), uid("batch-big"), uid("batch-low")]


def test_unresolvable_and_unknown_nodes_are_never_returned(extender: Extender) -> None:
    answer = preempt(extender, meta_args({"h100-1": ["batch-low"], "ghost": ["batch-low"], "t4-a": ["batch-low"]}))
    assert list(answer) == ["t4-a"]


def test_unresolvable_reasons_never_go_to_failed_nodes(extender: Extender) -> None:
    """Today's split, kept: FailedNodes holds only what eviction can fix; every other code is in
    FailedAndUnresolvableNodes, and /preempt drops those nodes whatever victims it is offered."""
    from gpu_placement.decide.rules import CODES, RESOLVABLE

    objects = cluster()
    down = make_node("t4-down", "t4-timeslicing", ready=False, shared_resource=SHARED)
    upgrading = make_node("t4-upgrading", "t4-timeslicing", shared_resource=SHARED,
                          labels={"nvidia.com/gpu-driver-upgrade-state": "drain-required"})
    server = Extender([*objects, down, upgrading, validator_pod("t4-down"), validator_pod("t4-upgrading"),
                       _running("low-d", "t4-down", 1024, 1), _running("low-u", "t4-upgrading", 1024, 1)])
    try:
        nodes = ["t4-a", "t4-b", "h100-1", "t4-down", "t4-upgrading", "ghost"]
        answer = server.filter(preemptor(), nodes)
        failed = {node: message.split(":", 1)[0] for node, message in answer["FailedNodes"].items()}
        unresolvable = {node: message.split(":", 1)[0]
                        for node, message in answer["FailedAndUnresolvableNodes"].items()}
        assert set(failed.values()) <= RESOLVABLE and set(failed) == {"t4-a", "t4-b"}
        assert unresolvable == {"h100-1": "NoGPU", "t4-down": "NodeNotReady", "t4-upgrading": "DriverUpgrade",
                                "ghost": "UnknownNode"}
        assert set(unresolvable.values()) <= set(CODES) - RESOLVABLE
        offered = {node: ["low-d"] for node in unresolvable}
        assert preempt(server, meta_args(offered)) == {}
    finally:
        server.close()


def test_a_node_where_the_pod_already_fits_keeps_the_in_tree_victims(extender: Extender) -> None:
    """In-tree victims freed for CPU or memory of the host: the GPU fits, nothing to add."""
    extender.core.view.delete_pod(pod_key("inference", "batch-big"))
    extender.core.view.delete_pod(pod_key("inference", "batch-small-0"))
    assert extender.filter(preemptor(), ["t4-a"])["NodeNames"] == ["t4-a"]
    assert preempt(extender, meta_args({"t4-a": ["batch-low"]})) == {
        "t4-a": {"Pods": [{"UID": uid("batch-low")}], "NumPDBViolations": 0}}


def test_victims_the_view_does_not_know_are_kept(extender: Extender) -> None:
    """A pod kube-scheduler holds that the view has not seen (a non-GPU pod just bound): it frees no
    GPU memory here, but kube-scheduler's own filters needed it gone."""
    body = meta_args({"t4-a": ["batch-low"]})
    body["NodeNameToMetaVictims"]["t4-a"]["Pods"].append({"UID": "not-in-view"})
    assert victim_uids(preempt(extender, body), "t4-a") == [uid("batch-big"), uid("batch-low"), "not-in-view"]


# -- both wire forms, shaped as upstream's types serialise --------------------------------------
def test_object_form_is_answered_in_the_meta_form(extender: Extender) -> None:
    objects = cluster()
    answer = preempt(extender, full_args({"t4-a": ["batch-low"], "t4-b": ["b-low"]}, objects))
    assert answer == {"t4-a": {"Pods": [{"UID": uid("batch-big")}, {"UID": uid("batch-low")}],
                               "NumPDBViolations": 0}}


def test_object_form_victim_of_higher_priority_drops_the_node(extender: Extender) -> None:
    body = full_args({"t4-a": ["batch-low"]}, cluster())
    extender.core.view.delete_pod(pod_key("inference", "batch-low"))  # the view has not seen it: trust the object
    body["NodeNameToVictims"]["t4-a"]["Pods"][0]["spec"]["priority"] = PREEMPTOR_PRIORITY
    assert preempt(extender, body) == {}


def test_golden_preemption_args_and_result(extender: Extender) -> None:
    """Upstream's own strings: the pod there asks for no GPU, so its proposal comes back as sent,
    byte for byte the golden ExtenderPreemptionResult."""
    response = extender.post("preempt", GOLDEN_PREEMPTION_ARGS.encode())  # both maps set: the UID form is read
    assert response.status_code == 200
    assert response.content == GOLDEN_PREEMPTION_RESULT.encode()
    objects_only = orjson.loads(GOLDEN_PREEMPTION_ARGS)
    objects_only["NodeNameToMetaVictims"] = None
    response = extender.post("preempt", objects_only)
    assert response.status_code == 400  # a victim without metadata.uid cannot be named back
    assert "NodeNameToVictims[foo].Pods[0] has no metadata.uid" in response.json()["Error"]
    objects_only["NodeNameToVictims"]["foo"]["Pods"][0]["metadata"]["uid"] = "myuid"
    assert extender.post("preempt", objects_only).json() == {"NodeNameToMetaVictims": {}}  # both priority 0
    objects_only["Pod"]["spec"]["priority"] = 1
    assert extender.post("preempt", objects_only).content == GOLDEN_PREEMPTION_RESULT.encode()
    golden = orjson.loads(GOLDEN_PREEMPTION_RESULT)["NodeNameToMetaVictims"]["foo"]
    answer = preempt(extender, meta_args({"t4-a": ["batch-low"]}))  # a GPU pod: gpu-placement's own answer
    assert _shape(answer["t4-a"]) == _shape(golden)
    assert all(set(pod) == {"UID"} for pod in answer["t4-a"]["Pods"])


def test_nil_maps_and_empty_victims(extender: Extender) -> None:
    for body in ({"Pod": preemptor(), "NodeNameToVictims": None, "NodeNameToMetaVictims": None},
                 {"Pod": preemptor(), "NodeNameToMetaVictims": {}},
                 {"Pod": preemptor(), "NodeNameToMetaVictims": {"t4-b": {"Pods": None, "NumPDBViolations": 0}}}):
        assert preempt(extender, body) == {}


def test_preemption_policy_never_is_never_preempted_for(extender: Extender) -> None:
    """kube-scheduler's DefaultPreemption.PodEligibleToPreemptOthers returns false for a pod with
    `preemptionPolicy: Never` before it dry-runs anything, so /preempt is never called for it. If
    such a request arrives anyway, no node is a candidate."""
    assert preempt(extender, meta_args({"t4-a": ["batch-low"]}, preemptionPolicy="Never")) == {}
    assert list(preempt(extender, meta_args({"t4-a": ["batch-low"]},
                                            preemptionPolicy="PreemptLowerPriority"))) == ["t4-a"]


MALFORMED = [
    (b"", "empty body"),
    (b"[]", "must be a JSON object"),
    (b'{"NodeNameToMetaVictims": {}}', "ExtenderPreemptionArgs.Pod is missing"),
    (b'{"Pod": {}, "NodeNameToMetaVictims": []}', "NodeNameToMetaVictims must be an object"),
    (b'{"Pod": {}, "NodeNameToMetaVictims": {"n1": []}}', "NodeNameToMetaVictims[n1] must be an object"),
    (b'{"Pod": {}, "NodeNameToMetaVictims": {"n1": {"Pods": [{}]}}}', "NodeNameToMetaVictims[n1].Pods[0] has no UID"),
    (b'{"Pod": {}, "NodeNameToMetaVictims": {"n1": {"Pods": {}, "NumPDBViolations": 0}}}', "a Pods list"),
    (b'{"Pod": {}, "NodeNameToMetaVictims": {"n1": {"Pods": [], "NumPDBViolations": "1"}}}', "integer"),
    (b'{"Pod": {}, "NodeNameToVictims": {"n1": {"Pods": [{"metadata": {}}]}}}', "Pods[0] has no metadata.uid"),
    # Issue 14: the Pod and the victims shape-checked like /filter's, a 400 naming the field, not a 500.
    (b'{"Pod": {"metadata": 1}, "NodeNameToMetaVictims": {}}', "Pod.metadata: expected an object, got a number 1"),
    (b'{"Pod": {"spec": {"containers": [{"resources": {"limits": []}}]}}}',
     "Pod.spec.containers[0].resources.limits: expected an object, got a list"),
    (b'{"Pod": {}, "NodeNameToVictims": {"n1": {"Pods": [{"metadata": 1}]}}}',
     "NodeNameToVictims[n1].Pods[0]: metadata and spec must be objects"),
    (b'{"Pod": {}, "NodeNameToVictims": {"n1": {"Pods": [{"metadata": {"uid": "u"}, "spec": []}]}}}',
     "metadata and spec must be objects"),
]


@pytest.mark.parametrize(("body", "problem"), MALFORMED, ids=[body.decode()[:50] or "empty" for body, _ in MALFORMED])
def test_malformed_args_are_400_with_the_problem(extender: Extender, body: bytes, problem: str) -> None:
    response = extender.post("preempt", body)
    assert response.status_code == 400, response.text
    assert problem in response.json()["Error"]


def test_not_ready_is_an_error_kube_scheduler_retries() -> None:
    server = Extender(cluster(), ready=lambda: (False, "waiting for the first full list of pods"))
    try:
        response = server.post("preempt", meta_args({"t4-a": ["batch-low"]}))
        assert response.status_code == 503
        assert "waiting for the first full list of pods" in response.json()["Error"]
    finally:
        server.close()


def test_metrics_count_outcomes(extender: Extender) -> None:
    preempt(extender, meta_args({"t4-a": ["batch-low"], "t4-b": ["b-low"]}))
    text = extender.http.get("/metrics").text
    assert 'gpu_placement_preemption_nodes_total{outcome="victims_added"}' in text
    assert 'gpu_placement_preemption_nodes_total{outcome="dropped"}' in text
    assert 'gpu_placement_request_seconds_count{component="extender",verb="preempt"}' in text


def test_the_view_records_priority_and_a_binding_keeps_it(extender: Extender) -> None:
    view = extender.core.view
    assert view.pods[pod_key("inference", "batch-big")].priority == 10
    assert view.pods[pod_key("inference", "critical-0")].priority == 2000
    queued = make_pod("inference", "queued", gpus={SHARED: 1}, annotations={"gpu-placement.io/gpu-memory": "1Gi"},
                      priority=7, image="registry.example.com/app:1")  # no CUDA 12 image: the T4's driver will do
    extender.core.view.upsert_pod(extender.core.ingest.pod(queued))
    extender.core.view.delete_pod(pod_key("inference", "batch-big"))  # room for it: /bind checks the fit
    assert extender.filter(queued, ["t4-a"])["NodeNames"] == ["t4-a"]  # /bind takes this verdict again
    assert extender.post("bind", {"PodName": "queued", "PodNamespace": "inference", "PodUID": uid("queued"),
                                  "Node": "t4-a"}).json() == {"Error": ""}
    bound = view.pods[pod_key("inference", "queued")]
    assert bound.node == "t4-a" and bound.priority == 7
    no_priority = make_pod("inference", "plain")
    assert extender.core.ingest.pod(no_priority).priority == 0  # unset: 0, as kube-scheduler reads it


# -- explain -----------------------------------------------------------------------------------
def test_explain_shows_what_preemption_would_evict(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """t4-a: batch-big and batch-low; t4-b: nothing lower-priority frees enough; t4-c: 4 shares free
    but their memory taken, so kube-scheduler's unit-counting dry run never gets to ask."""
    from gpu_placement.app.cli import main

    objects = [*cluster(), _t4("t4-c"), validator_pod("t4-c"),
               *[_running(f"wide-{i}", "t4-c", 3584, 5) for i in range(4)]]
    snapshot = tmp_path / "cluster.json"
    snapshot.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    pod = preemptor()
    pod_file = tmp_path / "pod.json"
    pod_file.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "Pod", **pod}))
    assert main(["explain", str(pod_file), "--snapshot", str(snapshot)]) == 4  # no node now; preemption may make room
    out = capsys.readouterr().out
    assert "no node can take it" in out
    section = out.split("preemption (priority 1000, class inference-critical):\n", 1)[1].splitlines()
    assert section[0].split() == ["NODE", "PREEMPTION", "WOULD", "EVICT", "/", "WHY", "NOT"]
    rows = {line.split()[0]: line for line in section[1:]}
    assert list(rows) == ["t4-a", "t4-b", "t4-c"]
    assert rows["t4-a"].split(None, 2)[1:] == ["evict", "inference/batch-big (priority 10), "
                                               "inference/batch-low (priority 5)"]
    assert rows["t4-b"].split(None, 2)[1] == "no"
    assert "even with every lower-priority GPU pod there evicted" in rows["t4-b"]
    assert rows["t4-c"].split()[1:3] == ["not", "asked"]
    assert "would evict inference/wide-" in rows["t4-c"] and "never asks" in rows["t4-c"]
    assert "h100-1" not in rows  # NoGPU: preemption cannot help, not listed

    never = {**pod, "spec": {**pod["spec"], "preemptionPolicy": "Never"}}
    pod_file.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "Pod", **never}))
    assert main(["explain", str(pod_file), "--snapshot", str(snapshot)]) == 4  # no node now, nor by preemption
    assert "preemption" not in capsys.readouterr().out.split("no node can take it", 1)[1]
