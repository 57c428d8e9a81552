"""Work under the view's lock proportional to what changed (issue 25; benchmarks/relist_bench.py
measures it): a watch event costs the same with 1 kind of pod cached or 300 (each kind takes in the
changed nodes when it is next used); a relist builds records only for pods whose resourceVersion
changed and applies its changes a slice at a time, so a reader never waits for the whole of it.

Every answer is checked against one built afresh: lazy is only right if it is the same answer.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.base.config import Config
from gpu_placement.decide import placement as placement_module
from gpu_placement.decide.placement import Placement
from gpu_placement.samples.cluster import demo_objects, make_node, make_pod, validator_pod
from gpu_placement.view import cluster as view_module
from gpu_placement.view.ingest import Ingest

GPU = "nvidia.com/gpu"


def _kind(index: int) -> dict[str, Any]:
    return make_pod("research", f"kind-{index}", gpus={GPU: 1},
                    annotations={"gpu-placement.io/gpu-memory": f"{index + 1}Gi"})


def _fresh_answer(core: Any, pod: dict[str, Any], names: list[str]) -> tuple[list[str], dict[str, str]]:
    placement = Placement(core.view, core.config)  # a cache of its own, built from the view as it is now
    result = placement.filter(placement.requirements(pod), names)
    return sorted(result.passed), {**result.failed, **result.unresolvable}


def test_events_wait_for_each_kind_to_be_used_and_every_answer_is_current() -> None:
    core = core_from_objects(Config(), demo_objects())
    view, placement, names = core.view, core.placement, sorted(core.view.nodes)
    for index in range(30):
        placement.filter(placement.requirements(_kind(index)), names)
    before = {key: verdicts.seen for key, verdicts in placement._cache.items()}
    node = next(name for name in names if view.free_units.get(GPU, {}).get(name))
    for index in range(view.free_units[GPU][node]):  # fill the node, one bound pod (one event) at a time
        core.ingest.event(view, "pods", "ADDED", make_pod("research", f"fill-{index}", gpus={GPU: 1}, node=node))
    assert {key: verdicts.seen for key, verdicts in placement._cache.items()} == before  # nothing redone yet
    for index in range(30):
        result = placement.filter(placement.requirements(_kind(index)), names)
        assert (sorted(result.passed), {**result.failed, **result.unresolvable}) == _fresh_answer(
            core, _kind(index), names)
        assert node not in result.passed
    core.ingest.event(view, "nodes", "MODIFIED", make_node(node, "h100", ready=False))  # facts, not just room
    result = placement.filter(placement.requirements(_kind(3)), names)
    assert result.unresolvable[node].startswith("NodeNotReady: ")
    assert placement.recheck(placement.requirements(_kind(4)), node).startswith("NodeNotReady: ")


def test_a_kind_left_behind_the_log_is_rebuilt_not_wrong(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement_module, "_LOG_LIMIT", 8)
    core = core_from_objects(Config(), demo_objects())
    view, placement, names = core.view, core.placement, sorted(core.view.nodes)
    placement.filter(placement.requirements(_kind(0)), names)
    busy = placement.requirements(_kind(1))
    node = next(name for name in names if view.free_units.get(GPU, {}).get(name))
    for index in range(20):  # kind 1 keeps looking; kind 0 falls behind the kept entries
        core.ingest.event(view, "pods", "ADDED", make_pod("research", f"p-{index}", gpus={GPU: 1}, node=node))
        placement.filter(busy, names)
        core.ingest.event(view, "pods", "DELETED", make_pod("research", f"p-{index}", gpus={GPU: 1}, node=node))
    assert placement_module._decision_key(placement.requirements(_kind(0))) not in placement._cache
    result = placement.filter(placement.requirements(_kind(0)), names)
    assert (sorted(result.passed), {**result.failed, **result.unresolvable}) == _fresh_answer(core, _kind(0), names)
    assert len(placement._log) <= 8


def _listed(count: int, version: int) -> list[dict[str, Any]]:
    pods = []
    for index in range(count):
        pod = make_pod("research", f"p-{index}", gpus={GPU: 1} if index % 3 == 0 else None, node="gpu-1")
        pod["metadata"]["resourceVersion"] = str(version + index)
        pods.append(pod)
    return pods


def test_a_relist_keeps_the_records_of_pods_whose_version_did_not_change() -> None:
    config = Config()
    view = view_module.ClusterView(config)
    ingest = Ingest(config)
    ingest.replace(view, "nodes", [make_node("gpu-1", "h100x8")])
    ingest.relist(view, "pods", _listed(300, 1000))
    kept = dict(view.pods)
    again = _listed(300, 1000)
    again[7]["metadata"]["resourceVersion"] = "5000"  # written while the watch was away
    again[7]["status"]["phase"] = "Succeeded"
    del again[8]
    ingest.relist(view, "pods", again)
    assert all(view.pods[key] is record for key, record in kept.items() if key not in ("research/p-7", "research/p-8"))
    assert "research/p-8" not in view.pods and view.pods["research/p-7"].active is False
    assert view.pods["research/p-7"] is not kept["research/p-7"]
    # A snapshot (replace) always builds: a file edited by hand keeps its resourceVersion.
    edited = _listed(300, 1000)
    edited[0]["status"]["phase"] = "Failed"
    ingest.replace(view, "pods", edited)
    assert view.pods["research/p-0"].active is False


def test_a_relist_holds_the_lock_a_slice_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """With 2,000 changes, a reader that asks for the lock mid-relist gets it before the relist ends."""
    monkeypatch.setattr(view_module, "_SLICE", 100)
    core = core_from_objects(Config(), [make_node("gpu-1", "h100x8"), validator_pod("gpu-1")])
    view = core.view
    seen: list[int] = []  # how many pods the reader found each time it got the lock
    applied = threading.Event()
    done = threading.Event()

    def reader() -> None:
        applied.wait(5)
        while not done.is_set():
            with view.lock:
                seen.append(len(view.pods))
            time.sleep(0.001)

    original = view.upsert_pod

    def slow_upsert(pod: Any) -> None:
        original(pod)
        applied.set()
        time.sleep(0.0002)

    monkeypatch.setattr(view, "upsert_pod", slow_upsert)
    thread = threading.Thread(target=reader)
    thread.start()
    core.ingest.relist(view, "pods", [*_listed(2000, 10), validator_pod("gpu-1")])
    done.set()
    thread.join(5)
    assert any(1 < count < 2001 for count in seen), seen[:20]  # in, mid-relist, without waiting for its end
    assert len(view.pods) == 2001 and "pods" in view.listed
