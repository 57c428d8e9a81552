"""The two admission decisions: what /mutate changes on a pod, and whether /validate lets it in.

Pure over the request, the cluster view and the configuration: no I/O (a namespace the view lacks
is read beforehand by the app, webhook/namespace_reader.py; so are claims and templates a pod names,
webhook/claim_reader.py). Each outcome carries one
reason code (for metrics and the debug log); the sentences the user reads name the namespace, the
resource, the figures and the annotation to change.

Reason codes, one place each: Mutated, Unchanged, KeptOffGpuNodes, ChoseGpuNodes, NoGpuAsked, NotAPodCreate,
Exempt, NamespacePolicyBroken, NamespaceUnknown, AnnotationsFixed, Monitor (in this module); BadPod
(review.py); BadAnnotation, NoGpuAccess, Escalation, Allowed (here); NotShaped, NotShapedAllowed
(shaping.py); OverQuota, NotInQuota (quota.py); QuotaPending (quota_gate.py); TemplatePending
(dra_claims.py); ClaimOutsidePolicy (dra_validate.py). In audit mode a would-be
denial is counted as its `Audit<code>`, and so is a patch /mutate would have sent (`AuditMutated`,
`AuditKeptOffGpuNodes`): audit mode changes no pod (webhook/audit.py). The audit codes are `AUDIT`, here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gpu_placement.base import names as n
from gpu_placement.base.config import Config
from gpu_placement.decide.claims import keeps_resource
from gpu_placement.decide.dra_quota import (
    ClaimCharge,
    by_kind,
    claim_charge,
    claim_hard,
    claim_names,
    claim_usage,
    mirror_hard,
    monitor_devices,
    plain_charge,
    pod_standins,
    resource_usage,
)
from gpu_placement.decide.requirements import unchecked_cuda
from gpu_placement.facts.annotation_keys import unread_pod_keys
from gpu_placement.facts.pods import GpuRequests
from gpu_placement.facts.policy import (
    NamespacePolicy,
    PolicyCache,
    Sharing,
    pod_annotation_problems,
    sharing_of_resource,
)
from gpu_placement.facts.sharing import effective_sharing
from gpu_placement.observe.metrics import NGC_UNCHECKED
from gpu_placement.view.cluster import ClusterView
from webhook.audit import would_do
from webhook.claim_reader import ClaimReader, Ref
from webhook.dra_claims import TEMPLATE_PENDING, Conversion, convert, missing_sentence, template_claims
from webhook.dra_validate import CLAIM_KINDS, CLAIM_OUTSIDE_POLICY, claim_problems
from webhook.namespace_reader import NamespaceReader
from webhook.patches import (
    asks_for_gpu_nodes,
    claim_patch,
    gpu_patch,
    protect_patch,
    shaped_requests,
    tolerates_gpu_taint,
)
from webhook.quota import (
    NOT_IN_QUOTA,
    OVER_QUOTA,
    Reservations,
    held_warnings,
    name_advice,
    quota_problems,
    unheld_names,
)
from webhook.quota_gate import GATED_HOLD_SECONDS, QUOTA_PENDING, keys_pending, quota_pending
from webhook.review import (
    AdmissionRequest,
    AdmissionResponse,
    BadPod,
    GroupVersionResource,
    Subject,
    allowed,
    bad_update,
    denied,
    subject_of,
)
from webhook.shaping import NOT_SHAPED, NOT_SHAPED_ALLOWED, governed, unshaped, unshaped_warning

__all__ = ["Admission", "Decision"]

MUTATED, UNCHANGED, KEPT_OFF_GPU, CHOSE_GPU_NODES = "Mutated", "Unchanged", "KeptOffGpuNodes", "ChoseGpuNodes"
NO_GPU, NOT_A_POD, EXEMPT, POLICY_BROKEN = "NoGpuAsked", "NotAPodCreate", "Exempt", "NamespacePolicyBroken"
NAMESPACE_UNKNOWN, ANNOTATIONS_FIXED = "NamespaceUnknown", "AnnotationsFixed"
# A pod whose only GPU claims have admin access (a DCGM exporter, KEP-5018): it shares devices in use and
# takes none, so it is left as it is: not routed, shaped, kept off GPU nodes, charged or held.
MONITOR = "Monitor"
BAD_POD, BAD_ANNOTATION, NO_GPU_ACCESS, ESCALATION, ALLOWED = (
    "BadPod", "BadAnnotation", "NoGpuAccess", "Escalation", "Allowed")
_RETRIABLE = (QUOTA_PENDING, TEMPLATE_PENDING)  # refusals that pass by themselves: 503, nothing is wrong with the pod
# Audit mode's codes: what a patch or a refusal would have been, counted under a code of its own. Written
# out, so that a grep for AuditOverQuota finds its rule; every code a refusal can carry has one.
AUDIT_MUTATED = "AuditMutated"
AUDIT_KEPT_OFF_GPU = "AuditKeptOffGpuNodes"
AUDIT_NAMESPACE_UNKNOWN = "AuditNamespaceUnknown"
AUDIT_ANNOTATIONS_FIXED = "AuditAnnotationsFixed"
AUDIT_CLAIM_OUTSIDE_POLICY = "AuditClaimOutsidePolicy"
AUDIT_BAD_ANNOTATION = "AuditBadAnnotation"
AUDIT_NO_GPU_ACCESS = "AuditNoGpuAccess"
AUDIT_ESCALATION = "AuditEscalation"
AUDIT_NOT_SHAPED = "AuditNotShaped"
AUDIT_OVER_QUOTA = "AuditOverQuota"
AUDIT_NOT_IN_QUOTA = "AuditNotInQuota"
AUDIT_QUOTA_PENDING = "AuditQuotaPending"
AUDIT_TEMPLATE_PENDING = "AuditTemplatePending"
AUDIT = {MUTATED: AUDIT_MUTATED, KEPT_OFF_GPU: AUDIT_KEPT_OFF_GPU, NAMESPACE_UNKNOWN: AUDIT_NAMESPACE_UNKNOWN,
         ANNOTATIONS_FIXED: AUDIT_ANNOTATIONS_FIXED, CLAIM_OUTSIDE_POLICY: AUDIT_CLAIM_OUTSIDE_POLICY,
         BAD_ANNOTATION: AUDIT_BAD_ANNOTATION, NO_GPU_ACCESS: AUDIT_NO_GPU_ACCESS, ESCALATION: AUDIT_ESCALATION,
         NOT_SHAPED: AUDIT_NOT_SHAPED, OVER_QUOTA: AUDIT_OVER_QUOTA, NOT_IN_QUOTA: AUDIT_NOT_IN_QUOTA,
         QUOTA_PENDING: AUDIT_QUOTA_PENDING, TEMPLATE_PENDING: AUDIT_TEMPLATE_PENDING}  # code -> its audit code


@dataclass(slots=True)
class Decision:
    response: AdmissionResponse
    reason: str
    namespace: str = ""
    pod: str = ""
    problems: list[str] = field(default_factory=list)
    uid: str = ""  # the pod's metadata.uid as the review has it (the API server's, for /validate of a CREATE)

    def log_entry(self, verb: str) -> dict[str, Any]:
        """What the debug log line records: JSON-able, one per decision."""
        response = self.response
        entry: dict[str, Any] = {"verb": verb, "uid": response["uid"], "namespace": self.namespace, "pod": self.pod,
                                 "allowed": response["allowed"], "reason": self.reason}
        if "patch" in response:
            entry["patched"] = True
        if self.problems:
            entry["problems"] = self.problems
        return entry


class Admission:
    def __init__(self, view: ClusterView, config: Config, api: Any = None, quota_gate: bool = False,
                 dra_version: str | None = None) -> None:
        """`api`: the kubernetes ApiClient when there is an API server (holds are then settled by lists
        of pods, see webhook/holds.py); None with --snapshot. `quota_gate`: the view watches the mirrored
        ResourceQuotas, and GPU pods are admitted only while the API server enforces the quota
        (webhook/quota_gate.py). `dra_version`: where the API server serves ResourceClaims and their
        templates (None: not served), for the ones a pod names that the view lacks."""
        self.view = view
        self.config = config
        self.api = api
        self.quota_gate = quota_gate
        self.policies = PolicyCache(config)
        # With the API server enforcing the quota (the gate), a hold only brings the friendlier sentence
        # forward; one whose pod the API server refused then blocks no one past a short list (holds.py).
        due = min(config.reservation_ttl_seconds, GATED_HOLD_SECONDS) if quota_gate else config.reservation_ttl_seconds
        self.reservations = Reservations(view, due, listed=api is not None)
        self.reader = NamespaceReader(view, api) if api is not None else None
        self.claim_reader = ClaimReader(view, api, dra_version) if api is not None and dra_version else None
        # config.is_gpu_resource, answered from a dict for the names pods keep asking about (cpu, memory, ...).
        self.is_gpu_resource = _remembered(config.is_gpu_resource)

    def policy(self, namespace: str) -> NamespacePolicy:
        # One dict read (atomic under the GIL); the cache reparses only when the record changed.
        record = self.view.namespaces.get(namespace)
        if record is None and self.reader is not None:
            record, _ = self.reader.record(namespace)  # read from the API server: the view lags
        return self.policies.get(namespace, record)

    def namespace_to_read(self, request: AdmissionRequest) -> str | None:
        """The namespace of a pod CREATE that the view does not have (yet): read it from the API
        server before deciding. None in the common case, at the cost of one dict lookup."""
        namespace = request.get("namespace") or ""
        if self.reader is None or not self.reader.wanted(namespace) or namespace in self.config.exempt_namespaces:
            return None
        resource: GroupVersionResource = request.get("resource") or {}
        if request.get("operation", "CREATE") != "CREATE" or request.get("subResource") or (
                resource.get("resource", "pods") != "pods"):
            return None
        return namespace

    def claims_to_read(self, request: AdmissionRequest) -> list[Ref]:
        """The ResourceClaims and templates a pod CREATE names that the view does not have (yet): read
        them from the API server before /mutate routes the pod. Empty in the common case."""
        if self.claim_reader is None or request.get("operation", "CREATE") != "CREATE" or request.get("subResource"):
            return []
        resource: GroupVersionResource = request.get("resource") or {}
        namespace = request.get("namespace") or ""
        pod: Any = request.get("object")
        spec = pod.get("spec") if isinstance(pod, dict) else None
        if (resource.get("resource", "pods") != "pods" or namespace in self.config.exempt_namespaces
                or not isinstance(spec, dict) or not spec.get("resourceClaims")):
            return []
        return self.claim_reader.wanted(namespace, spec)

    def _unknown_namespace(self, namespace: str) -> str | None:
        """The sentence for a namespace the view lacks and the API server did not give us; else None.
        With --snapshot (no API server) a namespace missing from the files has no annotations."""
        if self.reader is None:
            return None
        record, why = self.reader.record(namespace)
        if record is not None:
            return None
        return (f"namespace {namespace} is not in gpu-placement's view yet and could not be read from the API "
                f"server ({why}), so its GPU policy (the gpu-placement.io/* annotations) is unknown: try again in "
                "a few seconds")

    # -- /mutate -----------------------------------------------------------------------------------
    def mutate(self, request: AdmissionRequest) -> Decision:
        return self._guarded(request, self._mutate)

    def _mutate(self, uid: str, subject: Subject) -> Decision:
        config, pod = self.config, subject.pod
        spec = pod["spec"]
        if not subject.gpus and spec.get("resourceClaims") and self.view.dra.active:
            claimed = self._claims(uid, subject)
            if claimed is not None:
                return claimed
        if not subject.gpus:
            if (config.protect_gpu_nodes and not spec.get("nodeName") and not _is_daemonset_pod(pod)
                    and tolerates_gpu_taint(spec, config)):
                if asks_for_gpu_nodes(spec):  # its own choice (a node agent, an NCCL check): not trapped
                    text = (f"pod {subject.namespace}/{subject.name} asks for no GPU but selects GPU nodes itself "
                            f"({n.GPU_PRESENT}=true), so protectGpuNodes leaves it alone: it takes room on GPU "
                            "nodes without using a GPU")
                    return self._decision(allowed(uid, warnings=[text]), CHOSE_GPU_NODES, subject, [text])
                ops = protect_patch(pod)
                if ops and config.mode == "audit":
                    return self._told(uid, would_do(ops), KEPT_OFF_GPU, subject)
                return self._decision(allowed(uid, ops), KEPT_OFF_GPU if ops else UNCHANGED, subject)
            return self._decision(allowed(uid), NO_GPU, subject)
        unknown = self._unknown_namespace(subject.namespace)
        if unknown is not None:  # shaped by nothing; /validate refuses it (or, in audit mode, warns)
            return self._decision(allowed(uid, warnings=[unknown]), NAMESPACE_UNKNOWN, subject, [unknown])
        policy = self.policy(subject.namespace)
        if not policy.shapes_ok:
            # How to shape the pod is unknown; /validate denies it with the same sentences.
            problems = [policy.errors[key] for key in (n.ANN_SHARING, n.ANN_POOLS, n.ANN_ALLOCATION)
                        if key in policy.errors]
            return self._decision(allowed(uid, warnings=problems), POLICY_BROKEN, subject, problems)
        if self._dra(policy) and not self._kept(policy, subject):
            conversion = self._convert(policy, subject)
            if conversion.missing:  # /validate refuses it, retriably, with the same sentence
                text = missing_sentence(conversion.missing, f"pod {subject.namespace}/{subject.name}")
                return self._decision(allowed(uid, warnings=[text]), TEMPLATE_PENDING, subject, [text])
            if config.mode == "audit":
                return self._told(uid, would_do(conversion.ops, policy.pools), MUTATED, subject)
            return self._decision(allowed(uid, conversion.ops), MUTATED, subject)
        ops = self._shape(policy, subject)
        if ops and config.mode == "audit":
            return self._told(uid, would_do(ops, policy.pools), MUTATED, subject)
        return self._decision(allowed(uid, ops), MUTATED if ops else UNCHANGED, subject)

    def _dra(self, policy: NamespacePolicy) -> bool:
        """GPU pods here are given ResourceClaims (webhook/dra_claims.py): a `dra` namespace on a cluster
        that serves resource.k8s.io at a version whose claims gpu-placement writes. Elsewhere `dra` falls
        back to the device plugin's resources (a template never kept would refuse every GPU pod)."""
        dra = self.view.dra
        return policy.mode(self.config) == "dra" and dra.active and dra.templates_kept

    def _kept(self, policy: NamespacePolicy, subject: Subject) -> bool:
        """A GPU pod of a `dra` namespace that keeps its resources: the cluster serves them through DRA
        itself (gpu_placement/decide/claims.py `keeps_resource`); it is shaped as any GPU pod."""
        scheduler = subject.pod["spec"].get("schedulerName") or ""
        routed = not _is_daemonset_pod(subject.pod) and scheduler in ("", "default-scheduler",
                                                                       self.config.scheduler_name)
        with self.view.lock:
            dra = self.view.dra
            return keeps_resource(subject.gpus, self._sharing(policy, subject), policy, dra.extended, dra.classes,
                                  self.config, routed)

    def _convert(self, policy: NamespacePolicy, subject: Subject) -> Conversion:
        pools = [self.config.pools[name] for name in policy.pools]
        with self.view.lock:
            # With a quota, the pod carries stand-ins that the API server charges at its create
            # (gpu_placement/decide/dra_quota.py);
            # not in audit mode, where nothing is mirrored.
            mapped = frozenset(c.extended_resource for c in self.view.dra.classes.values() if c.extended_resource) \
                if policy.quota is not None and self.config.mode != "audit" else None
            return convert(subject.pod, subject.gpus, self._sharing(policy, subject), policy, pools,
                           self.view.dra.templates, self.config, keep_scheduler=_is_daemonset_pod(subject.pod),
                           mapped=mapped, shares=self.view.dra.shares_memory())

    def _shape(self, policy: NamespacePolicy, subject: Subject) -> list[dict[str, Any]]:
        """The patch that shapes a GPU pod under its namespace's policy: empty for a pod already shaped
        (/validate asks the same question, webhook/shaping.py)."""
        pools = [self.config.pools[name] for name in policy.pools]
        # DaemonSet pods keep their scheduler: the controller pins each to its node, and the extender
        # would refuse nodes the DaemonSet's own tolerations allow.
        return gpu_patch(subject.pod, subject.gpus, self._sharing(policy, subject), pools, policy.gpu_memory,
                         self.config, keep_scheduler=_is_daemonset_pod(subject.pod),
                         served_by_dra=self.view.dra.extended.__contains__)

    def _told(self, uid: str, text: str, reason: str, subject: Subject) -> Decision:
        """Audit mode: the patch is not sent; the warning says what it would have done."""
        return self._decision(allowed(uid, warnings=[text]), AUDIT[reason], subject, [text])

    def _claims(self, uid: str, subject: Subject) -> Decision | None:
        """A pod whose ResourceClaims ask for a GPU device class (DRA): routed to the gpu-placement scheduler
        with the namespace's pools; None when its claims ask for no GPU (then it is any other pod)."""
        with self.view.lock:
            found = self.view.dra.pod_claims(subject.namespace, subject.pod["spec"])
            if found.missing is not None and self.claim_reader is not None:  # read from the API server (the app)
                found = self.claim_reader.pod_claims(subject.namespace, subject.pod["spec"])
        if found.missing is not None and not found.classes:
            unknown = found.missing if self.claim_reader is not None else f"{found.missing}, which gpu-placement " \
                "does not know yet"
            text = (f"pod {subject.namespace}/{subject.name} uses {unknown}: if it asks for a GPU, the pod is not "
                    "routed to the gpu-placement scheduler and its GPUs are not checked by gpu-placement's node rules "
                    "(create the claim or template before the pod, or create the pod again)")
            return self._decision(allowed(uid, warnings=[text]), UNCHANGED, subject, [text])
        if found.monitor:
            return self._decision(allowed(uid), MONITOR, subject)
        if not found.classes:
            return None
        policy = self.policy(subject.namespace)
        pools = [self.config.pools[name] for name in policy.pools] if policy.shapes_ok else []
        ops = claim_patch(subject.pod, found.classes, pools, self.config, keep_scheduler=_is_daemonset_pod(subject.pod))
        if ops and self.config.mode == "audit":
            return self._told(uid, would_do(ops, policy.pools), MUTATED, subject)
        return self._decision(allowed(uid, ops), MUTATED if ops else UNCHANGED, subject)

    def _sharing(self, policy: NamespacePolicy, subject: Subject) -> Sharing:
        """The pod's own narrower ask when it has a valid one; the namespace's level otherwise (a wider
        or broken ask is /validate's to deny). The extender reads the level with the same rule."""
        return effective_sharing(policy.sharing, (subject.pod.get("metadata") or {}).get("annotations") or {})

    # -- /validate ---------------------------------------------------------------------------------
    def validate(self, request: AdmissionRequest) -> Decision:
        resource: GroupVersionResource = request.get("resource") or {}
        if resource.get("group") == "resource.k8s.io" and resource.get("resource") in CLAIM_KINDS:
            return self._claim_object(request, resource["resource"])
        if request.get("operation") == "UPDATE":
            return self._update(request)
        return self._guarded(request, self._validate)

    def _update(self, request: AdmissionRequest) -> Decision:
        """A pod UPDATE (the chart sends only those that change a gpu-placement.io/* annotation): those
        annotations were decided at admission and charge the pod (gpu-memory, sharing, admitted)."""
        uid, namespace, name = request["uid"], request.get("namespace", ""), request.get("name", "")
        resource: GroupVersionResource = request.get("resource") or {}
        # pods/status keeps metadata changes (kube-apiserver's podStatusStrategy resets only the spec,
        # ownerReferences and deletionTimestamp), so it is guarded too; other subresources reset them.
        if resource.get("resource", "pods") != "pods" or resource.get("group") or (
                request.get("subResource") or "status") != "status":
            return Decision(allowed(uid), NOT_A_POD, namespace, name)
        if namespace in self.config.exempt_namespaces:
            return Decision(allowed(uid), EXEMPT, namespace, name)
        new: Any = request.get("object")  # as sent: bad_update says whether both are pods
        old: Any = request.get("oldObject")
        problem = bad_update(new, old)
        if problem is not None:
            return Decision(denied(uid, problem, 400, "BadRequest"), BAD_POD, namespace, name, [problem])
        changed = _changed_annotations(old, new)
        if not changed:
            return Decision(allowed(uid), ALLOWED, namespace, name)
        keys = ", ".join(changed)
        verb = "is" if len(changed) == 1 else "are"
        text = (f"pod {namespace}/{name}: {keys} {verb} fixed at admission (they decide what the pod is charged and "
                "how it is placed) and cannot be changed on a running pod: delete the pod and create it again with "
                "the annotations you want")
        if self.config.mode == "audit":
            return Decision(allowed(uid, warnings=[text]), AUDIT_ANNOTATIONS_FIXED, namespace, name, [text])
        return Decision(denied(uid, text), ANNOTATIONS_FIXED, namespace, name, [text])

    def _claim_object(self, request: AdmissionRequest, resource: str) -> Decision:
        """A ResourceClaim or ResourceClaimTemplate written in a namespace with a GPU policy
        (webhook/dra_validate.py): held to the policy; in audit mode the same text as warnings."""
        uid, namespace, name = request["uid"], request.get("namespace", ""), request.get("name", "")
        obj = request.get("object")
        if request.get("operation", "CREATE") != "CREATE" or namespace in self.config.exempt_namespaces:
            return Decision(allowed(uid), NOT_A_POD, namespace, name)
        if not isinstance(obj, dict):
            text = f"request.object: expected a {CLAIM_KINDS[resource]} object"
            return Decision(denied(uid, text, 400, "BadRequest"), BAD_POD, namespace, name, [text])
        policy = self.policy(namespace)
        if not governed(policy, self.config) or n.ANN_SHARING in policy.errors:
            return Decision(allowed(uid), ALLOWED, namespace, name)
        with self.view.lock:
            classes = dict(self.view.dra.classes)
        problems = claim_problems(obj, resource, policy, self.config, classes)
        if not problems:
            return Decision(allowed(uid), ALLOWED, namespace, name)
        if self.config.mode == "audit":
            return Decision(allowed(uid, warnings=problems), AUDIT_CLAIM_OUTSIDE_POLICY, namespace, name, problems)
        return Decision(denied(uid, _joined(problems)), CLAIM_OUTSIDE_POLICY, namespace, name, problems)

    def _validate(self, uid: str, subject: Subject) -> Decision:
        config, pod, gpus = self.config, subject.pod, subject.gpus
        if not gpus:
            if pod["spec"].get("resourceClaims") and self.view.dra.active:
                return self._validate_claims(uid, subject)
            return self._decision(allowed(uid), NO_GPU, subject)
        namespace = subject.namespace
        unknown = self._unknown_namespace(namespace)
        if unknown is not None:
            if config.mode == "audit":
                return self._decision(allowed(uid, warnings=[unknown]), AUDIT_NAMESPACE_UNKNOWN, subject,
                                      [unknown])
            # 503: nothing is wrong with the pod; the same request a moment later is decided normally.
            return self._decision(denied(uid, unknown, 503, "ServiceUnavailable"), NAMESPACE_UNKNOWN, subject,
                                  [unknown])
        policy = self.policy(namespace)
        audit = config.mode == "audit"
        if audit and policy.shapes_ok:  # the pod is as it came (audit /mutate changes nothing): check it as shaped
            gpus = shaped_requests(pod, gpus, self._sharing(policy, subject), config)
        where = f"pod {namespace}/{subject.name}"
        held: list[str] = []
        problems: list[tuple[str, str]] = [(BAD_ANNOTATION, text) for text in policy.errors.values()]
        asked, pod_problems = pod_annotation_problems((pod.get("metadata") or {}).get("annotations") or {}, where)
        problems += [(BAD_ANNOTATION, text) for text in pod_problems]
        if not policy.entitled(config):
            problems.append((NO_GPU_ACCESS, self._no_access(namespace, gpus)))
        elif n.ANN_SHARING not in policy.errors:
            # Audit /mutate shapes nothing, so no pod is held to having been shaped there.
            escalations = ([] if audit else self._unshaped(policy, subject, where)) or self._escalations(
                policy, asked, gpus, where)
            problems += escalations
            if not escalations and policy.quota is not None:
                on_dra = policy.mode(config) == "dra"
                with self.view.lock:
                    used = dict(self.view.namespace_usage.get(namespace) or {})
                    pending = self.reservations.pending(namespace, exclude=subject.key)
                    enforced = self.view.resourcequotas.get(namespace)
                    dra = self.view.dra
                    over: list[tuple[str, str]] = []
                    advice: dict[str, str] = {}
                    if dra.classes:  # where a DeviceClass serves a resource, its claims count there too
                        over = unheld_names(namespace, policy.quota, gpus, config, on_dra, dra.classes)
                        advice = name_advice(policy.quota, gpus, config, on_dra, dra.classes)
                        gpus = plain_charge(gpus, dra.classes, policy.quota)
                        devices, extended = dra.namespace_devices.get(namespace), dra.namespace_extended.get(namespace)
                        monitors = dra.namespace_monitors.get(namespace)
                        used = {resource: resource_usage(resource, used, devices or {}, dra.classes, extended, monitors)
                                for resource in {*used, *policy.quota}}
                    # The figures the mirror writes: the gate waits for exactly those (one function for both).
                    wanted = mirror_hard(policy.quota, config, on_dra, dra.classes, monitor_devices(
                        self.view, namespace) if dra.classes else {}) if self.quota_gate else {}
                # Holds, which any caller that reaches the port can make, never refuse: they only warn
                # (docs/webhook.md, "Who may hold quota"). What exists refuses; the API server's quota decides
                # the last unit of a burst.
                over = over or quota_problems(namespace, policy.quota, used, gpus, advice=advice)
                problems += over or (quota_pending(namespace, wanted, enforced, gpus, self.view.clock())
                                     if self.quota_gate else [])
                if not problems:
                    held = held_warnings(namespace, policy.quota, used, pending, gpus)
        texts = [text for _, text in problems]
        unchecked = unchecked_cuda(pod, where, policy.cuda, config)  # an NGC release the table lacks
        warnings = [*policy.warnings, *unread_pod_keys((pod.get("metadata") or {}).get("annotations") or {}, where),
                    *held, *([unchecked.text] if unchecked else [])]
        if problems and not audit:
            message = _joined(texts)
            # 503 for the one refusal that passes by itself (the quota not in force yet): nothing is wrong with the pod.
            response = denied(uid, message, 503, "ServiceUnavailable") if problems[0][0] in _RETRIABLE and len(
                problems) == 1 else denied(uid, message)
            if warnings:
                response["warnings"] = warnings
            if policy.quota is not None and not subject.dry_run:
                with self.view.lock:  # an earlier call for this pod allowed it: that create is not happening
                    self.reservations.release(namespace, subject.key, subject.uid)
            return self._decision(response, problems[0][0], subject, texts)
        if policy.quota is not None and not subject.dry_run:
            with self.view.lock:
                self.reservations.hold(namespace, subject.key, subject.uid, gpus)
        if unchecked is not None and not subject.dry_run:
            NGC_UNCHECKED.labels(unchecked.why).inc()
        reason = AUDIT[problems[0][0]] if problems else ALLOWED
        told = None if audit or problems else self._unshaped_told(policy, subject, where)
        if told is not None:
            texts, reason = [told], NOT_SHAPED_ALLOWED
        return self._decision(allowed(uid, warnings=warnings + texts), reason, subject, texts)

    def _validate_claims(self, uid: str, subject: Subject) -> Decision:
        """A pod whose GPUs are claims, in a `dra` namespace with a quota: what the API server will charge it
        (gpu_placement/decide/dra_quota.py: its stand-ins per level at its create, its claims' devices per class and
        requests.<extendedResourceName> when they are made) against the figures the mirror writes, so the
        pod is refused with a sentence instead of waiting on claims the API server refuses."""
        namespace = subject.namespace
        spec = subject.pod["spec"]
        with self.view.lock:
            monitor = self.view.dra.pod_claims(namespace, spec).monitor
        if monitor:  # admin access shares devices in use: nothing of gpu-placement's quota is charged or held
            return self._decision(allowed(uid), MONITOR, subject)
        policy = self.policy(namespace)
        if policy.mode(self.config) != "dra" or policy.quota is None or n.ANN_QUOTA in policy.errors:
            return self._decision(allowed(uid), ALLOWED, subject)
        with self.view.lock:
            dra = self.view.dra
            charge = claim_charge(dra, namespace, spec, pod_standins(spec))
            claims = claim_hard(policy.quota, self.config, dra.classes)
            hard = {key: int(value) for key, value in claims.items()}
            used = claim_usage(self.view.namespace_usage.get(namespace) or {},
                               dra.namespace_devices.get(namespace) or {}, dra.classes, hard,
                               dra.namespace_extended.get(namespace), dra.namespace_monitors.get(namespace))
            # The figures the mirror writes (its monitors' room included): the gate waits for exactly those.
            mirrored = mirror_hard(policy.quota, self.config, True, dra.classes, monitor_devices(self.view, namespace),
                                   claims) if self.quota_gate else {}
            # Admitted claim pods whose claims do not all exist yet (webhook/quota.py): without them two pods
            # created at once both pass, and the API server then refuses the second one's claims.
            pending = self.reservations.pending(namespace, exclude=subject.key)
            enforced = self.view.resourcequotas.get(namespace)
        asks = tuple((key, count) for key, count in charge.asks if key in hard)
        names = claim_names(hard, self.config)
        # Holds only warn, as for device-plugin pods: a caller that is not the API server can make them
        # (docs/webhook.md). The API server refuses the pod at its create (its stand-ins), else its claims.
        problems = self._unlisted(namespace, policy.quota, charge)
        for kind in by_kind(asks):
            problems = problems or quota_problems(namespace, hard, used, kind, names)
        if not problems and self.quota_gate:
            problems = keys_pending(namespace, mirrored, enforced, [key for key, _ in asks], names, self.view.clock())
        held: list[str] = []
        for kind in by_kind(asks) if not problems else ():  # the first kind over is worth a sentence, as above
            held = held or held_warnings(namespace, hard, used, pending, kind, names)
        texts = [text for _, text in problems]
        refused = bool(problems) and self.config.mode != "audit"
        if not subject.dry_run:
            with self.view.lock:
                if refused:  # an earlier call for this pod allowed it: that create is not happening
                    self.reservations.release(namespace, subject.key, subject.uid)
                elif asks:
                    self.reservations.hold(namespace, subject.key, subject.uid, asks, template_claims(spec),
                                           standins=charge.covered)
        if not problems:
            return self._decision(allowed(uid, warnings=held), ALLOWED, subject, held)
        if not refused:
            return self._decision(allowed(uid, warnings=texts), AUDIT[problems[0][0]], subject, texts)
        retriable = problems[0][0] in _RETRIABLE and len(problems) == 1
        response = denied(uid, _joined(texts), 503, "ServiceUnavailable") if retriable else denied(uid, _joined(texts))
        return self._decision(response, problems[0][0], subject, texts)

    def _unlisted(self, namespace: str, quota: Mapping[str, int], charge: ClaimCharge) -> list[tuple[str, str]]:
        """NotInQuota for a level of the pod's claims whose resource the annotation does not list (a pod
        narrowing to `shared` where the quota gives only whole GPUs), as for a device-plugin pod."""
        asks = tuple((level.resource(self.config), count) for level, count in charge.levels)
        return [p for p in quota_problems(namespace, quota, {}, asks) if p[0] == NOT_IN_QUOTA]

    def _unshaped(self, policy: NamespacePolicy, subject: Subject, where: str) -> list[tuple[str, str]]:
        """A GPU pod in a namespace with a GPU policy that /mutate did not shape (webhook/shaping.py)."""
        if self._dra(policy) and policy.shapes_ok and not self._kept(policy, subject):
            conversion = self._convert(policy, subject)
            if conversion.missing:  # none is kept for a class the quota gives nothing of: say that instead
                unlisted = [p for p in quota_problems(subject.namespace, policy.quota, {}, subject.gpus)
                            if p[0] == NOT_IN_QUOTA] if policy.quota is not None else []
                return unlisted or [(TEMPLATE_PENDING, missing_sentence(conversion.missing, where))]
            return [(NOT_SHAPED, unshaped(conversion.ops, subject.namespace, where))]
        if not policy.shapes_ok or not governed(policy, self.config):
            return []
        ops = self._shape(policy, subject)
        return [(NOT_SHAPED, unshaped(ops, subject.namespace, where))] if ops else []

    def _unshaped_told(self, policy: NamespacePolicy, subject: Subject, where: str) -> str | None:
        """The same pod in a namespace without a GPU policy: let in, and its user told (webhook/shaping.py)."""
        if not policy.shapes_ok or governed(policy, self.config):
            return None
        ops = self._shape(policy, subject)
        return unshaped_warning(ops, where) if ops else None

    def _no_access(self, namespace: str, gpus: GpuRequests) -> str:
        asks = ", ".join(f"{count} {resource}" for resource, count in gpus)
        return (f"namespace {namespace} has no GPU access: it has no {n.ANN_QUOTA} annotation and the default "
                f"namespace policy is deny, and this pod asks for {asks}: ask the platform team to set {n.ANN_QUOTA} "
                f"on namespace {namespace}, e.g. {n.ANN_QUOTA}={gpus[0][0]}={gpus[0][1]}")

    def _escalations(self, policy: NamespacePolicy, asked: Sharing | None, gpus: GpuRequests,
                     where: str) -> list[tuple[str, str]]:
        namespace, given = policy.namespace, policy.sharing
        set_on_ns = f"{n.ANN_SHARING}={given.text} on namespace {namespace}"
        problems: list[tuple[str, str]] = []
        level = given
        if asked is not None:
            if asked.within(given):
                level = asked
            else:
                problems.append((ESCALATION, f"{where} asks {n.ANN_SHARING}={asked.text}, more than namespace "
                                             f"{namespace} gives ({set_on_ns}): a pod may narrow its namespace's "
                                             "sharing, never widen it; remove the annotation from the pod"))
        for resource, count in gpus:
            if sharing_of_resource(resource, self.config).within(level):
                continue
            target = level.resource(self.config)
            if resource == n.GPU_RESOURCE:
                problems.append((ESCALATION, f"{where} asks for {count} {resource}, but GPUs here are served as "
                                             f"{level.text} ({set_on_ns}), so {resource} should have been rewritten "
                                             f"to {target}: the gpu-placement mutating webhook did not run for this "
                                             "pod; check the MutatingWebhookConfiguration, or ask for "
                                             f"{target} directly"))
            else:
                problems.append((ESCALATION, f"{where} asks for {count} {resource}, more than namespace {namespace} "
                                             f"gives ({set_on_ns}): ask for {target} instead"))
        return problems

    # -- shared ------------------------------------------------------------------------------------
    def _guarded(self, request: AdmissionRequest, decide: Callable[[str, Subject], Decision]) -> Decision:
        uid = request["uid"]
        try:
            subject = subject_of(request, self.is_gpu_resource)
        except BadPod as exc:
            return Decision(denied(uid, str(exc), 400, "BadRequest"), BAD_POD, request.get("namespace", ""),
                            request.get("name", ""), [str(exc)])
        if subject is None:
            return Decision(allowed(uid), NOT_A_POD, request.get("namespace", ""), request.get("name", ""))
        if subject.namespace in self.config.exempt_namespaces:
            return self._decision(allowed(uid), EXEMPT, subject)
        return decide(uid, subject)

    @staticmethod
    def _decision(response: AdmissionResponse, reason: str, subject: Subject,
                  problems: list[str] | None = None) -> Decision:
        return Decision(response, reason, subject.namespace, subject.name, problems or [], subject.uid)


def _remembered(test: Callable[[str], bool], limit: int = 1024) -> Callable[[str], bool]:
    """`test`, its answers kept for the first `limit` names asked (a review may name anything: bounded)."""
    known: dict[str, bool] = {}

    def remembered(name: str) -> bool:
        answer = known.get(name)
        if answer is None:
            answer = test(name)
            if len(known) < limit:
                known[name] = answer
        return answer

    return remembered


def _joined(texts: list[str]) -> str:
    return texts[0] if len(texts) == 1 else f"{len(texts)} problems: " + " ".join(
        f"({i}) {text};" for i, text in enumerate(texts, 1)).rstrip(";")


def _is_daemonset_pod(pod: dict[str, Any]) -> bool:
    owners = (pod.get("metadata") or {}).get("ownerReferences") or ()
    return any(owner.get("kind") == "DaemonSet" for owner in owners)


def _changed_annotations(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """gpu-placement.io/* annotation keys added, removed or changed between two versions of a pod."""
    def ours(pod: dict[str, Any]) -> dict[str, Any]:
        annotations = (pod.get("metadata") or {}).get("annotations") or {}
        return {k: v for k, v in annotations.items() if k.startswith(n.PREFIX)} if isinstance(annotations, dict) else {}

    before, after = ours(old), ours(new)
    return sorted(key for key in before.keys() | after.keys() if before.get(key) != after.get(key))
