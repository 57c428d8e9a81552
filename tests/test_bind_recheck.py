"""`/bind` takes the verdict again, with reservations, in one step with making its own (contract section 3).

kube-scheduler's binding cycle is asynchronous: pod B's /filter can run before pod A's /bind. Two
10Gi shares on one 15 GiB time-sliced T4 both pass /filter; only one may be bound.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

import pytest

from extender import settle as settle_module
from gpu_placement.samples.cluster import make_node, make_pod, validator_pod
from tests.support.extender import Extender

SHARED = "nvidia.com/gpu.shared"
T4 = "t4-ts"
ASK = {"gpu-placement.io/gpu-memory": "10Gi"}


@pytest.fixture
def t4() -> Iterator[Extender]:
    node = make_node(T4, "t4-timeslicing", labels={"nvidia.com/gpu.replicas": "2",
                                                   "nvidia.com/gpu.sharing-strategy": "time-slicing"},
                     shared_resource=SHARED)  # 15360 MiB, two shares advertised as nvidia.com/gpu.shared
    extender = Extender([node, validator_pod(T4), make_node("cpu-1", None)])
    yield extender
    extender.close()


def _pod(name: str) -> dict[str, Any]:
    return make_pod("inference", name, gpus={SHARED: 1}, annotations=ASK, image="registry.example.com/chat:1")


def _bind(extender: Extender, name: str, node: str = T4) -> str:
    response = extender.post("bind", {"PodName": name, "PodNamespace": "inference",
                                      "PodUID": f"uid-inference-{name}", "Node": node})
    assert response.status_code == 200
    return str(response.json()["Error"])


def _together(*calls: Callable[[], Any]) -> list[Any]:
    """Start the calls at the same moment, on their own connections."""
    barrier = threading.Barrier(len(calls))

    def run(call: Callable[[], Any]) -> Any:
        barrier.wait()
        return call()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, calls))


def test_concurrent_filter_filter_bind_bind_never_overcommits(t4: Extender) -> None:
    view = t4.core.view
    for round_ in range(8):
        a, b = f"chat-{round_}-a", f"chat-{round_}-b"
        for name in (a, b):  # created: the watch shows them Pending
            t4.core.ingest.event(view, "pods", "ADDED", _pod(name))
        filters = _together(*(partial(t4.filter, _pod(name), [T4]) for name in (a, b)))
        assert [answer["NodeNames"] for answer in filters] == [[T4], [T4]]  # each fits alone
        errors = _together(*(partial(_bind, t4, name) for name in (a, b)))
        assert sorted(bool(error) for error in errors) == [False, True], errors
        refused = next(error for error in errors if error)
        assert refused.startswith(f"InsufficientGPUMemory: the pod needs 10240 MiB of {SHARED} memory free")
        assert "checked again at /bind" in refused
        assert view.free_mib[SHARED][T4] == 15360 - 10240  # one share held, never -5120
        bound = [key for key in (f"inference/{a}", f"inference/{b}") if view.pods[key].node]
        assert len(bound) == 1 and view.pods[bound[0]].node == T4 and not view.reservations
        for key in (f"inference/{a}", f"inference/{b}"):  # the bound one ends, the refused one is deleted
            view.delete_pod(key)
        assert view.free_mib[SHARED][T4] == 15360


def test_the_next_cycle_counts_a_bind_in_flight(t4: Extender) -> None:
    """kube-scheduler binds pod A while it already filters pod B (with the same nodes, in another
    order): B's answer is the kind's cached one put right for A's hold, not replayed from before it."""
    view = t4.core.view
    assert t4.filter(_pod("chat-a"), [T4, "cpu-1"])["NodeNames"] == [T4]
    assert _bind(t4, "chat-a") == ""  # the watch has not shown A yet: only its hold counts
    assert "inference/chat-a" in view.reservations and "inference/chat-a" not in view.pods
    answer = t4.filter(_pod("chat-b"), ["cpu-1", T4])
    assert answer["NodeNames"] == [], answer
    assert answer["FailedNodes"][T4].startswith(f"InsufficientGPUMemory: the pod needs 10240 MiB of {SHARED}")


def test_bind_to_a_node_filter_rejected_is_refused(t4: Extender) -> None:
    answer = t4.filter(_pod("chat-x"), [T4, "cpu-1"])
    assert answer["NodeNames"] == [T4] and set(answer["FailedAndUnresolvableNodes"]) == {"cpu-1"}
    error = _bind(t4, "chat-x", "cpu-1")
    assert error.startswith("NoGPU: ") and "kube-scheduler retries" in error
    assert not t4.core.view.reservations and "inference/chat-x" not in t4.core.view.pods


def test_bind_of_a_pod_never_filtered_is_refused(t4: Extender) -> None:
    assert _bind(t4, "chat-y") == ""  # neither filtered nor in the view: no GPU known, nothing to hold
    t4.core.ingest.event(t4.core.view, "pods", "ADDED", _pod("chat-z"))  # the watch shows it, unfiltered
    assert _bind(t4, "chat-z").startswith("pod inference/chat-z was not filtered by this extender")
    assert t4.core.view.pods["inference/chat-z"].node is None


def test_a_pod_that_fits_nowhere_takes_the_room_freed_while_its_filter_runs(t4: Extender,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """kube-scheduler retries a pod rejected for want of room on the event that frees room, often
    before our own watch has applied that event. A filter that would reject every node for room
    therefore waits a moment for a change already on its way, and decides again when it came."""
    view = t4.core.view
    t4.core.ingest.event(view, "pods", "ADDED", make_pod("inference", "holder", gpus={SHARED: 1}, annotations=ASK,
                                                          node=T4, image="registry.example.com/chat:1"))
    assert t4.filter(_pod("late"), [T4])["FailedNodes"]  # 10 GiB of 15 held: no room
    # The deletion lands while the filter waits for a change (a timer thread 5 ms after the request
    # missed the 25 ms wait when a loaded machine ran it late): a task of the server's loop, which runs
    # at the wait's first poll, once the wait has read the view's generation.
    waits: list[float] = []
    settle = settle_module._view_changes

    async def delete() -> None:
        view.delete_pod("inference/holder")

    async def deletion_during_the_wait(waited: Any, seconds: float, until: str | None = None) -> bool:
        waits.append(seconds)
        deletion = asyncio.get_running_loop().create_task(delete())
        try:
            return await settle(waited, seconds, until)
        finally:
            await deletion

    monkeypatch.setattr(settle_module, "_view_changes", deletion_during_the_wait)
    answer = t4.filter(_pod("late"), [T4])
    assert waits == [settle_module.SETTLE_SECONDS]  # it waited, once
    assert answer["NodeNames"] == [T4] and not answer["FailedNodes"], answer
    assert t4.filter(_pod("late"), [T4])["NodeNames"] == [T4]
