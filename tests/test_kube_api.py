"""gpu_placement/kube/api.py against the fake API server: an error's class says its status, and the
GET and write helpers settle what the callers used to test by status."""

from __future__ import annotations

import pytest

from gpu_placement.kube import api as kube
from gpu_placement.kube.lease import Lease
from tests.fakeapi import FakeApiServer

NAMESPACES = "/api/v1/namespaces"


@pytest.mark.parametrize(("status", "kind"), [(403, kube.ApiForbidden), (404, kube.ApiNotFound),
                                              (409, kube.ApiConflict), (410, kube.ApiGone), (500, kube.ApiError),
                                              (429, kube.ApiError)])
def test_an_answer_raises_the_class_of_its_status(fake_api: FakeApiServer, status: int,
                                                  kind: type[kube.ApiError]) -> None:
    fake_api.fail_next(status=status, message="said by the server", method="GET")
    with pytest.raises(kube.ApiError) as raised:
        kube.get(fake_api.api_client(), f"{NAMESPACES}/default", timeout=(5, 5))
    assert type(raised.value) is kind
    assert raised.value.status == status
    assert raised.value.message == "said by the server"
    assert repr(raised.value) == (f"{kind.__name__}(status={status}, reason={raised.value.reason!r}, "
                                  "message='said by the server')")


def test_an_error_made_from_a_status_gets_its_class_too() -> None:
    """A watch stream's ERROR event carries its code in a Status body, not the status line (view/live.py)."""
    assert type(kube.ApiError.of(410, "Expired", "too old")) is kube.ApiGone
    assert type(kube.ApiError.of(422, "Invalid", "bad")) is kube.ApiError


def test_get_or_none(fake_api: FakeApiServer) -> None:
    api = fake_api.api_client()
    assert kube.get_or_none(api, f"{NAMESPACES}/nowhere", timeout=(5, 5)) is None
    found = kube.get_or_none(api, f"{NAMESPACES}/default", timeout=(5, 5))
    assert found is not None and found["metadata"]["name"] == "default"
    fake_api.fail_next(status=403, method="GET")
    with pytest.raises(kube.ApiForbidden):  # refused is not missing
        kube.get_or_none(api, f"{NAMESPACES}/default", timeout=(5, 5))


def test_write_is_false_only_on_the_settled_answer(fake_api: FakeApiServer) -> None:
    api = fake_api.api_client()
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}
    assert kube.write(api, "POST", NAMESPACES, body=body, timeout=(5, 5), settled=kube.ApiConflict)
    assert not kube.write(api, "POST", NAMESPACES, body=body, timeout=(5, 5), settled=kube.ApiConflict)
    with pytest.raises(kube.ApiConflict):  # settled only where the caller says so
        kube.write(api, "POST", NAMESPACES, body=body, timeout=(5, 5), settled=kube.ApiNotFound)
    fake_api.fail_next(status=403, method="POST")
    with pytest.raises(kube.ApiForbidden):
        kube.write(api, "POST", NAMESPACES, body=body, timeout=(5, 5), settled=kube.ApiConflict)


def test_a_lease_names_itself_in_the_error_it_raises(fake_api: FakeApiServer) -> None:
    lease = Lease(fake_api.api_client(), "nowhere", "gpu-placement-x", "pod-a", 30)
    with pytest.raises(kube.ApiNotFound) as raised:  # NamespaceLifecycle: the namespace does not exist
        lease.acquire()
    assert raised.value.message.startswith("Lease nowhere/gpu-placement-x: ")
    fake_api.fail_next(status=403, message="no RBAC", method="GET")
    with pytest.raises(kube.ApiForbidden, match="Lease nowhere/gpu-placement-x: no RBAC"):
        lease.acquire()
