"""Where the cluster's outcome totals live (gpu_placement/outcomes/store.py): a large cluster's totals fit the
outcomes Lease, which kube-apiserver caps at 256 KiB of annotations; past MAX_SERIES new series go to the
overflow series, past LIMIT bytes the smallest are folded, and no series already exported is reset."""

from __future__ import annotations

import base64
import gzip
from collections.abc import Iterator

import orjson
import pytest

from gpu_placement.base.config import Config
from gpu_placement.outcomes import store
from gpu_placement.outcomes.counter import (
    STATE_ANNOTATION,
    TOTALS_ANNOTATION,
    WATERMARK_ANNOTATION,
    CounterSettings,
    OutcomeCounter,
)
from gpu_placement.outcomes.record import STARTS, Emission, Outcomes
from gpu_placement.outcomes.store import OTHER, pack, unpack
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from tests.fakeapi import FakeApiServer
from tests.outcome_replay import START, Clock, Held, held, large_cluster

SETTINGS = CounterSettings(lease_name="gpu-placement-outcomes")


def outcomes(config: Config, events: list[Emission] = ()) -> Outcomes:  # type: ignore[assignment]
    view = ClusterView(config)
    for kind in ("nodes", "pods"):
        Ingest(config).replace(view, kind, [])
    made = Outcomes(view, config).start()
    made.emit(events)
    return made


def read_back(config: Config, totals: dict[str, object]) -> Held:
    fresh = outcomes(config)
    fresh.load(totals)
    return held(fresh)


def sums(found: Held) -> tuple[float, dict[str, tuple[tuple[int, ...], int]]]:
    """Every launch, and every observation by bucket, whatever series they are under."""
    starts, histograms = found
    return sum(starts.values()), {
        metric: (tuple(map(sum, zip(*(b for b, _, _ in table.values()), strict=True))),
                 sum(count for _, _, count in table.values()))
        for metric, table in histograms.items() if table}


def test_a_large_clusters_totals_fit_with_every_series_as_it_is() -> None:
    """20 pools, 8 products, every cause and reason: 280 KB as plain JSON (over the 262,144 bytes
    kube-apiserver allows for all of an object's annotations), 70.5 KB as the state."""
    config, events = large_cluster()
    counted = outcomes(config, events)
    totals = counted.totals()
    assert len(orjson.dumps(totals)) > 262_144
    packed = pack(totals, None, {"uid-a": START})
    assert packed.folded == 0 and len(packed.text) < 72 * 1024
    state = unpack(packed.text)
    assert state["deferred"] == {"uid-a": START} and state["cap"] is None
    assert read_back(config, state) == held(counted)
    assert state == {**packed.totals, "deferred": {"uid-a": START}}
    # Readable with the usual tools: base64 -d | gunzip gives JSON.
    assert orjson.loads(gzip.decompress(base64.b64decode(packed.text)))["version"] == 2


def test_past_max_series_new_series_are_counted_under_other(monkeypatch: pytest.MonkeyPatch) -> None:
    """With room for 300 series, the first write keeps 300 by their labels and counts the others under
    pool and product _other; a later write keeps those 300 growing and folds what is new again."""
    monkeypatch.setattr(store, "MAX_SERIES", 300)
    config, events = large_cluster()
    first = pack(outcomes(config, events[: len(events) // 2]).totals(), None, {})
    own = [row for row in first.totals["starts"] if OTHER not in row] + [
        row for metric in first.totals["histograms"].values() for row in metric["series"] if OTHER not in row]
    assert len(own) == 300 and first.folded == 0
    before = read_back(config, first.totals)
    assert sums(before) == sums(held(outcomes(config, events[: len(events) // 2])))
    leader = outcomes(config)
    leader.load(first.totals)
    leader.emit(events[len(events) // 2:])
    second = pack(leader.totals(), first.totals, {})
    after = read_back(config, second.totals)
    assert sums(after) == sums(held(outcomes(config, events)))
    def own(found: Held) -> set[tuple[str, ...]]:
        return {(metric, *labels) for metric, table in (("starts", found[0]), *found[1].items())
                for labels in table if OTHER not in labels}

    assert own(after) == own(before) and len(own(before)) == 300  # the same series kept by their labels
    assert all(after[0][labels] >= value for labels, value in before[0].items())  # and none went down
    for metric, table in before[1].items():
        assert all(after[1][metric][labels][2] >= count for labels, (_, _, count) in table.items())


def test_past_the_byte_bound_the_smallest_series_fold_and_no_new_one_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A state over LIMIT (here 20 KiB) folds its series with the fewest observations until it fits,
    keeps the cap it reached, and from then on counts every new label set under _other."""
    monkeypatch.setattr(store, "LIMIT", 20 * 1024)
    config, events = large_cluster()
    packed = pack(outcomes(config, events).totals(), None, {})
    assert packed.folded > 0 and len(packed.text) <= 20 * 1024
    assert packed.totals["cap"] is not None and unpack(packed.text)["cap"] == packed.totals["cap"]
    assert sums(read_back(config, packed.totals)) == sums(held(outcomes(config, events)))
    leader = outcomes(config)
    leader.load(packed.totals)
    leader.emit([Emission(STARTS, ("started", "none", "a-new-pool", "true"), 3.0, 0.0, "")])
    again = pack(leader.totals(), packed.totals, {})
    assert ["started", "none", "a-new-pool", "true", 3.0] not in again.totals["starts"]
    other = ("started", "none", OTHER, "true")
    assert read_back(config, again.totals)[0][other] == read_back(config, packed.totals)[0].get(other, 0.0) + 3


def test_a_grown_cluster_stays_within_the_bound() -> None:
    """60 pools, 16 products: 13,260 series. At most MAX_SERIES by their labels, the state under LIMIT,
    every launch and observation counted."""
    config, events = large_cluster(60, 16)
    packed = pack(outcomes(config, events).totals(), None, {f"uid-{i:04d}": START + i for i in range(1000)})
    assert len(packed.text) <= store.LIMIT
    own = sum(1 for row in packed.totals["starts"] if OTHER not in row) + sum(
        1 for metric in packed.totals["histograms"].values() for row in metric["series"] if OTHER not in row)
    assert own <= store.MAX_SERIES
    assert sums(read_back(config, packed.totals)) == sums(held(outcomes(config, events)))


@pytest.mark.parametrize("text", ["not base64!", base64.b64encode(b"not gzip").decode(),
                                  base64.b64encode(gzip.compress(b'{"version": 1}')).decode(),
                                  base64.b64encode(gzip.compress(b"[" * 20_000_000)).decode()])
def test_a_state_this_code_did_not_write_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        unpack(text)


@pytest.fixture
def lease(fake_api: FakeApiServer) -> Iterator[FakeApiServer]:
    fake_api.add({"kind": "Namespace", "metadata": {"name": "gpu-placement"}})
    yield fake_api


def counter(fake: FakeApiServer, counted: Outcomes, identity: str, clock: Clock) -> OutcomeCounter:
    return OutcomeCounter(fake.api_client(), counted, "gpu-placement", identity, SETTINGS, clock)


def test_the_counter_writes_a_large_clusters_totals_and_a_standby_reads_them(lease: FakeApiServer) -> None:
    """Through the real counter to an API server that refuses more than 256 KiB of annotations (as
    kube-apiserver does): written (it was a 422 before, and counting stopped), and read back whole."""
    config, events = large_cluster()
    clock = Clock(START)
    leader = outcomes(config, events)
    writer = counter(lease, leader, "a", clock)
    writer.step()
    assert writer.last_error is None and writer.leading
    annotations = lease.get("Lease", SETTINGS.lease_name, "gpu-placement")["metadata"]["annotations"]
    assert {WATERMARK_ANNOTATION, STATE_ANNOTATION} <= annotations.keys()
    standby = outcomes(config)
    counter(lease, standby, "b", clock).step()
    assert held(standby) == held(leader)


def test_totals_an_earlier_version_wrote_are_read_and_moved_into_the_state(lease: FakeApiServer) -> None:
    """A Lease as the version before the state wrote it (the watermark, the totals as plain JSON): a
    standby exports those totals; the leader's first write moves them into the state, counted on."""
    config, events = large_cluster(4, 2)
    earlier = outcomes(config, events)
    lease.add({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
               "metadata": {"name": SETTINGS.lease_name, "namespace": "gpu-placement", "annotations": {
                   WATERMARK_ANNOTATION: "2026-03-02T00:00:00.000000Z",
                   TOTALS_ANNOTATION: orjson.dumps(earlier.totals()).decode()}},
               "spec": {"holderIdentity": "old", "leaseDurationSeconds": 30,
                        "renewTime": "2026-03-02T00:00:00.000000Z"}})
    clock = Clock(START + 60)  # old's Lease still held: a standby
    standby = outcomes(config)
    counter(lease, standby, "b", clock).step()
    assert held(standby) == held(earlier)
    clock.now = START + 600  # old's Lease ran out: the new version leads
    leader = outcomes(config)
    writer = counter(lease, leader, "a", clock)
    writer.step()
    assert writer.leading and writer.last_error is None
    annotations = lease.get("Lease", SETTINGS.lease_name, "gpu-placement")["metadata"]["annotations"]
    assert TOTALS_ANNOTATION not in annotations and STATE_ANNOTATION in annotations
    assert read_back(config, unpack(annotations[STATE_ANNOTATION])) == held(earlier)
