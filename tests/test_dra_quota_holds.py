"""Claim pods of a `dra` namespace hold their devices between /validate and the moment their claims
exist, as device-plugin pods hold their GPUs until the view shows them (webhook/quota.py).

A hold is told, never counted against the next pod (any caller that reaches the port can make one):
two pods created at once both pass /validate, the second with a warning, and the API server's quota
refuses the one that does not fit, at its create by its stand-ins (gpu_placement/decide/dra_quota.py). What the
view shows exists (the pod's stand-ins, its claims) refuses. Over the real HTTPS app."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.dra import quota_namespace, templates_for
from tests.support.webhook import Webhook, user_pod

pytestmark = pytest.mark.timeout(30)
Obj = dict[str, Any]
KEY = "gpu.nvidia.com.deviceclass.resource.k8s.io/devices"


@pytest.fixture
def team(hook: Webhook) -> Iterator[Webhook]:
    with quota_namespace(hook):
        yield hook


def converted(hook: Webhook, name: str, gpus: int) -> Obj:
    """The pod /mutate makes of `nvidia.com/gpu: <gpus>`: claims from the namespace's template, one a device."""
    pod, _, _ = hook.mutate(user_pod("team", name, gpus={"nvidia.com/gpu": gpus}), "team")
    assert len(pod["spec"]["resourceClaims"]) == gpus
    return pod


def over(in_use: int, asks: int, what: str = "nvidia.com/gpu") -> str:
    """The refusal: named by the level the annotation gives (the stand-ins the API server charges at the pod's
    create), or by the devices key where only that one is over (claims written by hand)."""
    verb = "is" if in_use == 1 else "are"
    return (f"namespace team may use 3 {what} (gpu-placement.io/quota); {in_use} {verb} in use and this pod "
            f"asks {asks} more: lower the request or raise the quota on the namespace")


def told(answer: Obj, in_use: int, recent: int, asks: int) -> None:
    """Let in, with the holds told: `recent` more admitted moments ago may yet be created."""
    assert answer["allowed"] is True, answer
    verb = "is" if in_use == 1 else "are"
    assert answer["warnings"][0].startswith(
        f"namespace team may use 3 nvidia.com/gpu (gpu-placement.io/quota); {in_use} {verb} in use, {recent} more "
        f"admitted moments ago may yet be created, and this pod asks {asks} more: "), answer


def make_claims(hook: Webhook, pod: Obj, count: int) -> None:
    """kube-controller-manager's resourceclaim controller: the first `count` claims of the pod, made from its
    templates and owned by it, seen by the view's watch."""
    templates = {t["metadata"]["name"]: t for t in templates_for(hook, "team")}
    meta = pod["metadata"]
    for entry in pod["spec"]["resourceClaims"][:count]:
        claim = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                 "metadata": {"name": f"{meta['name']}-{entry['name']}-x7k2p", "namespace": "team",
                              "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                                   "uid": meta["uid"], "controller": True,
                                                   "blockOwnerDeletion": True}]},
                 "spec": copy.deepcopy(templates[entry["resourceClaimTemplateName"]]["spec"]["spec"])}
        with hook.view.lock:
            hook.ingest.event(hook.view, "resourceclaims", "ADDED", claim)


def holds(hook: Webhook) -> int:
    with hook.view.lock:
        return len(hook.app.state.admission.reservations)


def test_two_claim_pods_admitted_back_to_back_the_second_is_told(team: Webhook) -> None:
    first, second = converted(team, "first", 2), converted(team, "second", 2)
    answer = team.validate(first, "team")
    assert answer["allowed"] is True and "warnings" not in answer
    told(team.validate(second, "team"), 0, 2, 2)  # nothing is charged yet: the claims come after the pod
    told(team.validate(converted(team, "small", 1), "team"), 0, 4, 1)  # both held now
    # Each carries its stand-ins: the API server's quota refuses at its create the one that does not fit.
    assert first["spec"]["containers"][0]["resources"]["limits"]["gpu-placement.io/gpu"] == "2"


def test_a_dry_run_holds_nothing_and_the_real_create_does(team: Webhook) -> None:
    first, second = converted(team, "first", 2), converted(team, "second", 2)
    assert team.validate(first, "team", dry_run=True)["allowed"] is True
    assert holds(team) == 0
    assert team.validate(second, "team", dry_run=True)["allowed"] is True
    assert "warnings" not in team.validate(first, "team")
    told(team.validate(second, "team"), 0, 2, 2)


def test_the_same_pod_retried_is_not_counted_against_itself(team: Webhook) -> None:
    """The API server calls again when a call timed out: the earlier call's hold is the same pod's."""
    first = converted(team, "first", 3)
    assert team.validate(first, "team")["allowed"] is True
    assert "warnings" not in team.validate(first, "team")  # 3 held by itself, not 3 + 3
    assert holds(team) == 1
    told(team.validate(converted(team, "second", 1), "team"), 0, 3, 1)
    assert holds(team) == 2


def test_a_retried_pod_refused_after_all_gives_its_hold_back(team: Webhook) -> None:
    first = converted(team, "first", 2)
    assert team.validate(first, "team")["allowed"] is True
    other = team.create(converted(team, "other", 2), "team")
    make_claims(team, other, 2)  # claims made by hand meanwhile: 2 of 3 devices charged
    assert team.validate(first, "team")["status"]["message"] == over(2, 2)  # the retry: that create is not happening
    assert holds(team) == 0
    assert team.validate(converted(team, "small", 1), "team")["allowed"] is True


def test_the_hold_lasts_until_the_claims_exist_and_is_then_counted_once(team: Webhook) -> None:
    first = converted(team, "first", 2)
    assert team.validate(first, "team")["allowed"] is True
    told(team.validate(converted(team, "second", 2), "team"), 0, 2, 2)
    with team.view.lock:
        team.app.state.admission.reservations.release("team", "team/second", "")  # never created
    stored = team.create(first, "team")  # the view shows the pod, and counts its stand-ins, before any claim
    assert team.validate(converted(team, "second", 2), "team")["status"]["message"] == over(2, 2)
    make_claims(team, stored, 1)  # one claim made, one to come: its devices counted 1 + 1, not 1 + 2
    assert team.validate(converted(team, "second", 2), "team")["status"]["message"] == over(2, 2)
    with team.view.lock:
        assert team.app.state.admission.reservations.pending("team") == {KEY: 1, "requests.nvidia.com/gpu": 1}
    make_claims(team, stored, 2)
    assert holds(team) == 1  # settled on the next look: its devices count in the namespace's claims now
    assert team.validate(converted(team, "second", 2), "team")["status"]["message"] == over(2, 2)
    assert holds(team) == 0
    assert team.validate(converted(team, "small", 1), "team")["allowed"] is True


def test_a_seen_pod_waiting_for_its_claims_needs_no_list_of_pods(team: Webhook, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    """Once the view has shown the pod, the view says when it goes: the hold checker (webhook/holds.py,
    which lists a namespace's pods for holds overdue) has nothing to ask about it."""
    reservations = team.app.state.admission.reservations
    monkeypatch.setattr(reservations, "listed", True)  # as with an API server: holds settled by lists, not time
    first = converted(team, "first", 2)
    assert team.validate(first, "team")["allowed"] is True
    with team.view.lock:
        assert reservations.overdue(team.clock[0] + 3600) == ["team"]  # not seen: a list settles it when due
    team.create(first, "team")
    assert team.validate(converted(team, "second", 2), "team")["allowed"] is False
    with team.view.lock:
        assert reservations.overdue(team.clock[0] + 3600) == []
        assert reservations.settle("team", team.clock[0] + 3600, {}) == 0  # the view, not a list, ends it
        # Its stand-ins count in the view's pods now; its claims' devices (and requests.nvidia.com/gpu, which
        # DRAExtendedResource charges them too) are still to come.
        assert reservations.pending("team") == {KEY: 2, "requests.nvidia.com/gpu": 2}


def test_after_the_pod_is_deleted_its_hold_is_gone(team: Webhook) -> None:
    first = converted(team, "first", 2)
    assert team.validate(first, "team")["allowed"] is True
    stored = team.create(first, "team")
    assert team.validate(converted(team, "second", 3), "team")["allowed"] is False
    with team.view.lock:
        team.ingest.event(team.view, "pods", "DELETED", stored)  # before kube-controller-manager made its claims
    assert team.validate(converted(team, "second", 3), "team")["allowed"] is True
    assert holds(team) == 1  # second's own


def test_a_pod_that_finished_before_its_claims_were_made_holds_nothing(team: Webhook) -> None:
    first = converted(team, "first", 2)
    assert team.validate(first, "team")["allowed"] is True
    stored = team.create(first, "team")
    stored["status"] = {"phase": "Failed", "reason": "UnexpectedAdmissionError"}
    with team.view.lock:
        team.ingest.event(team.view, "pods", "MODIFIED", stored)
    assert team.validate(converted(team, "second", 3), "team")["allowed"] is True
