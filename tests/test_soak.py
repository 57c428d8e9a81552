"""A node's rollout state from the GPU Operator's objects (`gpu_placement.facts.soak`): when its driver
changed, whether that was a change at all, and what fails a soak."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_placement.base.config import Rollout, parse_config
from gpu_placement.base.timestamps import format_time, parse_time
from gpu_placement.facts.nodes import node_from_json
from gpu_placement.facts.soak import (
    DONE,
    FAILED,
    PENDING,
    SOAKING,
    UPGRADING,
    OperatorPod,
    Soak,
    node_soak,
    operator_pod_from_json,
)
from gpu_placement.samples.cluster import driver_labels, driver_pod, make_node, validator_pod

NOW = 1_800_000_000.0
HOUR, DAY = 3600.0, 86400.0
NEW = ("580.126.09", "13.0")
RULES = Rollout()  # 60 minutes


def node(labels: dict[str, str] | None = None, created: float = NOW - 100 * DAY) -> Any:
    return node_from_json(make_node("gpu-1", "h100", created=created, labels={**driver_labels(*NEW), **(labels or {})}))


def driver(ready_ago: float | None, version: str = NEW[0], **kwargs: Any) -> OperatorPod:
    return operator_pod_from_json(driver_pod("gpu-1", version, NOW - ready_ago if ready_ago is not None else None,
                                             **kwargs))


def soak(facts: Any = None, drv: OperatorPod | None = None, validator: OperatorPod | None = None,
         xid_at: float | None = None, established: bool = False, rules: Rollout = RULES) -> Soak:
    return node_soak(facts or node(), drv, validator, xid_at, established, NOW, rules)


def test_a_driver_pod_ready_twenty_minutes_ago_soaks_for_forty_more() -> None:
    state = soak(drv=driver(20 * 60))
    assert state == Soak(SOAKING, "580.126.09", NOW - 20 * 60, NOW + 40 * 60)
    assert soak(drv=driver(20 * 60), rules=parse_config({"rollout": {"soakMinutes": 15}}).rollout).state == DONE
    assert soak(drv=driver(20 * 60), rules=parse_config({"rollout": {"soakMinutes": 0}}).rollout).state == DONE


def test_past_the_soak_it_is_done_or_waits_for_the_next_wave() -> None:
    assert soak(drv=driver(2 * HOUR)) == Soak(DONE, "580.126.09", NOW - 2 * HOUR)
    pending = node({"nvidia.com/gpu-driver-upgrade-state": "upgrade-required"})
    assert soak(pending, driver(2 * HOUR)).state == PENDING
    assert soak(pending, driver(10 * 60)).state == SOAKING  # soaking on what it runs now, whatever comes next


def test_no_driver_pod_means_drivers_the_operator_does_not_install() -> None:
    assert soak(drv=None) == Soak(DONE, "580.126.09")


@pytest.mark.parametrize(("labels", "state", "why"), [
    ({"nvidia.com/gpu-driver-upgrade-state": "drain-required"}, UPGRADING,
     "nvidia.com/gpu-driver-upgrade-state=drain-required"),
    ({"nvidia.com/gpu-driver-upgrade-state": "validation-required"}, UPGRADING,
     "nvidia.com/gpu-driver-upgrade-state=validation-required"),
    ({"nvidia.com/gpu.deploy.driver": "paused-for-driver-upgrade"}, UPGRADING,
     "nvidia.com/gpu.deploy.driver=paused-for-driver-upgrade"),
    ({"nvidia.com/gpu-driver-upgrade-state": "upgrade-failed"}, FAILED,
     "the GPU Operator marked the upgrade failed (nvidia.com/gpu-driver-upgrade-state=upgrade-failed)"),
])
def test_the_upgrade_controllers_states_come_first(labels: dict[str, str], state: str, why: str) -> None:
    found = soak(node(labels), driver(10 * 60))
    assert (found.state, found.why) == (state, why)


def test_a_driver_pod_still_installing_or_not_yet_relabelled_is_upgrading() -> None:
    assert soak(drv=driver(None)).why == "the driver pod is not Ready yet (installing the driver)"
    # Ready, but GFD still shows the old driver: not soaking yet (the soak would name the wrong version)
    old_labels = node(driver_labels("550.54.15", "12.4"))
    assert soak(old_labels, driver(60)).state == UPGRADING
    # an image by digest names no version: the Ready time alone counts
    by_digest = driver_pod("gpu-1", NEW[0], NOW - 60)
    by_digest["spec"]["containers"][0]["image"] = "nvcr.io/nvidia/driver@sha256:" + "a" * 64
    assert soak(old_labels, operator_pod_from_json(by_digest)).state == SOAKING


def test_a_container_restart_is_not_a_new_driver() -> None:
    """A node rebooted weeks after its upgrade: the driver container restarted (restartCount 1) and Ready
    moved to now, but the pod started long ago: no new soak."""
    rebooted = driver(5 * 60, created=NOW - 30 * DAY, restarts=1, restarted_at=NOW - 10 * 60)
    assert rebooted.started == NOW - 30 * DAY + 5 and rebooted.ready_since == NOW - 5 * 60
    assert soak(drv=rebooted).state == DONE


def test_a_soak_fails_on_a_driver_or_validator_restart_or_an_xid_within_it() -> None:
    crashed = driver(5 * 60, created=NOW - 30 * 60, restarts=2, restarted_at=NOW - 8 * 60)
    assert soak(drv=crashed) == Soak(FAILED, "580.126.09", NOW - 30 * 60 + 5, None,
                                     "the driver container restarted during the soak")
    restarted = operator_pod_from_json(_restarted_validator(NOW - 5 * 60))
    assert soak(drv=driver(20 * 60), validator=restarted).why == (
        "the nvidia-operator-validator pod restarted during the soak (a validation failed)")
    before = operator_pod_from_json(_restarted_validator(NOW - 3 * HOUR))  # a restart under the old driver
    assert soak(drv=driver(20 * 60), validator=before).state == SOAKING
    assert soak(drv=driver(20 * 60), xid_at=NOW - 60).why == "DCGM reported an XID error during the soak"
    assert soak(drv=driver(20 * 60), xid_at=NOW - HOUR).state == SOAKING  # before the new driver
    # failed stays failed past the soak's end: the evidence is on the pods
    assert soak(drv=driver(3 * HOUR), validator=operator_pod_from_json(_restarted_validator(NOW - 2.5 * HOUR))
                ).state == FAILED


def test_a_new_nodes_first_driver_soaks_only_when_its_version_is_new() -> None:
    fresh = node(created=NOW - 10 * 60)
    first = driver(5 * 60, created=NOW - 9 * 60)
    assert soak(fresh, first, established=True) == Soak(DONE, "580.126.09", NOW - 5 * 60)  # autoscaled
    assert soak(fresh, first, established=False).state == SOAKING  # one of the first nodes on the version
    upgraded = driver(5 * 60, created=NOW - 9 * 60)
    assert soak(node(), upgraded, established=True).state == SOAKING  # an old node's driver changed


def _restarted_validator(finished: float) -> dict[str, Any]:
    pod = validator_pod("gpu-1")
    pod["status"]["initContainerStatuses"] = [{"name": "cuda-validation", "restartCount": 1, "lastState": {
        "terminated": {"exitCode": 1, "finishedAt": format_time(finished)}}}]
    return pod


def test_operator_pods_read_as_the_api_server_writes_them() -> None:
    pod = driver_pod("gpu-1", "550.54.15", NOW - 60, created=NOW - 300, restarts=1, restarted_at=NOW - 120)
    read = operator_pod_from_json(pod)
    assert read == OperatorPod("uid-gpu-operator-nvidia-driver-daemonset-gpu-1", NOW - 300, NOW - 295, NOW - 60, 1,
                               NOW - 120, "550.54.15", NOW - 60)
    for image, version in [("nvcr.io/nvidia/driver:550.54.15-ubuntu22.04", "550.54.15"),
                           ("registry:5000/nvidia/driver:570.172.08-rhel9.4", "570.172.08"),
                           ("nvcr.io/nvidia/driver:550-5.15.0-1041-azure-ubuntu22.04", None),  # precompiled
                           ("nvcr.io/nvidia/driver@sha256:" + "b" * 64, None)]:
        pod["spec"]["containers"][0]["image"] = image
        assert operator_pod_from_json(pod).version == version, image
    pod["status"]["conditions"][0]["status"] = "False"
    assert operator_pod_from_json(pod).ready_since is None
    assert parse_time("not a time") is None and parse_time("2026-12-03T10:17:58") is None  # no zone: not the API's
    assert parse_time(format_time(NOW)) == NOW


def settled_node(settled: str, driver: tuple[str, str] = NEW, labels: dict[str, str] | None = None) -> Any:
    obj = make_node("gpu-1", "h100", created=NOW - 100 * DAY, labels={**driver_labels(*driver), **(labels or {})})
    obj["metadata"]["annotations"] = {"gpu-placement.io/settled-driver": settled}
    return node_from_json(obj)


def test_a_reinstall_of_the_settled_driver_does_not_soak() -> None:
    assert soak(settled_node("580.126.09"), driver(10 * 60)) == Soak(DONE, "580.126.09", NOW - 10 * 60)
    pending = settled_node("580.126.09", labels={"nvidia.com/gpu-driver-upgrade-state": "upgrade-required"})
    assert soak(pending, driver(10 * 60)).state == PENDING
    # still installing: upgrading, reinstall or not; a restart of the reinstalled driver fails nothing
    assert soak(settled_node("580.126.09"), driver(None)).state == UPGRADING
    restarted = driver(10 * 60, restarts=2, restarted_at=NOW - 60)
    assert soak(settled_node("580.126.09"), restarted).state == DONE


def test_another_version_than_the_settled_one_soaks_and_says_what_it_ran_before() -> None:
    assert soak(settled_node("550.54.15"), driver(10 * 60)) == Soak(
        SOAKING, "580.126.09", NOW - 10 * 60, NOW + 50 * 60, "new on the node: it ran 550.54.15 before")
    # a rollback is a change too
    rollback = soak(settled_node("580.126.09", ("550.54.15", "12.4")), driver(10 * 60, "550.54.15"))
    assert (rollback.state, rollback.why) == (SOAKING, "new on the node: it ran 580.126.09 before")
    # the pod runs the settled version but GFD still shows the one it replaces: upgrading, not done
    assert soak(settled_node("550.54.15"), driver(10 * 60, "550.54.15")).state == UPGRADING
    # junk in the annotation reads as no record: judged by the pod, as a change
    assert soak(settled_node("not-a-version"), driver(10 * 60)).state == SOAKING


def test_a_pod_that_names_no_version_is_judged_by_the_labels() -> None:
    digest = operator_pod_from_json({**driver_pod("gpu-1", NEW[0], NOW - 600), "spec": {"containers": [
        {"name": "nvidia-driver-ctr", "image": "nvcr.io/nvidia/driver@sha256:" + "0" * 64}]}})
    assert digest.version is None
    assert soak(settled_node("580.126.09"), digest).state == DONE
    assert soak(settled_node("550.54.15"), digest).state == SOAKING


def test_what_the_leader_records() -> None:
    from gpu_placement.facts.soak import settled_version

    facts = settled_node("550.54.15")
    assert settled_version(facts, driver(2 * HOUR), soak(facts, driver(2 * HOUR))) == (580, 126, 9)
    assert settled_version(facts, driver(10 * 60), soak(facts, driver(10 * 60))) is None  # soaking
    assert settled_version(facts, None, soak(facts, None)) is None  # no operator driver: nothing to record
    behind = node()  # labels 580; the pod runs 590 and GFD has not caught up
    late = driver(2 * HOUR, "590.48.01")
    assert settled_version(behind, late, Soak(DONE, "580.126.09")) is None
