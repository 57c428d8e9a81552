"""`explain pod/NAME` on a cluster adopting gpu-placement: a pod of a namespace not opted in, or created
before a ready replica wrote the webhooks into the configurations the chart installs empty, is said to
have gone around gpu-placement for that reason (not "while no replica answered")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from gpu_placement.app.cli import main
from gpu_placement.base.config import parse_config
from gpu_placement.decide.bypass import Webhook, bypass_reasons
from gpu_placement.samples.cluster import demo_objects, make_pod
from tests.fakeapi import FakeApiServer
from tests.support.explain import GPU_POD, HOOK, _created

pytestmark = pytest.mark.timeout(60)

OPT_IN = parse_config({"namespaceSelection": "optIn"})
POD = _created(GPU_POD, "2026-02-01T00:00:00Z")


@pytest.mark.parametrize("config, labels, says", [
    (OPT_IN, {}, "namespace research is not opted in (namespaceSelection optIn: it has no label "
                 "gpu-placement.io/enabled=true): the webhook never sees its pods; kubectl label namespace research "
                 "gpu-placement.io/enabled=true opts it in, for pods created from then on"),
    (parse_config({}), {"gpu-placement.io/enabled": "false"},
     "namespace research is opted out (gpu-placement.io/enabled=false): the webhook never sees its pods"),
])
def test_a_namespace_not_selected(config: Any, labels: dict[str, str], says: str) -> None:
    assert bypass_reasons(POD, config, True, HOOK, labels)[0] == says
    assert "not opted in" not in bypass_reasons(POD, OPT_IN, True, HOOK, {"gpu-placement.io/enabled": "true"})[0]


def test_before_a_ready_replica_wrote_the_webhooks() -> None:
    empty = Webhook("gpu-placement", "2026-01-10T00:00:00Z", None, webhooks=0)
    assert bypass_reasons(POD, OPT_IN, True, empty, {"gpu-placement.io/enabled": "true"})[0].endswith(
        "MutatingWebhookConfiguration gpu-placement has no webhooks yet: no webhook replica has been ready since it "
        "was installed (a replica writes them once it is)")
    late = Webhook("gpu-placement", "2026-01-10T00:00:00Z", "Ignore", webhooks=1, registered="2026-02-02T00:00:00Z")
    assert bypass_reasons(POD, OPT_IN, True, late, None)[0].endswith(
        "the pod was created at 2026-02-01T00:00:00Z, before a webhook replica wrote the webhooks into "
        "MutatingWebhookConfiguration gpu-placement (2026-02-02T00:00:00Z)")


def test_explain_of_a_live_pod_in_a_namespace_not_opted_in(fake_api: FakeApiServer, tmp_path: Path,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    config = {"apiVersion": "v1", "kind": "ConfigMap",
              "metadata": {"name": "gpu-placement-config", "namespace": "gpu-placement",
                           "labels": {"app.kubernetes.io/part-of": "gpu-placement"}},
              "data": {"config.yaml": "namespaceSelection: optIn\n"}}
    fake_api.add({"kind": "Namespace", "metadata": {"name": "gpu-placement"}})
    fake_api.load([*demo_objects(), POD, config])
    fake_api.add({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
                  "metadata": {"name": "gpu-placement", "labels": {"app.kubernetes.io/part-of": "gpu-placement"},
                               "annotations": {"gpu-placement.io/webhooks-registered": "2026-01-11T00:00:00Z by x"}},
                  "webhooks": [{"name": "mutate.gpu-placement.io", "failurePolicy": "Ignore",
                                "admissionReviewVersions": ["v1"], "sideEffects": "None",
                                "clientConfig": {"url": "https://example.invalid/mutate"}}]})
    kubeconfig = fake_api.write_kubeconfig(tmp_path / "kubeconfig")
    assert main(["explain", "pod/p", "-n", "research", "--kubeconfig", str(kubeconfig)]) == 0
    out = capsys.readouterr().out
    assert "  bypassed gpu-placement: namespace research is not opted in (namespaceSelection optIn" in out, out
    cpu = make_pod("research", "cpu")
    assert bypass_reasons(cpu, OPT_IN, False, HOOK, {}) == []
