"""Driver rollouts through the real view and placement: soaking nodes kept from ordinary pods and
given to canaries (prefer and strict), soaks that end on the clock with no object change, a wave
followed event by event, failures, a restart that keeps the state, and the per-version figures."""

from __future__ import annotations

import time
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpu_placement.app.assembly import core_from_objects
from gpu_placement.base.config import parse_config
from gpu_placement.decide.rollout import Rollout, releases, track_rollout
from gpu_placement.facts.soak import DONE, FAILED, SOAKING, UPGRADING
from gpu_placement.observe import metrics
from gpu_placement.samples.cluster import driver_labels, driver_pod, make_node, make_pod, namespace, validator_pod
from gpu_placement.samples.dra import device_classes, resource_slice
from gpu_placement.view.cluster import ClusterView, Telemetry
from gpu_placement.view.ingest import Ingest
from tests.support.dra import claim_pod, dra_node, template
from tests.support.rollout import DAY, GPU, NEW, NODES, NOW, OLD, SOAKING_SENTENCE, Wave

PREFER, STRICT = parse_config({}), parse_config({"rollout": {"soak": "strict"}})


def test_prefer_ordinary_pods_score_soaking_nodes_lowest_and_canaries_highest() -> None:
    wave = Wave(PREFER)
    assert [wave.rollout.soak(n).state for n in NODES] == [DONE, SOAKING, SOAKING]
    assert wave.filter("team") == (set(NODES), {})  # prefer refuses nothing
    assert wave.scores("team") == {"old": 1, "new-1": 0, "new-2": 0}  # binpack 1/8 on the old driver
    assert wave.scores("canary") == {"old": 1, "new-1": 10, "new-2": 10}
    # A full node under binpack scores 10; a canary's 10 is a soaking node's alone.
    wave.apply(make_pod("team", "big", gpus={GPU: 7}, node="old"))
    assert wave.scores("team")["old"] == 10 and wave.scores("canary")["old"] == 9
    verdict = {v.node: v for v in wave.placement.explain(wave.requirements("canary"), NODES)}
    assert "driver 580.126.09 soaking: score 10 (canary namespace; gpu-placement rollout)" in verdict["new-1"].detail


def test_strict_refuses_ordinary_pods_with_one_sentence_for_every_soaking_node() -> None:
    wave = Wave(STRICT)
    passed, failed = wave.filter("team")
    assert passed == {"old"} and failed == {"new-1": SOAKING_SENTENCE, "new-2": SOAKING_SENTENCE}
    result = wave.placement.filter(wave.requirements("team"), NODES)
    assert result.failed == {} and set(result.unresolvable) == {"new-1", "new-2"}  # preemption cannot end a soak
    assert wave.filter("canary") == (set(NODES), {})
    assert wave.placement.recheck(wave.requirements("team"), "new-1") == SOAKING_SENTENCE  # /bind checks it too
    fresh = Wave(STRICT)  # ... also when no /filter has judged that kind of pod yet (nothing cached)
    assert fresh.placement.recheck(fresh.requirements("team"), "new-2") == SOAKING_SENTENCE
    assert fresh.placement.recheck(fresh.requirements("canary"), "new-2") is None


def test_a_soak_ends_on_the_clock_with_no_object_changing() -> None:
    wave = Wave(STRICT)
    before = wave.placement.filter(wave.requirements("team"), NODES)
    assert set(before.passed) == {"old"}
    assert wave.placement.filter(wave.requirements("team"), NODES) is before  # the cached answer, replayed
    wave.now = NOW + 10 * 60 + 1  # new-2's hour is up (it became Ready 50 minutes before NOW)
    passed, failed = wave.filter("team")
    assert passed == {"old", "new-2"} and set(failed) == {"new-1"}
    assert wave.scores("team")["new-2"] == 1  # scored as any other node again
    wave.now = NOW + 40 * 60 + 1
    assert wave.filter("team") == (set(NODES), {})
    assert wave.rollout.soak("new-1").state == DONE and not wave.rollout._due


def test_a_wave_followed_event_by_event() -> None:
    """What the upgrade controller and the kubelet write, in order, and what a pod gets at each step."""
    wave = Wave(STRICT)
    node = make_node("old", "h100x8", labels=driver_labels(*OLD), created=NOW - 100 * DAY)

    def label(state: str | None, driver: tuple[str, str] = OLD) -> None:
        node["metadata"]["labels"].update(driver_labels(*driver))
        node["metadata"]["labels"]["nvidia.com/gpu-driver-upgrade-state"] = state
        wave.apply(node)

    label("drain-required")
    assert wave.rollout.soak("old").state == UPGRADING and "old" not in wave.filter("team")[0]
    wave.delete_pod("gpu-operator", "nvidia-driver-daemonset-old")  # the controller restarts the driver pod
    wave.apply(driver_pod("old", NEW[0], None, created=NOW))  # the new pod installs the new driver
    label("pod-restart-required")
    assert wave.rollout.soak("old").state == UPGRADING
    wave.now = NOW + 300
    wave.apply(driver_pod("old", NEW[0], wave.now, created=NOW))  # Ready: the new driver is loaded
    label("upgrade-done")  # the labels still say 550: GFD has not relabelled yet
    assert wave.rollout.soak("old").state == UPGRADING
    label("upgrade-done", NEW)
    assert wave.rollout.soak("old").state == SOAKING and wave.rollout.soak("old").since == NOW + 300
    passed, failed = wave.filter("team")
    assert passed == set() and set(failed) == set(NODES)  # every node of the pool soaks: ordinary pods wait
    assert wave.filter("canary")[0] == set(NODES)


def test_an_xid_or_a_validator_restart_during_the_soak_fails_it() -> None:
    wave = Wave(STRICT)
    assert wave.scores("canary")["new-1"] == 10  # cached verdicts, which the XID below must redo
    wave.view.set_telemetry({"new-1": Telemetry(None, 1, 0.0, (), xid_events=2)})
    assert wave.rollout.soak("new-1").state == FAILED
    assert wave.rollout.soak("new-1").why == "DCGM reported an XID error during the soak"
    wave.view.set_telemetry({})  # the XID leaves the telemetry window: still failed
    assert wave.rollout.soak("new-1").state == FAILED
    failed = wave.filter("team")[1]["new-1"]
    assert failed.startswith("DriverSoaking: driver 580.126.09 failed its 60 minutes soak on the node")
    assert wave.scores("canary")["new-1"] == 0  # canaries do not get a driver that failed
    validator = validator_pod("new-2")
    validator["status"]["containerStatuses"] = [{"name": "nvidia-operator-validator", "restartCount": 1,
                                                 "lastState": {"terminated": {"finishedAt": "2027-01-15T08:00:00Z"}}}]
    wave.apply(validator)  # 08:00:00Z is NOW (1.8e9) + 0: inside new-2's soak
    assert wave.rollout.soak("new-2").state == FAILED
    # Soaks that failed stay failed when the hour is up.
    wave.now = NOW + 2 * 3600
    assert [wave.rollout.soak(n).state for n in NODES] == [DONE, FAILED, FAILED]


def test_a_restart_of_the_service_keeps_the_soak() -> None:
    """Every time comes from the objects: a new process reading the same cluster later sees the same soak."""
    first = Wave(STRICT)
    restarted = Wave(STRICT, first.objects)
    restarted.now = NOW + 5 * 60
    assert [restarted.rollout.soak(n) for n in NODES] == [first.rollout.soak(n) for n in NODES]
    assert restarted.filter("team") == ({"old"}, {"new-1": SOAKING_SENTENCE, "new-2": SOAKING_SENTENCE})


def test_figures_per_version_follow_every_change_and_match_a_rebuild() -> None:
    wave = Wave(PREFER)
    wave.apply(make_pod("team", "ok", gpus={GPU: 1}, node="new-1"))
    wave.apply(make_pod("team", "crashed", gpus={GPU: 1}, node="new-1", phase="Failed"))
    wave.apply(make_pod("team", "old-job", gpus={GPU: 2}, node="old", phase="Succeeded"))
    wave.apply(make_pod("team", "no-gpu", node="old"))
    wave.view.set_telemetry({"new-1": Telemetry(None, 1, 0.0, (), xid_events=3),
                             "new-2": Telemetry(1000, 0, 0.0, (1000,)), "old": Telemetry(1000, 0, 0.0, (1000,))})
    figures = wave.rollout.figures()
    assert list(figures) == ["580.126.09", "550.54.15"]
    new, old = figures["580.126.09"], figures["550.54.15"]
    assert dict(new.states) == {SOAKING: 1, FAILED: 1} and dict(old.states) == {DONE: 1}
    assert (new.gpu_pods, new.failed_pods, old.gpu_pods, old.failed_pods) == (2, 1, 1, 0)
    # 3 XID events in the 10-minute window over 2 nodes with readings: 9 per node-hour
    assert wave.rollout.xid_per_node_hour(new) == pytest.approx(9.0)
    assert wave.rollout.xid_per_node_hour(old) == 0.0
    wave.delete_pod("team", "crashed")
    assert wave.rollout.figures()["580.126.09"].failed_pods == 0
    fresh = Rollout(wave.view, wave.config, clock=lambda: wave.now)
    assert _plain(fresh.figures()) == _plain(wave.rollout.figures())
    assert releases(["550.54.15", "580.126.09", "535.129.03", "unknown"]) == {
        "580.126.09": "newest", "550.54.15": "previous", "535.129.03": "older", "unknown": "unknown"}
    assert releases(["535.54.03", "535.104.05"]) == {"535.104.05": "newest", "535.54.03": "previous"}  # not as text


def _plain(figures: dict[str, Any]) -> dict[str, Any]:
    return {v: (dict(f.states), f.gpu_pods, f.failed_pods, f.xid_events, f.telemetry_nodes) for v, f in figures.items()}


def test_the_figures_are_exported_with_their_release() -> None:
    wave = Wave(PREFER)
    track_rollout(wave.rollout)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(metrics.exposition().decode()) for s in family.samples}
    assert samples[("gpu_placement_driver_nodes", (("release", "newest"), ("state", "soaking"),
                                                   ("version", "580.126.09")))] == 2
    assert samples[("gpu_placement_driver_nodes", (("release", "previous"), ("state", "done"),
                                                   ("version", "550.54.15")))] == 1
    assert samples[("gpu_placement_driver_gpu_pods", (("release", "newest"), ("version", "580.126.09")))] == 0
    assert not any(name == "gpu_placement_driver_xid_per_node_hour" for name, _ in samples)  # no telemetry: no rate


def test_new_nodes_listed_before_their_driver_pods_still_soak_as_the_first_of_a_version() -> None:
    """A live list brings nodes before pods: for a moment a node has no driver pod (settled, as with
    pre-installed drivers). Two new nodes of a new version must not end up proving it to each other."""
    config = STRICT
    view = ClusterView(config)
    ingest = Ingest(config)
    rollout = Rollout(view, config, clock=lambda: NOW)
    for name in ("fresh-1", "fresh-2"):
        view.upsert_node(ingest.node(make_node(name, "h100x8", labels=driver_labels(*NEW), created=NOW - 600)))
    for name in ("fresh-1", "fresh-2"):
        view.upsert_pod(ingest.pod(driver_pod(name, NEW[0], NOW - 300, created=NOW - 500)))
    assert [rollout.soak(n).state for n in ("fresh-1", "fresh-2")] == [SOAKING, SOAKING]
    # A node that has run the version past its soak proves it: the new nodes' first drivers are no change.
    view.upsert_node(ingest.node(make_node("proven", "h100x8", labels=driver_labels(*NEW), created=NOW - 9 * DAY)))
    view.upsert_pod(ingest.pod(driver_pod("proven", NEW[0], NOW - 8 * DAY)))
    assert [rollout.soak(n).state for n in ("fresh-1", "fresh-2", "proven")] == [DONE, DONE, DONE]
    view.delete_node("proven")
    assert [rollout.soak(n).state for n in ("fresh-1", "fresh-2")] == [SOAKING, SOAKING]


def test_a_pod_claiming_gpus_through_dra_follows_the_soak_too() -> None:
    """The soak is a node rule: a DRA pod (its claim asks for gpu.nvidia.com) gets it like any GPU pod."""
    now = time.time()
    objects: list[dict[str, Any]] = [namespace("team"), namespace("canary", {"gpu-placement.io/canary": "true"}),
                                     *device_classes()]
    for ns in ("team", "canary"):
        objects.append(template(ns, "one-gpu", "gpu.nvidia.com"))
    for name, ready_ago in (("settled", 40 * DAY), ("soaking", 10 * 60)):
        objects += [dra_node(name, labels=driver_labels(*NEW), created=now - 100 * DAY), validator_pod(name),
                    resource_slice(name, 2), driver_pod(name, NEW[0], now - ready_ago)]
    placement = core_from_objects(STRICT, objects).placement
    nodes = ["settled", "soaking"]
    team = placement.filter(placement.requirements(claim_pod("team", "train", "one-gpu")), nodes)
    assert team.passed == ["settled"] and team.unresolvable["soaking"] == SOAKING_SENTENCE
    canary = placement.filter(placement.requirements(claim_pod("canary", "smoke", "one-gpu")), nodes)
    assert sorted(canary.passed) == nodes


@pytest.mark.parametrize("resource", ["nvidia.com/gpu", "deviceclass.resource.kubernetes.io/gpu.nvidia.com"])
def test_a_pod_served_through_dra_by_its_resource_follows_the_soak_too(resource: str) -> None:
    """KEP-5004: an unchanged nvidia.com/gpu pod (or one asking the class's implicit name) on nodes whose
    allocatable lacks the resource takes a DRA device; the soak holds for it as for any GPU pod."""
    now = time.time()
    objects: list[dict[str, Any]] = [namespace("team"), namespace("canary", {"gpu-placement.io/canary": "true"}),
                                     *device_classes()]
    for name, ready_ago in (("settled", 40 * DAY), ("soaking", 10 * 60)):
        objects += [dra_node(name, labels=driver_labels(*NEW), created=now - 100 * DAY), validator_pod(name),
                    resource_slice(name, 2), driver_pod(name, NEW[0], now - ready_ago)]
    placement = core_from_objects(STRICT, objects).placement
    nodes = ["settled", "soaking"]
    team = placement.filter(placement.requirements(make_pod("team", "train", gpus={resource: 1})), nodes)
    assert team.passed == ["settled"] and team.unresolvable["soaking"] == SOAKING_SENTENCE
    canary = placement.filter(placement.requirements(make_pod("canary", "smoke", gpus={resource: 1})), nodes)
    assert sorted(canary.passed) == nodes
