"""kube-scheduler binds asynchronously, so a burst of pods is a burst of concurrent /bind calls. Each
Binding POST goes out over a bounded pool of kept connections (gpu_placement/kube/aio.py): a burst
opens at most the pool's connections, and the next burst reuses them (no TLS handshake per bind, as
the threadpool over the kubernetes client's 10-connection urllib3 pool did past its tenth call)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from kubernetes.client import ApiClient

from extender.binding import ApiBinder
from gpu_placement.samples.cluster import make_node, make_pod
from tests.fakeapi import FakeApiServer

pytestmark = pytest.mark.timeout(60)

BURST, POOL = 60, 8


@pytest.fixture
def api(fake_api: FakeApiServer) -> Iterator[ApiClient]:
    fake_api.load([make_node("gpu-1", "h100x8"),
                   *(make_pod("default", f"p{i}") for i in range(2 * BURST))])
    client = fake_api.api_client()
    yield client
    client.close()


def _connections(fake: FakeApiServer, names: set[str]) -> set[tuple[str, int]]:
    return {r.client for r in fake.requests_log
            if r.verb == "create" and r.client and r.path.split("/")[-2] in names}


def test_bursts_of_binds_share_a_bounded_pool_of_kept_connections(fake_api: FakeApiServer, api: ApiClient) -> None:
    binder = ApiBinder(api, connections=POOL)

    async def bursts() -> None:
        try:
            for burst in range(2):
                await asyncio.gather(*(binder.bind("default", f"p{burst * BURST + i}", "", "gpu-1")
                                       for i in range(BURST)))
        finally:
            await binder.aclose()

    asyncio.run(bursts())
    assert all((fake_api.get("Pod", f"p{i}", "default") or {})["spec"].get("nodeName") == "gpu-1"
               for i in range(2 * BURST))
    first = _connections(fake_api, {f"p{i}" for i in range(BURST)})
    second = _connections(fake_api, {f"p{i}" for i in range(BURST, 2 * BURST)})
    assert 1 <= len(first) <= POOL, f"{len(first)} connections for {BURST} binds"
    assert second <= first, "the second burst opened new connections instead of reusing the kept ones"
