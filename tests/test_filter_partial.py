"""/filter without its failure maps (`Placement.filter(maps=False)`, what the extender asks when the best tier
answers): the same passing names in the same order and the same reasons as the whole answer, on a cluster whose
verdicts change between requests; and the whole answer built later from a partial one (a replay, a patch) is
byte for byte the one the whole path gives. Also: a re-read of the fragmentation score's learned shares that finds
the same shares rescores nothing, and one that finds others rescores (a node's verdict and score follow)."""

from __future__ import annotations

import random
from typing import Any

from gpu_placement.base.config import Config, Scoring
from gpu_placement.decide import placement as placement_module
from gpu_placement.decide.placement import FilterResult, Placement
from gpu_placement.samples.cluster import make_node, make_pod, validator_pod
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest

GPU = "nvidia.com/gpu"
BASES = ["h100x8", "h100x8", "h100", "a10g-unregistered", "t4-timeslicing"]


class Cluster:
    def __init__(self, config: Config, size: int = 300) -> None:
        self.view, self.ingest = ClusterView(config), Ingest(config)
        rng = random.Random(5)
        self.names = [f"n{i:03d}" for i in range(size)]
        with self.view.lock:
            for i, name in enumerate(self.names):
                self.view.upsert_node(self.ingest.node(make_node(name, BASES[i % len(BASES)],
                                                                 ready=rng.random() > 0.1)))
                self.view.upsert_pod(self.ingest.pod(validator_pod(name, rng.random() > 0.1)))
            self.view.listed.update(("nodes", "pods", "namespaces"))
        self.placement = Placement(self.view, config, seed=3)
        self.serial = 0

    def bind(self, node: str, gpus: int) -> str:
        self.serial += 1
        record = self.ingest.pod(make_pod("ml", f"b{self.serial}", gpus={GPU: gpus}, node=node))
        self.view.upsert_pod(record)
        return record.key


def _pod(name: str) -> dict[str, Any]:
    return make_pod("ml", name, gpus={GPU: 1})


def _same(whole: FilterResult, part: FilterResult) -> None:
    assert part.passed == whole.passed
    assert list(part.reasons.items()) == list(whole.reasons.items())
    if not part.partial:
        assert (part.failed_json, part.unresolvable_json) == (whole.failed_json, whole.unresolvable_json)


def test_a_partial_answer_passes_and_counts_as_the_whole_one_and_builds_the_same_bytes_later() -> None:
    config = Config(scoring=Scoring(strategy="fragmentation", tier_size=8))
    whole, part = Cluster(config), Cluster(config)
    rng = random.Random(11)
    bound: list[tuple[str, str]] = []
    names = whole.names
    asked = names[:120]
    partial_seen = whole_after_partial = 0
    for step in range(400):
        roll = rng.random()  # what kube-scheduler asks next: another sample, the same one, a node more or fewer
        if roll < 0.4:
            start = rng.randrange(len(names))
            asked = (names[start:] + names[:start])[:120]  # most often past _PATCH_AT_MOST
        elif roll < 0.6:
            asked = asked[:-1] if len(asked) > 100 else [*asked, rng.choice(names)]
        elif roll < 0.65:
            asked = [*asked[:-1], "no-such-node"]  # a name the view lacks: an answer not kept
        maps = rng.random() < 0.25  # a whole answer now and then: a replay or a patch of a partial one
        pod = _pod(f"p{step}")
        results = []
        for cluster, with_maps in ((whole, True), (part, maps)):
            req = cluster.placement.requirements(pod)
            results.append(cluster.placement.filter(req, list(asked), with_maps))
        _same(*results)
        partial_seen += results[1].partial
        whole_after_partial += maps and not results[1].partial
        # the view changes: a node fills up or is freed (its verdict flips), or one GPU is bound
        action = rng.random()
        if action < 0.45 or not bound:
            node, gpus = rng.choice(names), rng.choice((1, 8))
            for cluster in (whole, part):
                key = cluster.bind(node, gpus)
            bound.append((key, node))
        else:
            key, _ = bound.pop(rng.randrange(len(bound)))
            for cluster in (whole, part):
                cluster.view.delete_pod(key)
    assert partial_seen > 100 and whole_after_partial > 30, (partial_seen, whole_after_partial)


def test_a_verdict_changed_after_a_partial_answer_is_in_the_whole_answer_built_from_it() -> None:
    config = Config(scoring=Scoring(strategy="binpack", tier_size=8))
    cluster = Cluster(config, size=10)
    req = cluster.placement.requirements(_pod("a"))
    first = cluster.placement.filter(req, cluster.names, maps=False)
    assert first.partial and first.passed
    full = first.passed[0]
    cluster.bind(full, 8)  # that node is full now: the same names asked, the answer patched
    again = cluster.placement.filter(req, cluster.names)
    assert not again.partial and full not in again.passed
    assert again.failed[full].startswith("InsufficientGPU"), again.failed
    cluster.view.delete_pod(f"ml/b{cluster.serial}")
    assert full in cluster.placement.filter(req, cluster.names).passed


def _learn(placement: Placement, pods: list[dict[str, Any]]) -> None:
    for pod in pods:
        placement.requirements(pod)  # observed at /filter


def test_a_reread_of_the_same_shares_rescores_nothing_and_other_shares_rescore() -> None:
    cluster = Cluster(Config(scoring=Scoring(strategy="fragmentation")), size=10)
    fragmentation = cluster.placement.fragmentation
    assert fragmentation is not None
    _learn(cluster.placement, [_pod(f"one-{i}") for i in range(3)])
    version = fragmentation.version
    assert version > 0
    _learn(cluster.placement, [_pod(f"one-{i}") for i in range(3, 200)])  # re-read at 4, 8, ... 128: the same
    assert fragmentation.version == version
    eight = [make_pod("ml", f"eight-{i}", gpus={GPU: 8}) for i in range(400)]
    _learn(cluster.placement, eight)  # 8-GPU pods arrive: other shares, curves and scores made again
    assert fragmentation.version > version


def test_the_failing_nodes_asked_iterate_as_the_intersection_with_every_failing_node_does() -> None:
    """`_known` (the failing names asked that the view knows) is the set `failing.intersection(fragments)`
    makes, in the same iteration order, while nodes fail, pass again and fail for other reasons."""
    cluster = Cluster(Config(), size=300)
    placement = cluster.placement
    req = placement.requirements(_pod("a"))
    rng = random.Random(2)
    bound: list[str] = []
    checked = 0
    for _ in range(150):
        if rng.random() < 0.6 or not bound:
            bound.append(cluster.bind(rng.choice(cluster.names), rng.choice((1, 4, 8))))
        else:
            cluster.view.delete_pod(bound.pop(rng.randrange(len(bound))))
        with cluster.view.lock:
            verdicts = placement._verdicts(req)
            asked = frozenset(rng.sample([*cluster.names, "stranger"], 200))
            failing = asked - (asked & verdicts.passing)
            expected = failing.intersection(verdicts.fragments)
            assert list(placement_module._known(verdicts, failing)) == list(expected)
            assert verdicts.places.keys() == verdicts.fragments.keys()
            checked += len(expected)
    assert checked > 150 * 50
