"""kube-scheduler's own node filters, for `explain`: which nodes the real scheduler would send to the
extender for a pod, and in its own words why it keeps the others.

kube-scheduler runs its Filter plugins before any extender and sends the extender only the nodes that
passed them, so `explain` has to run them too or it names nodes the pod can never go to. These are
the filters of the default profile that decide on node objects and pod requests, in the profile's
order, each stopping a node at its first failure as `RunFilterPlugins` does; the sentences are the
plugins' own (k8s.io/kubernetes v1.37.2, pkg/scheduler/framework/plugins):

- NodeName: `spec.nodeName` set and another node ("node(s) didn't match the requested node name").
- NodeUnschedulable: `spec.unschedulable` unless the pod tolerates node.kubernetes.io/unschedulable
  ("node(s) were unschedulable").
- TaintToleration: a NoSchedule or NoExecute taint no toleration matches ("node(s) had untolerated
  taint(s)"). The Gt/Lt toleration operators are behind an alpha gate that is off: they match nothing.
- NodeAffinity: `spec.nodeSelector` and required node affinity ("node(s) didn't match Pod's node
  affinity/selector"); terms that name nodes by `metadata.name` narrow the nodes in PreFilter, and the
  others get "node(s) didn't satisfy plugin(s) [NodeAffinity]".
- NodeResourcesFit: each requested resource against allocatable minus the requests of the pods bound
  to the node that have not finished ("Insufficient nvidia.com/gpu", "Too many pods"); requests as
  `resource.PodRequests` counts them: sidecars, init containers, pod-level requests, overhead.

Not modelled (`unmodelled` names what a pod uses of them): host ports, volumes, topology spread,
inter-pod affinity, resource claims. Not on any hot path: the extender itself never needs this.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from functools import lru_cache
from typing import Any

from gpu_placement.base.names import BLOCKING_EFFECTS
from gpu_placement.base.quantity import QuantityError, parse_quantity

__all__ = ["Filtered", "KubeNode", "KubeNodes", "Verdict", "affinity_matches", "fit_error", "pod_requests", "tolerates",
           "unmodelled"]

NODE_NAME = "node(s) didn't match the requested node name"
UNSCHEDULABLE = "node(s) were unschedulable"
UNTOLERATED = "node(s) had untolerated taint(s)"
AFFINITY = "node(s) didn't match Pod's node affinity/selector"
TOO_MANY_PODS = "Too many pods"
UNSCHEDULABLE_TAINT = "node.kubernetes.io/unschedulable"
_PODS, _CPU, _MEMORY, _EPHEMERAL = "pods", "cpu", "memory", "ephemeral-storage"
_POD_LEVEL = (_CPU, _MEMORY)  # and hugepages-*: what pod-level requests may set
_TERMINAL = ("Succeeded", "Failed")  # kube-scheduler's pod informer leaves these out

Resources = dict[str, int]  # cpu in millicores, memory and storage in bytes, everything else in units


@dataclass(slots=True, frozen=True)
class Verdict:
    """Why kube-scheduler keeps a node from the pod: the plugin and its reasons, as it counts them."""

    plugin: str
    reasons: tuple[str, ...]
    detail: str = ""  # this node's own facts behind it, for explain (never in what kube-scheduler counts)

    @property
    def text(self) -> str:
        return ", ".join(self.reasons)


@dataclass(slots=True, frozen=True)
class Filtered:
    verdicts: dict[str, Verdict | None]  # node -> why kube-scheduler keeps it, None: sent to the extender
    prefilter: str | None = None  # PreFilter failed for every node: kube-scheduler reports this alone

    @property
    def passing(self) -> list[str]:
        return [name for name, verdict in self.verdicts.items() if verdict is None]


@dataclass(slots=True, frozen=True)
class KubeNode:
    name: str
    labels: Mapping[str, str]
    taints: tuple[Mapping[str, Any], ...]
    unschedulable: bool
    allocatable: Resources


@dataclass(slots=True)
class KubeNodes:
    """Nodes as kube-scheduler's filters see them, and what the pods bound to each already request."""

    nodes: dict[str, KubeNode] = field(default_factory=dict)
    requested: dict[str, Counter[str]] = field(default_factory=dict)  # node -> resource -> total asked
    pods: Counter[str] = field(default_factory=Counter)  # node -> pods bound there

    @classmethod
    def from_objects(cls, objects: Iterable[Mapping[str, Any]], leave_out: str | None = None) -> KubeNodes:
        """Nodes and pods of a snapshot or a live read; `leave_out` (namespace/name) is the pod being
        explained, which must not stand in its own way."""
        found = cls()
        for obj in objects:
            kind = obj.get("kind")
            if kind == "Node":
                node = _node(obj)
                found.nodes[node.name] = node
            elif kind == "Pod":
                meta = obj.get("metadata") or {}
                spec = obj.get("spec") or {}
                where = spec.get("nodeName")
                if not where or (obj.get("status") or {}).get("phase") in _TERMINAL:
                    continue
                if leave_out is not None and f"{meta.get('namespace') or 'default'}/{meta.get('name')}" == leave_out:
                    continue
                found.pods[where] += 1
                found.requested.setdefault(where, Counter()).update(pod_requests(spec))
        return found

    def filter(self, pod: Mapping[str, Any]) -> Filtered:
        """Every node's verdict for this pod (None: kube-scheduler would send it on to the extender)."""
        spec = pod.get("spec") or {}
        wants = pod_requests(spec)
        narrowing = {plugin: names for plugin, names in (("NodeAffinity", _narrowed_by_name(spec)),
                                                         ("NodeName", _named(spec))) if names is not None}
        if narrowing:
            plugins = sorted(narrowing)
            allowed = set.intersection(*narrowing.values())
            if not allowed:  # PreFilter itself fails: one message for the whole cycle
                message = (f"node(s) didn't satisfy plugin {plugins[0]}" if len(plugins) == 1 else
                           f"node(s) didn't satisfy plugin(s) [{' '.join(plugins)}] simultaneously")
                return Filtered({name: Verdict(plugins[0], (message,)) for name in sorted(self.nodes)}, message)
            absent = Verdict(plugins[0], (f"node(s) didn't satisfy plugin(s) [{' '.join(plugins)}]",))
        verdicts = {name: absent if narrowing and name not in allowed else self._check(node, spec, wants)
                    for name, node in sorted(self.nodes.items())}
        return Filtered(verdicts)

    def _check(self, node: KubeNode, spec: Mapping[str, Any], wants: Resources) -> Verdict | None:
        tolerations = [t for t in spec.get("tolerations") or () if isinstance(t, dict)]
        if spec.get("nodeName") and spec["nodeName"] != node.name:
            return Verdict("NodeName", (NODE_NAME,), f"spec.nodeName is {spec['nodeName']}")
        if node.unschedulable and not any(_tolerates(t, {"key": UNSCHEDULABLE_TAINT, "effect": "NoSchedule"})
                                          for t in tolerations):
            return Verdict("NodeUnschedulable", (UNSCHEDULABLE,), "spec.unschedulable: cordoned")
        for taint in node.taints:
            if taint.get("effect") in BLOCKING_EFFECTS and not any(_tolerates(t, taint) for t in tolerations):
                value = f"={taint['value']}" if taint.get("value") else ""
                return Verdict("TaintToleration", (UNTOLERATED,), f"{taint.get('key')}{value}:{taint.get('effect')}")
        if not _affinity_matches(spec, node):
            return Verdict("NodeAffinity", (AFFINITY,), _affinity_miss(spec, node))
        short, figures = self._insufficient(node, wants)
        return Verdict("NodeResourcesFit", short, figures) if short else None

    def _insufficient(self, node: KubeNode, wants: Resources) -> tuple[tuple[str, ...], str]:
        """NodeResourcesFit's `fitsRequest`: the pod count first, then each resource asked for."""
        used = self.requested.get(node.name, Counter())
        reasons, figures = [], []
        if self.pods[node.name] + 1 > node.allocatable.get(_PODS, 0):
            reasons.append(TOO_MANY_PODS)
            figures.append(f"{self.pods[node.name]} pods of {node.allocatable.get(_PODS, 0)}")
        for resource in (_CPU, _MEMORY, _EPHEMERAL, *sorted(r for r in wants if r not in (_CPU, _MEMORY, _EPHEMERAL))):
            asked = wants.get(resource, 0)
            free = node.allocatable.get(resource, 0) - used[resource]
            if asked > 0 and _scalar_or_base(resource) and asked > free:
                reasons.append(f"Insufficient {resource}")
                figures.append(f"{resource} asks {_shown(resource, asked)}, {_shown(resource, max(free, 0))} free of "
                               f"{_shown(resource, node.allocatable.get(resource, 0))}")
        return tuple(reasons), "; ".join(figures)


def fit_error(total: int, reasons: Iterable[Iterable[str]], prefilter: str | None = None) -> str:
    """kube-scheduler's FitError message without its preemption part: one count per reason string,
    sorted as strings (`0/6 nodes are available: 2 Insufficient nvidia.com/gpu, 4 node(s) ...`), or the
    PreFilter message alone when PreFilter failed (framework/types.go, `FitError.Error`)."""
    if prefilter is not None:
        return f"0/{total} nodes are available: {prefilter}."
    counts = Counter(reason for node in reasons for reason in node)
    parts = sorted(f"{n} {reason}" for reason, n in counts.items())
    return f"0/{total} nodes are available:" + (f" {', '.join(parts)}." if parts else "")


def unmodelled(spec: Mapping[str, Any]) -> list[str]:
    """What the pod asks of kube-scheduler that these filters do not check, for `explain` to say."""
    found = []
    if any(p.get("hostPort") for c in _containers(spec) for p in c.get("ports") or () if isinstance(p, dict)):
        found.append("host ports (NodePorts)")
    if any(isinstance(v, dict) and "persistentVolumeClaim" in v for v in spec.get("volumes") or ()):
        found.append("persistent volume claims (VolumeBinding, VolumeZone)")
    if spec.get("topologySpreadConstraints"):
        found.append("topologySpreadConstraints (PodTopologySpread)")
    affinity = spec.get("affinity") or {}
    if affinity.get("podAffinity") or affinity.get("podAntiAffinity"):
        found.append("pod (anti-)affinity (InterPodAffinity)")
    if spec.get("resourceClaims"):
        found.append("resource claims (DynamicResources)")
    if spec.get("schedulingGates"):
        found.append("scheduling gates: kube-scheduler does not try the pod until they are removed")
    return found


# -- requests --------------------------------------------------------------------------------------
def pod_requests(spec: Mapping[str, Any]) -> Resources:
    """`resource.PodRequests`: app containers and sidecars together, or the largest init container
    (with the sidecars started before it), whichever is more; pod-level requests replace the cpu,
    memory and hugepages of the containers; overhead is added. A request left out where a limit is
    given is the limit, as the API server defaults it. Quantities that do not parse count as 0: the
    API server refuses them, so such a pod never reaches kube-scheduler."""
    total: Counter[str] = Counter()
    for container in spec.get("containers") or ():
        total.update(_container_requests(container))
    sidecars: Counter[str] = Counter()
    peak: Counter[str] = Counter()
    for init in spec.get("initContainers") or ():
        asked = _container_requests(init)
        if init.get("restartPolicy") == "Always":
            total.update(asked)
            sidecars.update(asked)
        else:
            peak |= sidecars + Counter(asked)
    total |= peak
    pod_level = ((spec.get("resources") or {}).get("requests") or {}) if isinstance(spec.get("resources"), dict) else {}
    for resource, value in pod_level.items():
        if resource in _POD_LEVEL or resource.startswith("hugepages-"):
            total[resource] = _amount(resource, value)
    for resource, value in (spec.get("overhead") or {}).items():
        total[resource] += _amount(resource, value)
    return {resource: amount for resource, amount in total.items() if amount > 0}


def _container_requests(container: Any) -> Resources:
    if not isinstance(container, dict):
        return {}
    resources = container.get("resources") or {}
    given = {**(resources.get("limits") or {}), **(resources.get("requests") or {})}
    return {resource: _amount(resource, value) for resource, value in given.items()}


def _amount(resource: str, value: Any) -> int:
    if isinstance(value, str | int | float):
        return _cached_amount(resource, value)  # a cluster repeats a few quantities over and over
    return 0


@lru_cache(maxsize=4096)
def _cached_amount(resource: str, value: str | int | float) -> int:
    try:
        amount = parse_quantity(value)
    except QuantityError:
        return 0
    if resource == _CPU:
        amount *= 1000
    return int(-(-amount.numerator // amount.denominator)) if isinstance(amount, Fraction) else int(amount)


def _scalar_or_base(resource: str) -> bool:
    """What NodeResourcesFit compares: cpu, memory, ephemeral storage, and scalar resources (extended,
    hugepages, prefixed native); anything else in a request (a typo'd name without a domain) is not."""
    return resource in (_CPU, _MEMORY, _EPHEMERAL) or "/" in resource or resource.startswith("hugepages-")


# -- nodes -----------------------------------------------------------------------------------------
def _node(obj: Mapping[str, Any]) -> KubeNode:
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    allocatable = (obj.get("status") or {}).get("allocatable") or {}
    return KubeNode(name=str(meta.get("name") or ""), labels=dict(meta.get("labels") or {}),
                    taints=tuple(t for t in spec.get("taints") or () if isinstance(t, dict)),
                    unschedulable=bool(spec.get("unschedulable")),
                    allocatable={resource: _amount(resource, value) for resource, value in allocatable.items()})


def _shown(resource: str, amount: int) -> str:
    if resource == _CPU:
        return f"{amount}m"
    if resource in (_MEMORY, _EPHEMERAL) or resource.startswith("hugepages-"):
        return f"{amount / 2**20:.0f}Mi"
    return str(amount)


def _affinity_miss(spec: Mapping[str, Any], node: KubeNode) -> str:
    for key, value in (spec.get("nodeSelector") or {}).items():
        if node.labels.get(key) != value:
            has = f"{key}={node.labels[key]}" if key in node.labels else f"no {key} label"
            return f"nodeSelector {key}={value}; the node has {has}"
    return "no term of the required node affinity matches the node's labels"


def tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """Whether one toleration tolerates one taint (the survey weighs taints against workloads)."""
    return _tolerates(toleration, taint)


def affinity_matches(spec: Mapping[str, Any], node: KubeNode) -> bool:
    """NodeAffinity's Filter alone: the pod's nodeSelector and required node affinity against the node."""
    return _affinity_matches(spec, node)


def _tolerates(toleration: Mapping[str, Any], taint: Mapping[str, Any]) -> bool:
    """`Toleration.ToleratesTaint` (k8s.io/api core/v1), comparison operators off."""
    if toleration.get("effect") and toleration["effect"] != taint.get("effect"):
        return False
    if toleration.get("key") and toleration["key"] != taint.get("key"):
        return False
    operator = toleration.get("operator") or "Equal"
    if operator == "Exists":
        return True
    if operator == "Equal":
        return (toleration.get("value") or "") == (taint.get("value") or "")
    return False


def _affinity_matches(spec: Mapping[str, Any], node: KubeNode) -> bool:
    """`GetRequiredNodeAffinity(pod).Match(node)`: every nodeSelector label, and any one required term."""
    selector = spec.get("nodeSelector") or {}
    if any(node.labels.get(key) != value for key, value in selector.items()):
        return False
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution"))
    if required is None:
        return True
    terms = [t for t in required.get("nodeSelectorTerms") or () if isinstance(t, dict)
             and (t.get("matchExpressions") or t.get("matchFields"))]  # an empty term selects nothing
    return any(_term_matches(term, node) for term in terms)


def _term_matches(term: Mapping[str, Any], node: KubeNode) -> bool:
    expressions = term.get("matchExpressions") or ()
    fields = term.get("matchFields") or ()
    if not all(_requirement(e, node.labels) for e in expressions):
        return False
    return all(_field_requirement(f, node.name) for f in fields)


def _requirement(expression: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """A label requirement (apimachinery `labels.Requirement.Matches`); one that does not parse fails its
    term, as the LazyErrorNodeSelector does."""
    key = expression.get("key")
    operator = expression.get("operator")
    values = [str(v) for v in expression.get("values") or ()]
    label = labels.get(key) if isinstance(key, str) else None  # the node's value for the key; None: not set
    if operator == "In":
        return label is not None and label in values
    if operator == "NotIn":
        return label is None or label not in values
    if operator == "Exists":
        return label is not None
    if operator == "DoesNotExist":
        return label is None
    if operator in ("Gt", "Lt") and label is not None and len(values) == 1:
        try:
            have, bound = int(label), int(values[0])
        except ValueError:
            return False
        return have > bound if operator == "Gt" else have < bound
    return False


def _field_requirement(expression: Mapping[str, Any], name: str) -> bool:
    values: Sequence[object] = expression.get("values") or ()
    if expression.get("key") != "metadata.name" or len(values) != 1:
        return False  # only metadata.name is a node field; anything else does not parse
    if expression.get("operator") == "In":
        return name == values[0]
    if expression.get("operator") == "NotIn":
        return name != values[0]
    return False


def _narrowed_by_name(spec: Mapping[str, Any]) -> set[str] | None:
    """NodeAffinity's PreFilter: when every required term names nodes (`metadata.name In`), only those
    nodes are filtered at all; None when it does not narrow."""
    required = (((spec.get("affinity") or {}).get("nodeAffinity") or {})
                .get("requiredDuringSchedulingIgnoredDuringExecution")) or {}
    terms = [t for t in required.get("nodeSelectorTerms") or () if isinstance(t, dict)]
    if not terms:
        return None
    names: set[str] = set()
    for term in terms:
        in_term: set[str] | None = None
        for expression in term.get("matchFields") or ():
            if expression.get("key") == "metadata.name" and expression.get("operator") == "In":
                chosen = {str(v) for v in expression.get("values") or ()}
                in_term = chosen if in_term is None else in_term & chosen
        if in_term is None:
            return None  # a term without node names lets every node through
        names |= in_term
    return names


def _named(spec: Mapping[str, Any]) -> set[str] | None:
    """NodeName's PreFilter: a pod that names its node is filtered on that node only."""
    return {str(spec["nodeName"])} if spec.get("nodeName") else None


def _containers(spec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [c for c in [*(spec.get("initContainers") or ()), *(spec.get("containers") or ())] if isinstance(c, dict)]
