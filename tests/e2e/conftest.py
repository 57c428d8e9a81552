"""Fixtures of the end-to-end suite (`make e2e`; pyproject's norecursedirs keeps it out of `make test`).

One control plane for the whole session (cold start to a ready API is measured), the chart
installed on it, the webhook and the scheduler pod (kube-scheduler + extender sidecar) running
from the rendered manifests. Each test makes its own namespace and its own nodes, labelled with a
group of its own that its pods select, so tests do not see each other's capacity.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
import yaml

from gpu_placement.base.config import Config
from gpu_placement.base.names import LABEL_REFUSED
from gpu_placement.facts.namespaces import NamespaceRecord
from gpu_placement.facts.policy import parse_policy
from tests.e2e.cluster import (
    ADMIN_TOKEN,
    Api,
    ControlPlane,
    Kubelets,
    gate_open,
    namespace,
    retrying_503,
    start_control_plane,
    wait_for,
)
from tests.e2e.deploy import GPU_PLACEMENT, NAMESPACE, Pod, find, install, render, wait_ready, webhook_port
from tests.e2e.supervisor import Supervisor

Obj = dict[str, Any]
WEBHOOK = "gpu-placement-webhook"
SCHEDULER = "gpu-placement-scheduler"
_ids = itertools.count()
# klog warnings of every run that say nothing about a failure: the webhook's denials, which tests
# provoke, and the missing request-header CA of a control plane without an aggregator.
NOISE = ("rejected by webhook", "extension-apiserver-authentication")


@dataclass
class E2E:
    plane: ControlPlane
    api: Api
    kubelets: Kubelets
    docs: list[Obj]
    webhooks: list[Pod] = field(default_factory=list)
    scheduler: Pod | None = None
    probed: dict[str, dict[str, float]] = field(default_factory=dict)  # container -> seconds per probe
    supervisor: Supervisor = field(init=False)
    extra_pods: list[Pod] = field(default_factory=list)  # other replicas a test runs (a standby scheduler)
    _service: Obj | None = None

    def __post_init__(self) -> None:
        # kubelet's part for the chart's pods: restarts, probes; the webhook Service follows readiness.
        self.supervisor = Supervisor(on_ready_change=self.route_webhooks)

    # -- the chart's processes
    def start_webhook(self, replica: int = 0, extra_args: tuple[str, ...] = ()) -> Pod:
        pod = Pod(self.plane, self.docs, WEBHOOK, replica)
        proc = pod.start("webhook", extra_args)
        if pod not in self.webhooks:
            self.webhooks.append(pod)
        self.supervisor.watch(pod, "webhook")
        wait_ready(proc, self.webhook_url(pod, "/readyz"))
        # Ready by the chart's probes as the supervisor runs them, and so among the Service's endpoints.
        self.probed[proc.name] = {"ready": self.supervisor.wait_ready(pod, "webhook")}
        return pod

    def stop_webhook(self, replica: int) -> None:
        """That replica gone from behind the Service, its process stopped."""
        for pod in [p for p in self.webhooks if p.replica == replica]:
            pod.stop()
            self.webhooks.remove(pod)
        self.route_webhooks()

    def upgrade(self, values: Obj) -> None:
        """`helm upgrade` with these values: the chart re-applied, the webhook pods rolled (the
        config checksum changed) with fresh processes."""
        self.docs[:] = render(values)
        install(self.api, self.docs)
        self.restart_webhooks()

    def restart_webhooks(self) -> None:
        for pod in self.webhooks:
            pod.stop()
        self.webhooks.clear()
        self.start_webhook(0)

    def route_webhooks(self) -> None:
        """The Service's backends as kube-proxy routes them, the Ready replicas only (a dead one stays
        routed until kubelet notices, as in a cluster), and its EndpointSlice as the endpoint controller
        publishes them (the webhook writes its webhooks once it has one)."""
        assert self.plane.proxy is not None
        if self._service is None:  # fixed once created; read again, it would fail while the API is down
            self._service = self.api.get(f"/api/v1/namespaces/{NAMESPACE}/services/{WEBHOOK}")["spec"]
        backends = [("127.0.0.1", webhook_port(p, self.docs)) for p in self.webhooks
                    if self.supervisor.ready(p, "webhook")]
        for port in self._service["ports"]:
            self.plane.proxy.route(self._service["clusterIP"], port["port"], backends)
        # While the API server is down (a fault scenario) the routes above are what serves.
        with contextlib.suppress(httpx.HTTPError, RuntimeError):
            self.api.apply({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                            "metadata": {"name": f"{WEBHOOK}-e2e", "namespace": NAMESPACE,
                                         "labels": {"kubernetes.io/service-name": WEBHOOK,
                                                    "endpointslice.kubernetes.io/managed-by": "e2e-harness"}},
                            "endpoints": [{"addresses": [f"10.244.0.{i + 1}"], "conditions": {"ready": True}}
                                          for i in range(len(backends))],
                            "ports": [{"name": "https", "port": 8443, "protocol": "TCP"}]})

    def webhook_url(self, pod: Pod, path: str) -> str:
        return f"https://127.0.0.1:{webhook_port(pod, self.docs)}{path}"

    def start_scheduler(self, replica: int = 0) -> Pod:
        """A scheduler pod (the extender sidecar, then kube-scheduler once the sidecar's startup probe
        passes); replica 0 is `self.scheduler`, another one is a standby for the leader Lease."""
        pod = self.scheduler if self.scheduler and replica == self.scheduler.replica else Pod(
            self.plane, self.docs, SCHEDULER, replica)
        if replica == 0:
            self.scheduler = pod
        extender = pod.start("extender")
        self.supervisor.watch(pod, "extender")
        wait_ready(extender, f"{self.extender_url(pod)}/readyz")
        # kubelet starts kube-scheduler once the sidecar's startup probe passes (a native sidecar).
        self.probed[extender.name] = {"ready": self.supervisor.wait_ready(pod, "extender")}
        if "kube-scheduler" not in pod.procs or not pod.procs["kube-scheduler"].alive():
            pod.start("kube-scheduler")
            self.supervisor.watch(pod, "kube-scheduler")
        return pod

    def extender_url(self, pod: Pod | None = None) -> str:
        pod = pod or self.scheduler
        assert pod is not None
        return f"http://127.0.0.1:{pod.local_port(8888)}"

    def extender_seconds(self, verb: str) -> tuple[int, float, float, float]:
        """(requests, mean, p50, p99) of the extender's answer time for a verb, from its /metrics
        histogram (quantiles interpolated within buckets, as PromQL's histogram_quantile does)."""
        text = httpx.get(f"{self.extender_url()}/metrics", timeout=5).text
        buckets: list[tuple[float, float]] = []
        count = total = 0.0
        for line in text.splitlines():  # labels come sorted by name: le sits between component and verb
            if 'component="extender"' not in line or f'verb="{verb}"' not in line:
                continue
            value = float(line.rsplit(" ", 1)[1])
            if line.startswith("gpu_placement_request_seconds_bucket{"):
                bound = line.split('le="', 1)[1].split('"', 1)[0]
                buckets.append((float(bound), value))
            elif line.startswith("gpu_placement_request_seconds_count{"):
                count = value
            elif line.startswith("gpu_placement_request_seconds_sum{"):
                total = value

        def quantile(q: float) -> float:
            lower, below = 0.0, 0.0
            for upper, cumulative in sorted(buckets):
                if cumulative >= q * count:
                    inside = cumulative - below
                    return lower + (upper - lower) * ((q * count - below) / inside if inside else 1.0)
                lower, below = upper, cumulative
            return lower

        return int(count), total / count if count else 0.0, quantile(0.5), quantile(0.99)

    def webhook_requests(self) -> dict[str, float]:
        """Admission requests answered, per path, summed over the webhook replicas (their /metrics)."""
        totals: dict[str, float] = {}
        for pod in self.webhooks:
            if not pod.procs["webhook"].alive():
                continue
            text = httpx.get(self.webhook_url(pod, "/metrics"), verify=False, timeout=5).text
            for line in text.splitlines():
                if line.startswith("gpu_placement_request_seconds_count{") and 'component="webhook"' in line:
                    verb = line.split('verb="', 1)[1].split('"', 1)[0]
                    totals[verb] = totals.get(verb, 0.0) + float(line.rsplit(" ", 1)[1])
        return totals

    def webhook_pod_events(self) -> list[float]:
        """Pod watch events each live webhook replica has applied to its view (its /metrics)."""
        counts = []
        for pod in self.webhooks:
            if not pod.procs["webhook"].alive():
                continue
            text = httpx.get(self.webhook_url(pod, "/metrics"), verify=False, timeout=5).text
            counts.append(sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                              if line.startswith('gpu_placement_watch_events_total{kind="pods"')))
        return counts

    def created_and_seen(self, create: Callable[[], httpx.Response]) -> httpx.Response:
        """`create`, then wait until every webhook replica's view has applied a pod event since: the
        namespace's quota is each replica's own count (and the holds of the pods it admitted), so a next
        create that another replica answers sees this pod only once its watch showed it. Until then
        the mirrored ResourceQuota is the backstop, with the API server's wording."""
        before = self.webhook_pod_events()
        response = create()
        wait_for("every webhook replica's view to show the pod",
                 lambda: all(after > was for after, was in zip(self.webhook_pod_events(), before, strict=True)),
                 timeout=30, interval=0.1)
        return response

    # -- test objects
    def namespace(self, prefix: str, annotations: dict[str, str] | None = None, opted_in: bool = True,
                  wait_quota: bool = True) -> str:
        """A namespace ready for pods, opted in to gpu-placement (the chart's default namespaceSelection is
        optIn); with `wait_quota`, its gpu-placement.io/quota in force."""
        labels = {"gpu-placement.io/enabled": "true"} if opted_in else {}
        name = namespace(self.api, f"{prefix}-{next(_ids)}", labels, annotations)
        quota = quota_of(annotations or {})
        # /validate refuses GPU pods (QuotaPending) until the quota is in force.
        if quota and opted_in and wait_quota and self.quota_mirrored():
            wait_for(f"ResourceQuota {name}/gpu-placement in force", lambda: self.quota_in_force(name, quota))
            gate_open(name, [lambda r=resource: self.gpu_pod(name, "gate-probe", "nowhere", resource=r, dryRun="All")
                             for resource in quota])
        return name

    def quota_mirrored(self) -> bool:
        """The running chart mirrors quotas into ResourceQuotas (not audit mode, not --no-quota-mirror)."""
        args = find(self.docs, "Deployment", WEBHOOK)["spec"]["template"]["spec"]["containers"][0]["args"]
        return "--no-quota-mirror" not in args and self.config().get("mode", "enforce") != "audit"

    def quota_in_force(self, namespace: str, quota: dict[str, int]) -> bool:
        """The API server enforces the quota: the mirrored ResourceQuota's status, counted by the quota
        controller, holds each figure (what quota admission reads)."""
        r = self.api.http.get(f"/api/v1/namespaces/{namespace}/resourcequotas/gpu-placement")
        if r.status_code != 200:
            return False
        status = r.json().get("status") or {}
        return all(status.get("hard", {}).get(f"requests.{res}") == str(count) and f"requests.{res}" in
                   status.get("used", {}) for res, count in quota.items())

    def nodes(self, group: str, specs: list[tuple[str, str | None, dict[str, Any]]],
              validators: bool = True) -> list[str]:
        """Nodes `<group>-<suffix>` from fixture bases, labelled e2e-group=<group>, kept alive."""
        names = []
        for suffix, base, kwargs in specs:
            name = f"{group}-{suffix}"
            labels = {"e2e-group": group, **kwargs.pop("labels", {})}
            ready_validator = kwargs.pop("validator_ready", True)
            self.kubelets.add_node(name, base, labels=labels, **kwargs)
            if validators and ready_validator is not None:
                self.kubelets.add_validator(name, ready=ready_validator)
            names.append(name)
        self.kubelets.wait_schedulable(names)
        return names

    def gpu_pod(self, namespace: str, name: str, group: str, gpus: int = 1, resource: str = "nvidia.com/gpu",
                annotations: dict[str, str] | None = None,
                image: str = "nvcr.io/nvidia/cuda:12.2.0-runtime-ubuntu22.04", retry: bool = True,
                **params: Any) -> httpx.Response:
        """Created as a client does it: the webhook's 503s retried (`retrying_503`); `retry=False` where a
        test counts them (bursts against a quota not in force yet)."""
        pod = gpu_pod_manifest(namespace, name, group, gpus, resource, annotations, image)

        def create() -> httpx.Response:
            return self.api.create(f"/api/v1/namespaces/{namespace}/pods", pod, **params)

        return retrying_503(create) if retry else create()

    def pod(self, namespace: str, name: str) -> Obj:
        return self.api.get(f"/api/v1/namespaces/{namespace}/pods/{name}")

    def wait_bound(self, namespace: str, name: str, timeout: float = 30.0) -> str:
        try:
            return str(wait_for(f"pod {namespace}/{name} bound",
                                lambda: self.pod(namespace, name)["spec"].get("nodeName"), timeout=timeout))
        except TimeoutError as exc:  # say why, as `kubectl describe` would
            status = self.pod(namespace, name).get("status", {})
            raise TimeoutError(f"{exc}; conditions {status.get('conditions')}") from None

    def wait_bound_once_verified(self, namespace: str, name: str, node: str, timeout: float = 15.0) -> str:
        """wait_bound for a pod whose only fitting node was just verified; when it times out, the
        message says whose the delay is (`scheduling_story`)."""
        try:
            return self.wait_bound(namespace, name, timeout=timeout)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}\n{self.scheduling_story(namespace, name, node)}") from None

    def scheduling_story(self, namespace: str, name: str, node: str) -> str:
        """Why a pod is not bound to `node`: kube-scheduler's attempts at it (its log at verbosity 2 has
        a line for each), the validator as the API server has it, the extender's waits for its view and
        what it answers for the pod now; then the verdict: the node is not verified; or the extender
        passes it now, so kube-scheduler parked the pod after an answer from a lagging view (nothing it
        listens to happened since); or the extender's view never took the validator's Ready."""
        assert self.scheduler is not None
        pod = self.pod(namespace, name)
        lines: list[str] = []
        log = self.scheduler.procs["kube-scheduler"].log_path.read_text(errors="replace").splitlines()
        tried = [line for line in log if f'pod="{namespace}/{name}"' in line and (
            "Unable to schedule pod" in line or "Successfully bound" in line or "Error scheduling" in line)]
        lines.append(f"kube-scheduler: {len(tried)} attempts logged; the last: "
                     f"{tried[-1][:300] if tried else 'none'}")
        validator = self.api.http.get(f"/api/v1/namespaces/gpu-operator/pods/nvidia-operator-validator-{node}")
        ready = [c for c in validator.json().get("status", {}).get("conditions", []) if c["type"] == "Ready"] \
            if validator.status_code == 200 else []
        lines.append(f"the validator in the API server: {ready or validator.status_code}")
        metrics = httpx.get(f"{self.extender_url()}/metrics", timeout=5).text  # before the probe below waits
        settle = ("gpu_placement_filter_settle_seconds_count", "gpu_placement_filter_settle_denied_total")
        lines += ["the extender's waits for its view:", *(f"  {line}" for line in metrics.splitlines()
                                                         if line.startswith(settle))]
        answer = httpx.post(f"{self.extender_url()}/filter", timeout=10,
                            content=json.dumps({"Pod": pod, "Nodes": None, "NodeNames": [node]})).json()
        passes = node in (answer.get("NodeNames") or [])
        lines.append("the extender now: " + ("passes the node" if passes else json.dumps(
            {k: answer.get(k) for k in ("FailedNodes", "FailedAndUnresolvableNodes", "Error")})))
        if not any(c.get("status") == "True" for c in ready):
            verdict = "the node is not verified in the API server: its validator is not Ready"
        elif passes:
            verdict = ("kube-scheduler parked the pod: its last attempt was answered from a view that had not "
                       "applied the validator's Ready yet, and no event it listens to followed")
        else:
            verdict = "the extender's view never took the validator's Ready"
        lines.append(f"=> {verdict}")
        return "\n".join(lines)

    def scheduled_condition(self, namespace: str, name: str, timeout: float = 30.0) -> Obj:
        def unschedulable() -> Obj | None:
            for cond in self.pod(namespace, name).get("status", {}).get("conditions", []):
                if cond["type"] == "PodScheduled" and cond["status"] == "False":
                    return dict(cond)
            return None
        return dict(wait_for(f"pod {namespace}/{name} PodScheduled=False", unschedulable, timeout=timeout))

    def unschedulable_message(self, namespace: str, name: str, part: str, timeout: float = 30.0) -> str:
        """kube-scheduler's PodScheduled=False message once it holds `part` (it retries an unschedulable pod
        as the cluster changes: the message a user reads is the last one); the last seen in the error."""
        seen: list[str] = []

        def holds() -> str | None:
            for cond in self.pod(namespace, name).get("status", {}).get("conditions", []):
                if cond["type"] == "PodScheduled" and cond["status"] == "False":
                    seen[:] = [str(cond["message"])]
            return seen[0] if seen and part in seen[0] else None
        try:
            return str(wait_for(f"pod {namespace}/{name}'s PodScheduled message with {part!r}", holds,
                                timeout=timeout, interval=0.3))
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; the last: {seen[0] if seen else None}") from None

    def refused_label(self, node: str) -> str | None:
        """gpu-placement.io/refused as the node carries it (config.refusedNodeLabel: the webhook's leader
        writes the code of the node-level reason every GPU pod is refused there for)."""
        labels = self.api.get(f"/api/v1/nodes/{node}")["metadata"].get("labels") or {}
        value = labels.get(LABEL_REFUSED)
        return str(value) if value is not None else None

    def wait_refused(self, expected: dict[str, str | None], timeout: float = 30.0) -> None:
        """Until each node carries gpu-placement.io/refused=<code> (None: no such label)."""
        def labelled() -> bool:
            return all(self.refused_label(node) == code for node, code in expected.items())
        try:
            wait_for(f"gpu-placement.io/refused on {sorted(expected)}", labelled, timeout=timeout, interval=0.2)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}: {({node: self.refused_label(node) for node in expected})}") from None

    def explain(self, namespace: str, name: str) -> Obj:
        """`gpu-placement explain pod/NAME -n NS -o json` as a platform engineer runs it, through a kubeconfig
        against the live API server, with the chart's deployed configuration."""
        kubeconfig = self.api.kubeconfig(self.plane.work / "explain.kubeconfig", ADMIN_TOKEN, "e2e-admin")
        done = subprocess.run([GPU_PLACEMENT, "explain", f"pod/{name}", "-n", namespace, "--kubeconfig",
                               str(kubeconfig), "-o", "json"], capture_output=True, text=True, timeout=120,
                              check=False)
        assert done.returncode in (0, 4), done.stdout[-2000:] + done.stderr[-2000:]
        return dict(json.loads(done.stdout))

    def events(self, namespace: str, name: str) -> list[Obj]:
        items = self.api.get(f"/api/v1/namespaces/{namespace}/events",
                             fieldSelector=f"involvedObject.name={name}")["items"]
        return list(items)

    def config(self) -> Obj:
        """The service's configuration as the chart rendered it (config.yaml of its ConfigMap)."""
        cm = next(d for d in self.docs if d["kind"] == "ConfigMap" and "config.yaml" in d.get("data", {}))
        return dict(yaml.safe_load(cm["data"]["config.yaml"]) or {})

    def diagnosis(self, lines: int = 12) -> str:
        """Every process of the run: alive or how it ended, and its last words (warnings and errors of
        the Go components, the last lines of ours), with what the supervisor did: a failure explains
        itself without a rerun."""
        procs = [*self.plane.procs.values(), *(p for pod in self.chart_pods() for p in pod.procs.values())]
        out = [f"supervisor: {event}" for event in self.supervisor.events[-15:]]
        for proc in procs:
            state = "running" if proc.alive() else f"exited {proc.popen.returncode if proc.popen else '?'}"
            tail = proc.tail(400).splitlines()
            if proc.name in self.plane.procs or proc.name.endswith("kube-scheduler"):  # klog: keep E and W lines
                tail = [line for line in tail if line[:1] in ("E", "W", "F") and not any(
                    noise in line for noise in NOISE)]
            out.append(f"--- {proc.name} ({state}), {proc.log_path}:")
            out += tail[-lines:]
        return "\n".join(out)

    def chart_pods(self) -> list[Pod]:
        pods = [*self.webhooks, *([self.scheduler] if self.scheduler else [])]
        return pods + [p for p in self.extra_pods if p not in pods]

    def ca_bundle_trusted(self) -> bool:
        """The replica wrote the webhooks into the (empty) configurations, each with a caBundle."""
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            obj = self.api.get(f"/apis/admissionregistration.k8s.io/v1/{kind}/gpu-placement")
            hooks = obj.get("webhooks") or []
            if not hooks or not all(w["clientConfig"].get("caBundle") for w in hooks):
                return False
        return True


def gpu_pod_manifest(namespace: str, name: str, group: str, gpus: int = 1, resource: str = "nvidia.com/gpu",
                     annotations: dict[str, str] | None = None,
                     image: str = "nvcr.io/nvidia/cuda:12.2.0-runtime-ubuntu22.04") -> Obj:
    """A GPU pod as a user writes it, on the nodes of one test's group (`e2e-group`)."""
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
            "spec": {"nodeSelector": {"e2e-group": group}, "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": image, "resources": {
                         "limits": {resource: str(gpus)} if gpus else {},
                         "requests": {"cpu": "100m", "memory": "128Mi"}}}]}}


def quota_of(annotations: dict[str, str]) -> dict[str, int]:
    """The gpu-placement.io/quota annotation as the webhook parses it; {} when absent or broken."""
    if "gpu-placement.io/quota" not in annotations:
        return {}
    policy = parse_policy(NamespaceRecord("probe", dict(annotations)), "probe", Config())
    return dict(policy.quota or {})


def admitted(pod: Obj) -> Obj:
    return dict(json.loads(pod["metadata"]["annotations"]["gpu-placement.io/admitted"]))


_SESSION: list[E2E] = []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report = outcome.get_result()  # type: ignore[attr-defined]
    if report.failed and _SESSION:
        report.sections.append(("e2e processes at the failure", _SESSION[0].diagnosis()))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    from tests.e2e.faults import SUMMARY
    if SUMMARY:
        terminalreporter.section("fault scenarios and soak")
        for line in SUMMARY:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def plane(request: pytest.FixtureRequest) -> Iterator[ControlPlane]:
    plane = start_control_plane()
    try:
        yield plane
    finally:
        plane.stop()
        if request.session.testsfailed:  # every process's log is there
            print(f"\ne2e: control plane logs kept in {plane.work}")
        else:
            shutil.rmtree(plane.work, ignore_errors=True)


@pytest.fixture(scope="session")
def e2e(plane: ControlPlane) -> Iterator[E2E]:
    with chart_running(plane) as env:
        yield env


@contextlib.contextmanager
def chart_running(plane: ControlPlane, lease_renew_seconds: float = 10.0, values: Obj | None = None) -> Iterator[E2E]:
    """The chart installed on `plane` (with `values` over its defaults), its webhook and scheduler pod
    running, kubelets emulated (the suite's fixture; benchmarks/scheduler_bench.py uses it too, with
    Leases renewed less often at 5,000 nodes: within kube-controller-manager's 120 s grace period)."""
    assert plane.api is not None
    api = plane.api
    kubelets = Kubelets(api, renew_every=lease_renew_seconds)
    docs = render(values)
    env = E2E(plane, api, kubelets, docs)
    try:
        for ns in ("gpu-operator",):
            env.api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        wait_for("serviceaccount gpu-operator/default", lambda: api.http.get(
            "/api/v1/namespaces/gpu-operator/serviceaccounts/default").status_code == 200)
        install(api, docs)
        env.start_webhook(0)
        wait_for("the webhooks written, with the caBundle of --manage-certs", env.ca_bundle_trusted, timeout=60,
                 interval=0.5)
        env.start_scheduler()
        wait_for("the scheduler's leader Lease", lambda: api.http.get(
            f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/gpu-placement").status_code == 200,
            timeout=60)
        _SESSION.append(env)
        yield env
    finally:
        _SESSION.clear()
        env.supervisor.stop()
        kubelets.stop()
        for pod in env.chart_pods():
            pod.stop()
