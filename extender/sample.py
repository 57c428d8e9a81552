"""A /filter that passes none of the names it was sent, when those names are kube-scheduler's sample and
nodes outside it fit: answered so that preemption does not evict for a pod that fits elsewhere.

With `percentageOfNodesToScore` below 100 (0, the chart's default: the adaptive percentage),
kube-scheduler stops filtering once it has found `numFeasibleNodesToFind` feasible nodes and sends only
those to the extender (k8s.io/kubernetes v1.37.2, pkg/scheduler/schedule_one.go, `findNodesThatPassFilters`
and `numFeasibleNodesToFind`: all nodes below 100, else the percentage of them, at least 100; the adaptive
percentage is 50 - nodes/125, at least 5). When the extender refuses that whole sample, the pod fails
the cycle: `findNodesThatPassExtenders` copies the answer's maps into the cycle's statuses, the nodes
never filtered keep the absent status UnschedulableAndUnresolvable (framework/interface.go,
`NewDefaultNodeToStatus`), and DefaultPreemption looks for victims only on the nodes whose status is
Unschedulable (framework/preemption/preemption.go, `findCandidates`, `NodesForStatusCode`): the sample's
nodes gpu-placement refused as resolvable (GPU units or memory taken). It would evict pods there while a
node outside the sample fits the pod as it is.

So, on that path only (nothing passed, so no scan when something does): when the names sent reach
`numFeasibleNodesToFind` for the view's node count (the sample may have been cut) and the view knows
nodes not sent that pass the pod by gpu-placement's rules, every refusal is answered unresolvable with
one sentence (`OutsideSample`) that says so. The pod fails this cycle without preemption; kube-scheduler
requeues a pod an extender refused on any cluster event (schedule_one.go, `findNodesThatFitPod`: the
extender goes into the unschedulable plugins) and its next cycle starts where this one stopped
(`nextStartNodeIndex`), so it filters other nodes.

The view cannot see kube-scheduler's own filters (the pod's node selector, taints, CPU): a node that
passes gpu-placement's rules may be one kube-scheduler filtered out rather than one past its sample.
So the answer is given at most as many times in a row as it takes samples of that size to go round
every node (`Samples.allow`); after that the pod is answered as before and preemption may act. The
per-node reasons still count in gpu_placement_decisions_total, and `OutsideSample` once per such answer.
"""

from __future__ import annotations

from collections import Counter, OrderedDict

import orjson

from gpu_placement.decide.placement import FilterResult

__all__ = ["OUTSIDE_SAMPLE", "Samples", "feasible_nodes_to_find", "may_be_cut", "outside_sample",
           "refused_as_unresolvable"]

OUTSIDE_SAMPLE = "OutsideSample"  # the extender's decision code, beside VIEW_NOT_READY and BIND_REFUSED
_MIN_FEASIBLE_NODES_TO_FIND = 100  # schedule_one.go minFeasibleNodesToFind
_MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND = 5  # minFeasibleNodesPercentageToFind
_PODS_KEPT = 4_096  # pods answered OutsideSample lately, by key: their count in a row


def feasible_nodes_to_find(all_nodes: int, percentage: int) -> int:
    """kube-scheduler's `numFeasibleNodesToFind` for a cluster of `all_nodes` and a percentageOfNodesToScore
    of `percentage` (0: the adaptive one), in its integer arithmetic."""
    if all_nodes < _MIN_FEASIBLE_NODES_TO_FIND:
        return all_nodes
    if percentage == 0:
        percentage = max(50 - all_nodes // 125, _MIN_FEASIBLE_NODES_PERCENTAGE_TO_FIND)
    return max(all_nodes * percentage // 100, _MIN_FEASIBLE_NODES_TO_FIND)


def may_be_cut(asked: int, all_nodes: int, percentage: int) -> bool:
    """Whether `asked` names can be a sample kube-scheduler stopped filtering at: it found as many feasible
    nodes as it looks for, and it looks for fewer than all. Fewer names: it filtered every node."""
    to_find = feasible_nodes_to_find(all_nodes, percentage)
    return to_find < all_nodes and asked >= to_find


def outside_sample(fit: int, asked: int, reasons: Counter[str]) -> str:
    """The one sentence every node of the sample gets: the same string on each, so kube-scheduler's message
    counts them once ("0/500 nodes are available: 230 OutsideSample: ...")."""
    most = ", ".join(f"{count} {code}" for code, count in reasons.most_common(2))
    return (f"{OUTSIDE_SAMPLE}: none of the {asked} nodes in kube-scheduler's sample fits ({most}) but {fit} "
            f"node(s) outside it do: the pod is retried with the next sample, nothing is preempted "
            f"(scheduler.percentageOfNodesToScore 100 filters every node)")


def refused_as_unresolvable(result: FilterResult, sentence: str) -> FilterResult:
    """An answer refusing every node `result` refused, each unresolvable, with `sentence`; its reasons
    are `result`'s (what the nodes were refused for, for the metrics)."""
    piece = b":" + orjson.dumps(sentence)
    names = dict.fromkeys([*orjson.loads(result.failed_json), *orjson.loads(result.unresolvable_json)])
    refused = b"{" + b",".join(orjson.dumps(name) + piece for name in names) + b"}"
    return FilterResult([], b"{}", refused, result.reasons)


class Samples:
    """How many times in a row each pod was answered `OutsideSample`, to bound it (see the module's text)."""

    def __init__(self) -> None:
        self._runs: OrderedDict[str, tuple[str, int]] = OrderedDict()  # pod key -> (UID, answers in a row)

    def allow(self, key: str, uid: str, asked: int, all_nodes: int) -> bool:
        """Whether this pod may be answered `OutsideSample` once more (and count it): at most the number of
        samples of `asked` nodes that go round `all_nodes`, consecutive cycles of one pod each starting where
        the last stopped."""
        known_uid, run = self._runs.pop(key, (uid, 0))
        if known_uid != uid:
            run = 0
        rounds = -(-all_nodes // max(asked, 1))
        if run >= rounds:
            self._runs[key] = (uid, run)  # stays spent until something passes or the pod is replaced
            return False
        self._runs[key] = (uid, run + 1)
        if len(self._runs) > _PODS_KEPT:
            self._runs.popitem(last=False)
        return True

    def forget(self, key: str) -> None:
        """The pod passed somewhere: its next sample refused counts from zero."""
        self._runs.pop(key, None)
