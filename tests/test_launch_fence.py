"""The launch fence (docs/rules.md, LaunchFailures) through the real view and placement: GPU pods failing to
start on a node for the node's reasons, two in a row, keep that resource's pods off the node; what counts,
what resets, what lifts it (each kind of evidence, the probe), and a restart that keeps it."""

from __future__ import annotations

from typing import Any

from gpu_placement.base.config import Config, parse_config
from gpu_placement.base.timestamps import format_time
from gpu_placement.decide.fences import Fences
from gpu_placement.decide.placement import Placement
from gpu_placement.facts.fence import parse_note
from gpu_placement.samples.cluster import driver_pod, make_node, make_pod, namespace, validator_pod
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from tests.support.fence import (
    GPU,
    MIG,
    NODES,
    NOW,
    bound,
    cuda_failed,
    failed,
    gpu_pod,
    image_pull,
    node,
    ready_validator,
    sentence,
    started,
)


class Fleet:
    """Two validated H100 nodes, fed one object at a time, with a clock of its own."""

    def __init__(self, config: Config | None = None, objects: list[dict[str, Any]] | None = None) -> None:
        self.now = NOW
        self.config = config or Config()
        self.view = ClusterView(self.config)
        self.ingest = Ingest(self.config)
        for obj in objects if objects is not None else [namespace("team"), namespace("gpu-operator"),
                                                           *(o for n in NODES for o in (node(n), validator_pod(n)))]:
            self.apply(obj)
        self.fences = Fences(self.view, self.config, clock=lambda: self.now)
        self.placement = Placement(self.view, self.config, fences=self.fences)

    def apply(self, *objects: dict[str, Any]) -> Fleet:
        for obj in objects:
            kind = Ingest.kind_of(obj)
            assert kind is not None
            self.ingest.event(self.view, kind, "MODIFIED", obj)
        return self

    def delete(self, name: str) -> None:
        self.view.delete_pod(f"team/{name}")

    def filter(self, resource: str = GPU) -> tuple[set[str], dict[str, str]]:
        req = self.placement.requirements(make_pod("team", "next", gpus={resource: 1}))
        result = self.placement.filter(req, NODES)
        return set(result.passed), {**result.failed, **result.unresolvable}


def test_two_failures_in_a_row_fence_the_node_one_does_not() -> None:
    fleet = Fleet().apply(failed("a", NOW - 30))
    assert fleet.filter() == ({"gpu-1", "gpu-2"}, {})  # one failure is not a fence
    fleet.apply(failed("b", NOW - 20))
    assert fleet.filter() == ({"gpu-2"}, {"gpu-1": sentence(2, NOW - 30, NOW - 20 + 120)})
    fleet.apply(started("c", NOW - 10, where="gpu-2"))  # another node's start says nothing of this one
    assert fleet.filter()[0] == {"gpu-2"}


def test_the_fence_is_per_resource() -> None:
    """MIG slices of one kind failing say nothing of another kind's: each resource its own fence."""
    mig = "nvidia.com/mig-2g.20gb"
    objects = [namespace("team"), namespace("gpu-operator")]
    for name in NODES:
        obj = make_node(name, "h100-mig-mixed", created=NOW - 86400)
        objects += [obj, validator_pod(name)]
    fleet = Fleet(objects=objects).apply(failed("a", NOW - 30, resource=MIG), failed("b", NOW - 20, resource=MIG))
    passed, failures = fleet.filter(MIG)
    assert passed == {"gpu-2"} and failures["gpu-1"].startswith(f"LaunchFailures: 2 {MIG} pods in a row failed")
    assert fleet.filter(mig) == ({"gpu-1", "gpu-2"}, {})


def test_pod_side_failures_neither_count_nor_reset() -> None:
    fleet = Fleet().apply(failed("a", NOW - 30), image_pull("b", NOW - 25))
    assert fleet.filter()[0] == {"gpu-1", "gpu-2"}
    fleet.apply(cuda_failed("c", NOW - 20))
    assert fleet.filter()[1] == {"gpu-1": sentence(2, NOW - 30, NOW - 20 + 120, "cuda_init")}


def test_a_start_in_between_resets_the_count_by_the_kubelets_time() -> None:
    fleet = Fleet().apply(failed("a", NOW - 30), started("b", NOW - 25), failed("c", NOW - 20))
    assert fleet.filter()[0] == {"gpu-1", "gpu-2"}
    # reported late but started last (its startTime is the newest): the failures before it do not fence
    fleet = Fleet().apply(failed("a", NOW - 30), failed("c", NOW - 20), started("b", NOW - 10))
    assert fleet.filter()[0] == {"gpu-1", "gpu-2"}


def test_a_kubelet_rejection_of_another_kind_is_not_the_gpus() -> None:
    pod = gpu_pod("a", "gpu-1", NOW - 30, {"phase": "Failed", "reason": "OutOfcpu"})
    fleet = Fleet().apply(pod, failed("b", NOW - 20))
    assert fleet.filter()[0] == {"gpu-1", "gpu-2"}


def test_a_validator_turning_ready_after_the_fence_lifts_it_one_before_does_not() -> None:
    fleet = Fleet().apply(failed("a", NOW - 30), failed("b", NOW - 20))
    fleet.apply(ready_validator("gpu-1", NOW - 40))
    assert fleet.filter()[0] == {"gpu-2"}
    fleet.apply(ready_validator("gpu-1", NOW - 5))
    assert fleet.filter() == ({"gpu-1", "gpu-2"}, {})
    fleet.apply(failed("c", NOW - 4))  # the failures before the revalidation never count again
    assert fleet.filter()[0] == {"gpu-1", "gpu-2"}
    fleet.apply(failed("d", NOW - 3))
    assert fleet.filter()[1] == {"gpu-1": sentence(2, NOW - 4, NOW - 3 + 120)}


def test_the_device_plugin_or_driver_pod_recreated_or_restarted_lifts_it() -> None:
    plugin = validator_pod("gpu-1")
    plugin["metadata"].update(name="nvidia-device-plugin-daemonset-gpu-1", uid="uid-plugin",
                              labels={"app": "nvidia-device-plugin-daemonset"},
                              creationTimestamp=format_time(NOW - 10))
    fleet = Fleet().apply(failed("a", NOW - 30), failed("b", NOW - 20))
    assert fleet.filter()[0] == {"gpu-2"}
    fleet.apply(plugin)
    assert fleet.filter()[0] == {"gpu-1", "gpu-2"}

    fleet = Fleet().apply(driver_pod("gpu-1", "580.126.09", NOW - 86000, created=NOW - 86400),
                          failed("a", NOW - 30), failed("b", NOW - 20))
    assert fleet.filter()[0] == {"gpu-2"}
    fleet.apply(driver_pod("gpu-1", "580.126.09", NOW - 86000, created=NOW - 86400, restarts=1,
                           restarted_at=NOW - 20))
    assert fleet.filter()[0] == {"gpu-1", "gpu-2"}


def written(fleet: Fleet, name: str = "gpu-1", boot: str = "boot-1") -> dict[str, Any]:
    """The Node as the fence leader leaves it: its annotation written from `due()`."""
    note = fleet.fences.due()[name]
    return node(name, boot, note)


def test_a_restart_keeps_the_fence_from_the_annotation_after_the_pods_are_gone() -> None:
    fleet = Fleet().apply(failed("a", NOW - 30), failed("b", NOW - 20))
    before = fleet.filter()
    annotated = written(fleet)
    assert parse_note(annotated["metadata"]["annotations"]["gpu-placement.io/launch-fence"]).entry(GPU) is not None
    fleet.apply(annotated)
    assert fleet.fences.due() == {}  # written once: the leader has nothing more to write
    fleet.delete("a")
    fleet.delete("b")  # the Job controller or the pod GC deleted the failed pods
    assert fleet.filter() == before
    restarted = Fleet(objects=[namespace("team"), namespace("gpu-operator"), annotated, validator_pod("gpu-1"),
                               node("gpu-2"), validator_pod("gpu-2")])
    assert restarted.filter() == before


def test_a_reboot_lifts_it_and_the_failures_before_it_stay_forgotten() -> None:
    fleet = Fleet().apply(failed("a", NOW - 30), failed("b", NOW - 20))
    annotated = written(fleet)
    fleet.apply(annotated)
    assert fleet.filter()[0] == {"gpu-2"}
    rebooted = node("gpu-1", "boot-2", annotated["metadata"]["annotations"]["gpu-placement.io/launch-fence"])
    fleet.apply(rebooted)
    assert fleet.filter() == ({"gpu-1", "gpu-2"}, {})
    fleet.apply(node("gpu-1", "boot-2", fleet.fences.due()["gpu-1"]))  # the leader records the lift
    assert fleet.filter() == ({"gpu-1", "gpu-2"}, {})
    fleet.apply(failed("c", NOW - 10))
    assert fleet.filter()[0] == {"gpu-1", "gpu-2"}  # a and b were before the reboot: one failure since


def test_time_alone_only_opens_one_probe_whose_failure_doubles_the_backoff() -> None:
    fleet = Fleet().apply(failed("a", NOW - 30), failed("b", NOW - 20))
    assert fleet.filter()[0] == {"gpu-2"}
    fleet.now = NOW - 20 + 119
    assert fleet.filter()[0] == {"gpu-2"}
    fleet.now = NOW - 20 + 120  # 2 minutes after the last failure: one pod may go
    assert fleet.filter() == ({"gpu-1", "gpu-2"}, {})
    fleet.apply(bound("probe-1", fleet.now + 1))  # the probe is on its way: the others are refused again
    assert fleet.filter()[0] == {"gpu-2"}
    fleet.apply(failed("probe-1", fleet.now + 1))  # it failed: 3 in a row, the next probe 4 minutes on
    last = NOW - 20 + 121
    assert fleet.filter()[1] == {"gpu-1": sentence(3, NOW - 30, last + 240)}
    fleet.now = last + 239
    assert fleet.filter()[0] == {"gpu-2"}
    fleet.now = last + 240
    assert fleet.filter()[0] == {"gpu-1", "gpu-2"}
    fleet.apply(bound("probe-2", fleet.now + 1))
    assert fleet.filter()[0] == {"gpu-2"}
    fleet.apply(started("probe-2", fleet.now + 1))  # it started: the fence lifts
    assert fleet.filter() == ({"gpu-1", "gpu-2"}, {})
    fleet.now += 86400 * 30
    assert fleet.filter() == ({"gpu-1", "gpu-2"}, {})


def test_the_backoff_is_capped_and_configurable() -> None:
    config = parse_config({"launchFence": {"probeMinutes": 1, "probeMaxMinutes": 3}})
    fleet = Fleet(config).apply(*(failed(f"p{i}", NOW - 600 + i) for i in range(6)))
    (fence,) = fleet.fences.state("gpu-1").fences
    assert (fence.count, fence.probe_at) == (6, NOW - 600 + 5 + 180)  # 1, 2, then 3 minutes at most


def test_the_probe_goes_to_one_pod_at_bind() -> None:
    fleet = Fleet().apply(failed("a", NOW - 30), failed("b", NOW - 20))
    fleet.now = NOW + 100
    req = fleet.placement.requirements(make_pod("team", "x", gpus={GPU: 1}))
    assert fleet.placement.recheck(req, "gpu-1") is None
    fleet.view.reserve("team/x", "gpu-1", req.gpus, None, "uid-x")  # /bind of the first pod
    assert fleet.placement.recheck(req, "gpu-1") == sentence(2, NOW - 30, NOW - 20 + 120)
    assert fleet.placement.recheck(req, "gpu-2") is None


def test_off_by_configuration() -> None:
    fleet = Fleet(parse_config({"launchFence": {"enabled": False}}))
    fleet.apply(failed("a", NOW - 30), failed("b", NOW - 20))
    assert fleet.filter()[0] == {"gpu-1", "gpu-2"}


def test_explain_shows_the_reason_and_an_open_probe() -> None:
    fleet = Fleet().apply(failed("a", NOW - 30), failed("b", NOW - 20))
    req = fleet.placement.requirements(make_pod("team", "x", gpus={GPU: 1}))
    rows = {row.node: row for row in fleet.placement.explain(req)}
    assert not rows["gpu-1"].passed and rows["gpu-1"].reason == sentence(2, NOW - 30, NOW - 20 + 120)
    fleet.now = NOW + 100
    rows = {row.node: row for row in fleet.placement.explain(req)}
    assert rows["gpu-1"].passed
    probe = "launch fence on nvidia.com/gpu (2 failed in a row, device_plugin): its probe is open"
    assert probe in rows["gpu-1"].detail
