"""Property-based hostile input for the POST endpoints, over real HTTP (issue 14).

Each example is one request: a realistic body (what kube-scheduler or the API server sends) with one
to four fields deleted, retyped, duplicated, nested deep, made huge or given odd text; or a random
JSON value; or random bytes. Every answer must be:
- HTTP 200, 400 or 413, never 5xx, with a JSON body;
- when refused, a body that says what is wrong (`Error` for the extender, a `v1.Status` message for
  the webhook) in a bounded sentence;
- bounded: the extender's answer by a constant per node asked about (plus the request itself, which
  the `Nodes` form echoes), the webhook's by the request it answers;
and the memory the service's own code holds must stay flat across the run.

`make test` runs a few dozen examples per endpoint, derandomized (the same examples every run);
`make fuzz` runs FUZZ_EXAMPLES per endpoint (default 3000) from a fresh random seed and prints the
statuses seen. Reproduce a failure from `make fuzz` with the seed hypothesis prints
(`--hypothesis-seed=N`).
"""

from __future__ import annotations

import copy
import os
from collections import Counter
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import httpx
import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from gpu_placement.samples.cluster import demo_objects, make_pod
from tests.hostile import deep, held_by_the_service, paths
from tests.support.dra import quota_namespace
from tests.support.extender import DEMO_NODES, Extender, api_node, api_pod
from tests.support.webhook import NAMESPACES, Webhook, review, user_pod

FUZZ_EXAMPLES = int(os.environ.get("GPU_PLACEMENT_FUZZ_EXAMPLES") or 0)
SETTINGS = settings(
    max_examples=FUZZ_EXAMPLES or 30, derandomize=not FUZZ_EXAMPLES, database=None, deadline=None,
    # In `make test` a failure is reported as found, unshrunk: shrinking through HTTP takes minutes.
    phases=list(Phase) if FUZZ_EXAMPLES else [Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture,
                           HealthCheck.filter_too_much])
# A hang guard, not a speed check: /filter's 30 examples took 4.3 s alone and 72.6 s once on this
# 2-core machine under other CPU-bound work (tracemalloc traces every allocation of the run).
pytestmark = [pytest.mark.timeout(0 if FUZZ_EXAMPLES else 300), pytest.mark.slow]  # slow: tracemalloc over every run

# What the service's own code may keep across a run: its caches are bounded in count and (since
# issue 14) in entry size. 150 pods with a 1 MiB annotation used to hold 2.7 GiB.
MEMORY_TOLERANCE = 16 * 2**20
MESSAGE_LIMIT = 1024  # a refusal is a sentence, not an echo
PER_NODE = 6 * 1024  # the longest reason: an annotation of 4096 characters listed back, plus the sentence

# -- values ---------------------------------------------------------------------------------------

_RAW: list[bytes] = [deep(300), deep(1000), deep(253, b"{}"), b"1" + b"0" * 25, b"18446744073709551616",
                     b"-9223372036854775809", b"1e308", b"[" * 1100 + b"]" * 1100]
# Values that used to inflate answers and memory or crash encoders: huge, escaped on display, deep.
HUGE: list[Any] = ["y" * 2**20, "x" * 5000, "\u202e" * 3000, "NVIDIA-H100-80GB-HBM3," * 300,
                   *(f"@@raw{index}@@" for index in range(len(_RAW)))]
ODD: list[Any] = [
    None, True, False, 0, -1, 1, 2**63 - 1, 2**64 - 1, -(2**63), 0.5, -0.0, 1e308, 1025, "", "0", "1", "-1", "0.5",
    "1e999999999", "1e18", "18446744073709551616", "０", "\u202e4", "4\u200f", "🚀", "1" * 40, "nvidia.com/gpu",
    "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "Always", "Exists", "cuda>=12.4", "NVIDIA_REQUIRE_CUDA",
    "nvcr.io/nvidia/cuda:12.4.1-runtime", "20Gi", "16384", "12.4", "mig-1g.10gb", "shared", "exclusive",
    "training,inference", [], {}, [1], [None], {"a": 1}, [{}], [{"a": []}], {"": ""},
]
KEYS = ["gpu-placement.io/gpu-memory", "gpu-placement.io/cuda", "gpu-placement.io/gpu-products",
        "gpu-placement.io/min-driver", "gpu-placement.io/min-compute", "gpu-placement.io/cuda-compat",
        "gpu-placement.io/sharing", "nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "metadata",
        "spec", "name", "namespace", "resources", "limits", "requests", "env", "value", "items", "Pod", "NodeNames",
        "Nodes", "uid", "kind", "group", "object", "x" * 300]

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=8)
# A third each; copied, since the examples' containers are shared and mutations change values in place.
VALUES = (st.sampled_from(HUGE) | st.sampled_from(ODD) | JSON).map(copy.deepcopy)


def encode(doc: Any) -> bytes:
    """The document as JSON, with `@@rawN@@` strings swapped for raw JSON that Python cannot encode
    (nested past orjson's 254 levels, numbers past 64 bits)."""
    body = orjson.dumps(doc)
    for index, raw in enumerate(_RAW):
        body = body.replace(b'"@@raw%d@@"' % index, raw)
    return body


# Where the service reads most: half the changes go to one of these (a field of that name anywhere).
TARGETS = frozenset({"annotations", "limits", "requests", "env", "containers", "initContainers", "metadata", "items",
                     "NodeNames", "nodeSelectorTerms", "tolerations", "kind", "resource", "PodUID", "resourceClaims",
                     "resourceClaimTemplateName"})


def _mutate(data: st.DataObject, doc: Any) -> Any:
    """One change: replace, delete, wrap, duplicate or insert, at a random place or at a field the
    service reads (TARGETS)."""
    places = list(paths(doc))
    targeted = [path for path in places if path and path[-1] in TARGETS]
    if targeted and data.draw(st.booleans(), label="targeted"):
        # A field name first, then one of its places: a field that stands once (resourceClaims) is drawn
        # as often as one that stands in every container.
        name = data.draw(st.sampled_from(sorted({str(path[-1]) for path in targeted})), label="field")
        places = [path for path in targeted if str(path[-1]) == name]
    path = data.draw(st.sampled_from(places), label="path")
    action = data.draw(st.sampled_from(["replace", "delete", "wrap", "duplicate", "insert"]), label="action")
    if not path:
        return data.draw(VALUES) if action == "replace" else [doc] if action == "wrap" else doc
    parent = doc
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    if action == "replace":
        parent[last] = data.draw(VALUES, label="value")
    elif action == "delete":
        del parent[last]
    elif action == "wrap":
        parent[last] = data.draw(st.sampled_from([[parent[last]], {"x": parent[last]}]), label="wrapped")
    elif action == "duplicate":
        if isinstance(parent, list):
            parent.append(copy.deepcopy(parent[last]))
        else:
            parent[f"{last}-copy"] = copy.deepcopy(parent[last])
    else:
        target = parent[last]
        if isinstance(target, dict):
            target[data.draw(st.sampled_from(KEYS), label="key")] = data.draw(VALUES, label="value")
        elif isinstance(target, list):
            target.append(data.draw(VALUES, label="value"))
    return doc


PLANTED = {"annotations": [key for key in KEYS if key.startswith("gpu-placement.io/")],
           "limits": ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb"],
           "requests": ["nvidia.com/gpu", "nvidia.com/gpu.shared"], "spec": ["resourceClaims"]}


def _plant(data: st.DataObject, doc: Any) -> Any:
    """An odd value where it is read as text or a count: a gpu-placement.io/* annotation, a GPU quantity,
    the pod's list of claims."""
    places = [path for path in paths(doc) if path and path[-1] in PLANTED]
    if not places:
        return doc
    path = data.draw(st.sampled_from(places), label="place")
    target = doc
    for step in path:
        target = target[step]
    if isinstance(target, dict):
        key = data.draw(st.sampled_from(PLANTED[path[-1]]), label="key")
        target[key] = data.draw(VALUES | st.text(max_size=30), label="value")
    return doc


def hostile(data: st.DataObject, bases: list[Any]) -> bytes:
    """A body: a base with 1-4 changes anywhere, or with an odd value planted where it is read (then
    0-2 changes), or a random JSON value, or random bytes."""
    kind = data.draw(st.sampled_from(["mutated"] * 4 + ["planted"] * 3 + ["json", "bytes"]), label="kind")
    if kind == "bytes":
        return data.draw(st.binary(max_size=64), label="bytes")
    if kind == "json":
        return encode(data.draw(VALUES, label="document"))
    doc = copy.deepcopy(data.draw(st.sampled_from(bases), label="base"))
    if kind == "planted":
        doc = _plant(data, doc)
    for _ in range(data.draw(st.integers(0 if kind == "planted" else 1, 4), label="changes")):
        doc = _mutate(data, doc)
    return encode(doc)


def _asked(body: bytes) -> tuple[list[str], bool]:
    """The node names a request asks about as the service reads them, and whether it is the `Nodes` form."""
    try:
        args = orjson.loads(body)
    except orjson.JSONDecodeError:
        return [], False
    if not isinstance(args, dict):
        return [], False
    names = args.get("NodeNames")
    if isinstance(names, list):
        return [name for name in names if isinstance(name, str)], False
    items = args.get("Nodes", {}).get("items") if isinstance(args.get("Nodes"), dict) else None
    if isinstance(items, list):
        return [str((item.get("metadata") or {}).get("name")) for item in items if isinstance(item, dict)
                and isinstance(item.get("metadata"), dict)], True
    return [], False


# -- checks ---------------------------------------------------------------------------------------

def _statuses(seen: Counter[int], name: str) -> None:
    if FUZZ_EXAMPLES:
        print(f"\n{name}: {sum(seen.values())} requests, statuses {dict(sorted(seen.items()))}")


def _encoded(name: str) -> int:
    return len(orjson.dumps(name))  # a name is echoed as JSON: escapes and UTF-8 count


def check_extender(verb: str, body: bytes, response: httpx.Response) -> None:
    assert response.status_code in (200, 400, 413), f"{response.status_code} {response.text[:500]}"
    assert response.headers["content-type"].startswith("application/json")
    answer = response.json()
    if response.status_code != 200:
        assert isinstance(answer, dict) and isinstance(answer["Error"], str), answer
        assert 0 < len(answer["Error"]) <= MESSAGE_LIMIT, answer["Error"][:300]
        return
    names, echoed = _asked(body)
    if verb == "filter":
        assert answer["Error"] == ""
        bound = 1024 + sum(2 * _encoded(name) + PER_NODE for name in names) + (len(body) if echoed else 0)
    elif verb == "prioritize":
        # The scores less the lowest, that lowest left out: never a node not asked, never more entries
        assert isinstance(answer, list) and len(answer) <= len(names)
        assert {entry["Host"] for entry in answer} <= set(names) and all(entry["Score"] > 0 for entry in answer)
        bound = 64 + sum(_encoded(name) + 40 for name in names)
    else:
        assert isinstance(answer, dict) and set(answer) == {"Error"}, answer
        bound = MESSAGE_LIMIT
    assert len(response.content) <= bound, f"{len(response.content)} bytes for {len(names)} nodes"


def check_webhook(body: bytes, response: httpx.Response) -> None:
    assert response.status_code in (200, 400, 413), f"{response.status_code} {response.text[:500]}"
    assert response.headers["content-type"] == "application/json"
    answer = response.json()
    if response.status_code != 200:
        assert answer["kind"] == "Status" and answer["code"] == response.status_code
        assert 0 < len(answer["message"]) <= MESSAGE_LIMIT, answer["message"][:300]
        return
    reply = answer["response"]
    assert reply["uid"] == orjson.loads(body)["request"]["uid"]
    if not reply["allowed"]:
        assert reply["status"]["message"] and reply["status"]["code"] in (400, 403)
    assert len(response.content) <= 2 * len(body) + 16 * 1024


def run(examples: Callable[[], None]) -> None:
    """The examples, with the service's own memory measured across them."""
    with held_by_the_service() as growth:
        examples()
    assert growth[0] < MEMORY_TOLERANCE, f"the service holds {growth[0] / 2**20:.1f} MiB more after the run"


def drive(name: str, bases: list[Any], post: Callable[[bytes], httpx.Response],
          check: Callable[[bytes, httpx.Response], None]) -> None:
    """Hostile bodies drawn from `bases` through one endpoint: every answer checked, the service's
    memory measured across them, and both kinds of answer (200 and 400) exercised."""
    seen = Counter[int]()

    @SETTINGS
    @given(st.data())
    def examples(data: st.DataObject) -> None:
        body = hostile(data, bases)
        response = post(body)
        seen[response.status_code] += 1
        check(body, response)

    run(examples)
    _statuses(seen, name)
    assert seen[200] and seen[400]


# -- the extender ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def extender() -> Iterator[Extender]:
    queued = make_pod("team-a", "queued", gpus={"nvidia.com/gpu": 2})
    server = Extender([*demo_objects(), queued])
    yield server
    server.close()


def _extender_bases() -> list[Any]:
    nodes = [api_node(obj) for obj in demo_objects() if obj["kind"] == "Node"][:6]
    annotated = api_pod(annotations={"gpu-placement.io/gpu-memory": "20Gi", "gpu-placement.io/cuda": "12.2",
                                     "gpu-placement.io/gpu-products": "NVIDIA-H100-80GB-HBM3",
                                     "gpu-placement.io/min-driver": "535.129.03"})
    annotated["spec"]["containers"][0]["env"].append({"name": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=12.2"})
    return [
        {"Pod": annotated, "Nodes": None, "NodeNames": DEMO_NODES},
        {"Pod": api_pod(gpus=2, resource="nvidia.com/gpu.shared"), "NodeNames": [*DEMO_NODES[:5], "ghost"]},
        {"Pod": api_pod(), "Nodes": {"metadata": {}, "items": nodes}, "NodeNames": None},
        {"Pod": {"metadata": {"name": "cpu-only"}, "spec": {"containers": [{"name": "c"}]}}, "NodeNames": DEMO_NODES},
    ]


@pytest.mark.parametrize("verb", ["filter", "prioritize"])
def test_filter_and_prioritize_take_any_input(extender: Extender, verb: str) -> None:
    drive(f"/{verb}", _extender_bases(), partial(extender.post, verb), partial(check_extender, verb))


def test_bind_takes_any_input(extender: Extender) -> None:
    bases = [{"PodName": "queued", "PodNamespace": "team-a", "PodUID": "uid-team-a-queued", "Node": "h100-single"},
             {"PodName": "ghost", "PodNamespace": "team-b", "PodUID": "", "Node": "ghost-node"}]
    drive("/bind", bases, partial(extender.post, "bind"), partial(check_extender, "bind"))


# -- the webhook ----------------------------------------------------------------------------------

def _webhook_bases() -> list[Any]:
    rich = user_pod("multi", "f", gpus={"nvidia.com/gpu": 1},
                    annotations={"gpu-placement.io/sharing": "shared", "gpu-placement.io/gpu-memory": "10Gi"})
    spec = rich["spec"]
    spec["initContainers"] = [{"name": "i", "image": "x", "restartPolicy": "Always",
                               "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    spec["tolerations"] = [{"key": "nvidia.com/gpu", "operator": "Exists"}]
    spec["nodeSelector"] = {"a": "b"}
    spec["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "k", "operator": "In", "values": ["v"]}], "matchFields": []}]}}}
    rich["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "r"}]
    plain = user_pod("web", "w")
    plain["spec"]["tolerations"] = [{"operator": "Exists"}]
    names = [ns["metadata"]["name"] for ns in NAMESPACES]
    return [review(rich, "multi"), review(user_pod("team-a", "p", gpus={"nvidia.com/gpu": 2}), "team-a"),
            review(user_pod("inference", None, gpus={"nvidia.com/gpu": 1}), "inference", dry_run=True),
            review(user_pod("mig-lab", "m", gpus={"nvidia.com/mig-1g.10gb": 1}), "mig-lab"),
            review(plain, "web"), review(user_pod(names[-2], "b", gpus={"nvidia.com/gpu": 1}), names[-2]),
            *_other_operations(rich)]


def _other_operations(pod: dict[str, Any]) -> list[Any]:
    """What else the API server may send: an UPDATE of a gpu-placement.io/* annotation (of the pod and
    through pods/status), a DELETE (oldObject only) and a CONNECT (pods/exec with its options)."""
    edited = copy.deepcopy(pod)
    edited["metadata"]["annotations"]["gpu-placement.io/gpu-memory"] = "1Gi"
    update, status = review(edited, "multi", operation="UPDATE"), review(edited, "multi", operation="UPDATE",
                                                                          sub="status")
    for body in (update, status):
        body["request"]["oldObject"] = copy.deepcopy(pod)
    delete = review(None, "multi", operation="DELETE")
    delete["request"].update(name="f", oldObject=copy.deepcopy(pod), options={"kind": "DeleteOptions"})
    connect = review({"kind": "PodExecOptions", "apiVersion": "v1", "command": ["sh"], "stdin": True}, "multi",
                     operation="CONNECT", sub="exec", kind={"group": "", "version": "v1", "kind": "PodExecOptions"})
    connect["request"]["name"] = "f"
    return [update, status, delete, connect]


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_mutate_and_validate_take_any_input(hook: Webhook, path: str) -> None:
    drive(path, _webhook_bases(), partial(hook.post, path), check_webhook)


@pytest.fixture
def team(hook: Webhook) -> Iterator[Webhook]:
    with quota_namespace(hook):
        yield hook


@pytest.mark.parametrize("path", ["/mutate", "/validate"])
def test_mutate_and_validate_take_any_input_in_a_dra_namespace(team: Webhook, path: str) -> None:
    """The same in a `dra` namespace with a device quota, where the webhook reads and patches the pod's
    `spec.resourceClaims` (webhook/dra_claims.py) and holds its devices (webhook/quota.py): a pod as
    written (converted by /mutate) and as /mutate made it (claims from the namespace's templates)."""
    written = user_pod("team", "c", gpus={"nvidia.com/gpu": 2})
    converted, _, _ = team.mutate(copy.deepcopy(written), "team")
    bases = [review(written, "team"), review(converted, "team"), review(converted, "team", dry_run=True)]
    drive(path, bases, partial(team.post, path), check_webhook)


def test_preempt_takes_any_input(extender: Extender) -> None:
    """/preempt (the sixth POST verb): the same properties; its answer holds at most the victims asked about."""
    victims = {"h100-single": {"Pods": [{"UID": "uid-team-a-queued"}], "NumPDBViolations": 0},
               "h100-train-1": {"Pods": [], "NumPDBViolations": 1}}
    full = {"h100-single": {"Pods": [make_pod("team-a", "queued", gpus={"nvidia.com/gpu": 2})], "NumPDBViolations": 0}}
    bases = [{"Pod": api_pod(gpus=2), "NodeNameToMetaVictims": victims},
             {"Pod": api_pod(annotations={"gpu-placement.io/gpu-memory": "20Gi"}), "NodeNameToVictims": full}]

    def check(body: bytes, response: httpx.Response) -> None:
        assert response.status_code in (200, 400, 413), f"{response.status_code} {response.text[:500]}"
        answer = response.json()
        if response.status_code != 200:
            assert 0 < len(answer["Error"]) <= MESSAGE_LIMIT, answer["Error"][:300]
        else:
            assert set(answer) == {"NodeNameToMetaVictims"} and len(response.content) <= 1024 + len(body)

    drive("/preempt", bases, partial(extender.post, "preempt"), check)
