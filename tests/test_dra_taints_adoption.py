"""DeviceTaintRules and adoption: audit mode's rules only report (effect None: nothing a pod runs with
changes), and every rule is owned by the release's ValidatingWebhookConfiguration, so `helm
uninstall` (the garbage collector, which the fake API server lacks) leaves no device taint behind;
while that owner is missing nothing is written, and when it comes back everything is, at once."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from gpu_placement.base.config import parse_config
from tests.support.dra_taints import QUICK, Replica, rules, taint

OWNED = dataclasses.replace(QUICK, owner="gpu-placement")


def test_audit_mode_rules_only_report(replicas: Callable[..., Replica]) -> None:
    replica = replicas(parse_config({"mode": "audit", "dra": {"taintEffect": "NoExecute"}}))
    replica.taints.step()
    found = rules(replica.fake)
    assert found and {taint(r)[2] for r in found.values()} == {"None"}


def test_rules_are_owned_by_the_validating_webhook_configuration(replicas: Callable[..., Replica]) -> None:
    replica = replicas(settings=OWNED)
    replica.taints.step()
    assert rules(replica.fake) == {}, "no owner yet: nothing written the uninstall would miss"
    vwc = replica.fake.add({"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "gpu-placement"}})
    replica.taints.step()
    owner = [{"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
              "name": "gpu-placement", "uid": vwc["metadata"]["uid"]}]
    found = rules(replica.fake)
    assert found and all(r["metadata"]["ownerReferences"] == owner for r in found.values())

    # The emergency stop: the configuration deleted (the garbage collector takes the rules), then helm
    # upgrade makes it again. The rules come back owned by the new one, before the next full pass.
    replica.fake.delete("ValidatingWebhookConfiguration", "gpu-placement")
    for name in found:
        replica.fake.delete("DeviceTaintRule", name)
    replica.taints.step()
    assert rules(replica.fake) == {}
    again = replica.fake.add({"kind": "ValidatingWebhookConfiguration", "metadata": {"name": "gpu-placement"}})
    replica.taints.step()
    back = rules(replica.fake)
    assert back.keys() == found.keys()
    assert all(r["metadata"]["ownerReferences"][0]["uid"] == again["metadata"]["uid"] for r in back.values())
