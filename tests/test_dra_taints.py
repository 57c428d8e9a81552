"""The DeviceTaintRule controller against the fake API server (docs/dra.md): the view fed by
the real list+watch loop, rules written through the real client, one replica leading; rules appear
for unverified nodes and go when they are verified; the validator's own way in; rules it does not own
left alone; the version by discovery, and nothing written where none is served."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import orjson
import pytest

from gpu_placement.base.config import Config, parse_config
from gpu_placement.controllers.dra_taints import TaintController, TaintSettings
from gpu_placement.observe import metrics
from gpu_placement.samples.cluster import namespace, validator_pod
from gpu_placement.samples.dra import device_classes, resource_slice
from gpu_placement.view.cluster import Telemetry
from tests.fakeapi import FakeApiServer
from tests.support.dra_taints import QUICK, Replica, dra_node, rules, taint, waiting_validator
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(30)
RULES = "/apis/resource.k8s.io/{}/devicetaintrules"


def gauge(metric: Any, *labels: str) -> float:
    return float((metric.labels(*labels) if labels else metric)._value.get())


def test_unverified_nodes_get_a_rule_and_lose_it_when_verified(replicas: Callable[..., Replica]) -> None:
    replica = replicas()
    fake = replica.fake
    foreign = {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceTaintRule", "metadata": {"name": "gpu-placement-ok"},
               "spec": {"deviceSelector": {"driver": "gpu.nvidia.com", "pool": "ok"},
                        "taint": {"key": "example.com/maintenance", "effect": "None"}}}
    fake.add(foreign)  # our name, not our label: never touched, even though "ok" needs no rule
    replica.taints.step()
    found = rules(fake)
    assert sorted(found) == ["gpu-placement-ok", "gpu-placement-unvalidated", "gpu-placement-upgrading"]
    unvalidated = found["gpu-placement-unvalidated"]
    assert unvalidated["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": "unvalidated"}
    assert taint(unvalidated) == ("gpu-placement.io/unverified", "NotValidated", "NoSchedule")
    assert unvalidated["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "gpu-placement",
                                                 "gpu-placement.io/node": "unvalidated"}
    assert unvalidated["metadata"]["annotations"]["gpu-placement.io/reason"].startswith("NotValidated: ")
    assert taint(found["gpu-placement-upgrading"])[1] == "DriverUpgrade"
    assert found["gpu-placement-ok"] == fake.get("DeviceTaintRule", "gpu-placement-ok")  # the foreign one
    assert taint(found["gpu-placement-ok"]) == ("example.com/maintenance", "", "None")
    assert replica.taints.holds == {"waiting"}  # its validator waits for a device: no rule to keep it out
    assert gauge(metrics.DRA_TAINT_SERVED) == 1 and gauge(metrics.DRA_TAINT_RULES) == 2
    assert gauge(metrics.DRA_TAINTED_DEVICES, "NotValidated", "NoSchedule") == 2

    fake.update(validator_pod("unvalidated", True))  # the validator turns Ready
    fake.patch_labels("Node", "upgrading", {"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"})
    wait_for(lambda: replica.view.validator_state("unvalidated").ready, what="the validator Ready in the view")
    wait_for(lambda: replica.view.nodes["upgrading"].upgrade_state == "upgrade-done", what="upgrade done")
    replica.taints.step()
    assert sorted(rules(fake)) == ["gpu-placement-ok"]
    assert gauge(metrics.DRA_TAINTED_DEVICES, "NotValidated", "NoSchedule") == 0


def test_the_waiting_validators_node_is_tainted_once_it_is_bound(replicas: Callable[..., Replica]) -> None:
    replica = replicas()
    fake = replica.fake
    replica.taints.step()
    assert "gpu-placement-waiting" not in rules(fake)
    fake.bind("gpu-operator", "nvidia-dra-validator-waiting", "waiting")  # the scheduler gave it a device
    wait_for(lambda: replica.view.validator_state("waiting").pod, what="the validator bound in the view")
    replica.taints.step()
    assert taint(rules(fake)["gpu-placement-waiting"])[1] == "NotValidated"
    assert replica.taints.holds == set()


def test_dry_run_effect_only_reports(replicas: Callable[..., Replica]) -> None:
    replica = replicas(parse_config({"dra": {"taintEffect": "None"}}))
    replica.taints.step()
    assert {taint(r)[2] for r in rules(replica.fake).values()} == {"None"}


def test_no_execute_never_evicts_a_validator_that_holds_a_device(replicas: Callable[..., Replica]) -> None:
    replica = replicas(parse_config({"dra": {"taintEffect": "NoExecute"}}))
    fake = replica.fake
    replica.taints.step()
    assert taint(rules(fake)["gpu-placement-upgrading"])[2] == "NoExecute"  # its validator holds no claim
    fake.bind("gpu-operator", "nvidia-dra-validator-waiting", "waiting")
    wait_for(lambda: replica.view.validator_state("waiting").pod, what="the DRA validator bound")
    replica.taints.step()
    assert taint(rules(fake)["gpu-placement-waiting"])[2] == "NoSchedule"


def test_a_device_named_by_telemetry_is_tainted_alone(replicas: Callable[..., Replica]) -> None:
    replica = replicas()
    replica.view.set_telemetry({"ok": Telemetry(None, 1, time.monotonic(), (), frozenset({"GPU-ok-0001"}))})
    replica.taints.step()
    rule = rules(replica.fake)["gpu-placement-ok-gpu-1"]
    assert rule["spec"]["deviceSelector"] == {"driver": "gpu.nvidia.com", "pool": "ok", "device": "gpu-1"}
    assert taint(rule) == ("gpu-placement.io/unverified", "XIDError", "NoSchedule")
    replica.view.set_telemetry({})
    replica.taints.step()
    assert "gpu-placement-ok-gpu-1" not in rules(replica.fake)


def test_where_no_device_taint_rule_is_served_nothing_is_written(replicas: Callable[..., Replica],
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    replica = replicas(taint_rules=None)
    replica.taints.step()
    assert gauge(metrics.DRA_TAINT_SERVED) == 0
    assert not [r for r in replica.fake.requests_log if r.method != "GET" and "devicetaintrules" in r.path]
    assert "only the extender keeps DRA pods" in caplog.text


@pytest.mark.parametrize("version", ["v1beta2", "v1alpha3"])
def test_older_servers_get_their_own_version(replicas: Callable[..., Replica], version: str) -> None:
    replica = replicas(taint_rules=version)
    replica.taints.step()
    assert sorted(r["metadata"]["name"] for r in replica.fake.list("DeviceTaintRule")) == [
        "gpu-placement-unvalidated", "gpu-placement-upgrading"]
    assert replica.fake.count("create", RULES.format(version)) == 2


def test_one_replica_writes(replicas: Callable[..., Replica]) -> None:
    # A lease that outlasts a slow machine between the two steps: with QUICK's 1 s, a first step and a
    # second one more than a second apart under load let the second replica take the lease.
    held = replace(QUICK, lease_seconds=30)
    first = replicas(settings=held)
    second = replicas(fake=first.fake, identity="replica-b", settings=held)
    first.taints.step()
    second.taints.step()
    assert first.taints.leading and not second.taints.leading
    assert first.taints.writes == 2 and second.taints.writes == 0


def test_writes_are_paced(replicas: Callable[..., Replica]) -> None:
    paced = TaintSettings(lease_name="dra-lock", lease_seconds=30, renew_seconds=10, resync_seconds=3600,
                          settle_seconds=0.0, writes_per_second=10, burst=1)
    replica = replicas(settings=paced)
    fake = replica.fake
    for node in ("unvalidated-2", "unvalidated-3"):
        fake.add(dra_node(node))
        fake.add(resource_slice(node, 1))
    wait_for(lambda: replica.view.nodes.get("unvalidated-3") and replica.view.nodes["unvalidated-3"].dra_devices,
             what="the new nodes")
    start = time.monotonic()
    replica.taints.step()
    assert replica.taints.writes == 4
    assert time.monotonic() - start >= 0.3 * 0.9  # a burst of 1, then 10 a second: three waits of 0.1 s


def test_rules_edited_by_hand_are_put_back_at_the_resync(replicas: Callable[..., Replica]) -> None:
    replica = replicas()
    fake = replica.fake
    replica.taints.step()
    edited = copy.deepcopy(fake.get("DeviceTaintRule", "gpu-placement-unvalidated"))
    edited["spec"]["taint"]["effect"] = "None"
    fake.update(edited)
    fake.delete("DeviceTaintRule", "gpu-placement-upgrading")
    replica.taints._next_resync = 0.0  # the resync is due
    replica.taints.step()
    assert {name: taint(rule)[2] for name, rule in rules(fake).items()} == {
        "gpu-placement-unvalidated": "NoSchedule", "gpu-placement-upgrading": "NoSchedule"}


def test_a_lease_in_a_namespace_that_does_not_exist_is_an_error_not_a_lost_race(
        replicas: Callable[..., Replica]) -> None:
    replica = replicas()
    lost = TaintController(replica.api, replica.view, replica.config, "no-such-namespace", "replica-b",
                           replace(QUICK, lease_name="missing-ns-dra"))
    stamp = gauge(metrics.DRA_TAINT_SUCCESS, "missing-ns-dra")
    time.sleep(0.01)
    lost.step()
    assert not lost.leading and gauge(metrics.DRA_TAINT_LEADING, "missing-ns-dra") == 0
    assert lost.last_error == ('HTTP 404 NotFound: Lease no-such-namespace/missing-ns-dra: namespaces '
                               '"no-such-namespace" not found')
    assert gauge(metrics.DRA_TAINT_SUCCESS, "missing-ns-dra") == stamp


def test_a_validator_already_waiting_when_the_process_starts_keeps_its_node_untainted(tmp_path: Any) -> None:
    """After a restart (serve's own order: core_from_cluster starts the list+watch, the servers and
    certificates come up, then _start_dra_taints), a DRA validator pod that was pending before the
    controller existed still holds its node's rule back: a taint would lock it out for good."""
    from gpu_placement.app.assembly import _kinds, _start_dra_taints, core_from_cluster
    from gpu_placement.app.serve_options import ServeOptions

    fake = FakeApiServer(dra="v1", taint_rules="v1").start()
    core = None
    try:
        fake.load([namespace("gpu-placement"), namespace("gpu-operator"), *device_classes(), dra_node("gpu-new"),
                   resource_slice("gpu-new", 2), waiting_validator("gpu-new")])
        config = Config()
        options = ServeOptions(components=("webhook",), namespace="gpu-placement")
        core = core_from_cluster(config, str(fake.write_kubeconfig(tmp_path / "kubeconfig")), _kinds(options, config))
        wait_for(lambda: {"pods", "nodes", "resourceslices"} <= core.view.listed, what="the first lists")
        _start_dra_taints(options, core)
        controller = core.stoppers[-1].__self__  # type: ignore[attr-defined]
        assert isinstance(controller, TaintController)
        wait_for(lambda: controller.holds == {"gpu-new"}, what="the node's rule held back for its validator")
        assert rules(fake) == {}
        fake.bind("gpu-operator", "nvidia-dra-validator-gpu-new", "gpu-new")  # it has its device now
        wait_for(lambda: "gpu-placement-gpu-new" in rules(fake), what="the rule once the validator is bound")
        assert controller.holds == set()
    finally:
        if core is not None:
            core.stop()
        fake.stop()


def writes(action: str, outcome: str) -> float:
    return gauge(metrics.DRA_TAINT_WRITES, action, outcome)


def test_untaint_and_retaint_go_through_at_once_although_kube_controller_manager_wrote_the_status(
        replicas: Callable[..., Replica]) -> None:
    """kube-controller-manager writes every rule's status as soon as it appears (device_taint_eviction.go
    maybeUpdateRuleStatus), so the resourceVersion the controller was answered with is stale: a delete
    by uid alone, and an update made again on the rule as it is now, in the same pass."""
    replica = replicas(device_taint_eviction=True)
    fake = replica.fake
    replica.taints.step()
    assert sorted(rules(fake)) == ["gpu-placement-unvalidated", "gpu-placement-upgrading"]
    assert rules(fake)["gpu-placement-unvalidated"]["status"]["conditions"][0]["reason"] == "OtherEffect"
    conflicts = writes("delete", "conflict")
    fake.update(validator_pod("unvalidated", True))  # verified again: its rule must go
    fake.patch_labels("Node", "upgrading", {"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"})
    fake.update(validator_pod("upgrading", False))  # upgrade done, not validated yet: a new reason
    wait_for(lambda: replica.view.validator_state("unvalidated").ready and not replica.view.validator_state(
        "upgrading").ready and replica.view.nodes["upgrading"].upgrade_state == "upgrade-done", what="the changes")
    replica.taints.step()  # one pass
    assert sorted(rules(fake)) == ["gpu-placement-upgrading"]
    assert taint(rules(fake)["gpu-placement-upgrading"])[1] == "NotValidated"
    assert replica.taints.last_error is None and not replica.taints.failures.errors
    assert writes("delete", "conflict") == conflicts


def test_one_rule_refused_is_retried_later_and_the_rest_of_the_pass_goes_on(
        replicas: Callable[..., Replica], caplog: pytest.LogCaptureFixture) -> None:
    replica = replicas(settings=replace(QUICK, lease_name="unit-dra", lease_seconds=30))
    fake = replica.fake
    replica.taints.step()
    stamp = gauge(metrics.DRA_TAINT_SUCCESS, "unit-dra")
    refused = 'admission webhook "policy.example.com" denied the request: rules are frozen'
    path = RULES.format("v1") + "/gpu-placement-unvalidated"
    fake.fail_next(100, 400, message=refused, reason="BadRequest", method="DELETE", path=path)
    fake.update(validator_pod("unvalidated", True))
    fake.patch_labels("Node", "upgrading", {"nvidia.com/gpu-driver-upgrade-state": "upgrade-done"})
    wait_for(lambda: replica.view.validator_state("unvalidated").ready and
             replica.view.nodes["upgrading"].upgrade_state == "upgrade-done", what="both verified")
    replica.taints.step()
    assert sorted(rules(fake)) == ["gpu-placement-unvalidated"]  # upgrading's rule went all the same
    assert replica.taints.failures.errors == {"gpu-placement-unvalidated": f"HTTP 400 BadRequest: {refused}"}
    assert replica.taints.last_error == f"HTTP 400 BadRequest: {refused}"
    assert gauge(metrics.DRA_TAINT_FAILING, "unit-dra") == 1
    assert gauge(metrics.DRA_TAINT_SUCCESS, "unit-dra") == stamp
    replica.taints.step()  # the next turn tries it again
    assert fake.count("delete", path) == 2 and caplog.text.count(refused) == 1
    fake.stop_failing()
    replica.taints.step()
    assert rules(fake) == {} and replica.taints.last_error is None
    assert gauge(metrics.DRA_TAINT_FAILING, "unit-dra") == 0
    assert gauge(metrics.DRA_TAINT_SUCCESS, "unit-dra") > stamp


LONG = "gpu-a100-r12u34.training-cluster-prod.us-east-1.datacenter.example.com"  # 70 characters


def test_a_node_name_longer_than_a_label_value_gets_its_rule_and_loses_it(replicas: Callable[..., Replica]) -> None:
    """A node name may have 253 characters, a label value 63 (kube-apiserver: 422). The name goes whole
    into the annotation and, shortened with a hash, into the label, which still selects the rule."""
    from gpu_placement.kube.api import request

    replica = replicas()
    fake = replica.fake
    for name, ready in (("aaa-fixed", False), (LONG, False), ("zz-broken", False)):
        fake.add(dra_node(name))
        fake.add(resource_slice(name, 2))
        fake.add(validator_pod(name, ready))
    wait_for(lambda: replica.view.nodes.get("zz-broken") and replica.view.nodes["zz-broken"].dra_devices,
             what="the new nodes")
    replica.taints.step()
    assert {"gpu-placement-aaa-fixed", f"gpu-placement-{LONG}", "gpu-placement-zz-broken"} <= set(rules(fake))
    assert replica.taints.last_error is None
    from gpu_placement.controllers.dra_taints import node_label_value

    meta = rules(fake)[f"gpu-placement-{LONG}"]["metadata"]
    label = meta["labels"]["gpu-placement.io/node"]
    assert len(label) <= 63 and label == node_label_value(LONG) and label.startswith("gpu-a100-r12u34.")
    assert meta["annotations"]["gpu-placement.io/node"] == LONG
    selected = request(replica.api, "GET", RULES.format("v1"),
                       query=[("labelSelector", f"gpu-placement.io/node={label}")], timeout=(5, 5))
    assert [i["metadata"]["name"] for i in orjson.loads(selected.data)["items"]] == [f"gpu-placement-{LONG}"]
    fake.update(validator_pod("aaa-fixed", True))
    fake.update(validator_pod(LONG, True))
    wait_for(lambda: replica.view.validator_state(LONG).ready and replica.view.validator_state("aaa-fixed").ready,
             what="both verified")
    replica.taints.step()
    assert "gpu-placement-aaa-fixed" not in rules(fake) and f"gpu-placement-{LONG}" not in rules(fake)
    assert "gpu-placement-zz-broken" in rules(fake)
