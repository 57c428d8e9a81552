"""Which pods ask kube-scheduler's own scoring for something (`soft_placement`): those get a tier of every
node at the best 0..10 score, so that PodTopologySpread, NodeAffinity and InterPodAffinity can act."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_placement.facts.pods import soft_placement

SPREAD = {"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone", "labelSelector": {"matchLabels": {"app": "x"}}}
TERM = {"weight": 10, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
POD_TERM = {"weight": 10, "podAffinityTerm": {"topologyKey": "kubernetes.io/hostname",
                                              "labelSelector": {"matchLabels": {"app": "x"}}}}


@pytest.mark.parametrize(("spec", "soft"), [
    ({}, False),
    ({"topologySpreadConstraints": [{**SPREAD, "whenUnsatisfiable": "DoNotSchedule"}]}, False),
    ({"topologySpreadConstraints": [{**SPREAD, "whenUnsatisfiable": "DoNotSchedule"},
                                    {**SPREAD, "whenUnsatisfiable": "ScheduleAnyway"}]}, True),
    ({"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}}},
     False),
    ({"affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [TERM]}}}, True),
    ({"affinity": {"podAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [POD_TERM]}}}, True),
    ({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [POD_TERM]}}}, True),
    ({"affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}}}, False),
    ({"affinity": "garbage", "topologySpreadConstraints": ["garbage"]}, False),
])
def test_soft_placement(spec: dict[str, Any], soft: bool) -> None:
    assert soft_placement(spec) is soft
