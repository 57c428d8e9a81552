"""A real Kubernetes control plane on loopback for the end-to-end suite, without kubelets.

etcd, kube-apiserver (TLS, token and ServiceAccount auth, RBAC, the default admission plugins),
kube-controller-manager and kube-scheduler run as child processes in a temp dir, each on a free
port, each in its own process group, all stopped at the end whatever happens (atexit as the last
resort). The binaries come from tests/e2e/build_control_plane.sh (built once from Go modules).

What kubelets would do, the harness does: it creates GPU Nodes from the GFD label fixtures, patches
their status, renews their Leases in kube-node-lease (the node lifecycle controller taints a node
whose heartbeat stops), creates the GPU Operator's validator pods bound and Ready, marks pods Running
once they are bound and removes pods being deleted from their node.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import datetime as dt
import itertools
import json
import os
import select
import signal
import socket
import socketserver
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import trustme
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from gpu_placement.samples.cluster import make_node, validator_pod

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "tests" / "e2e" / "build_control_plane.sh"
Obj = dict[str, Any]

ADMIN_TOKEN = "e2e-admin-" + base64.b32encode(os.urandom(10)).decode().lower()


def binaries_dir() -> Path:
    """The folder holding kube-apiserver, kube-controller-manager, kube-scheduler and etcd: the
    build script finds them cached (instant) or builds them, and says where they are."""
    run = subprocess.run(["bash", str(BUILD_SCRIPT), "--print-dir"], stdout=subprocess.PIPE, text=True, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed (exit {run.returncode}); see its messages above")
    return Path(run.stdout.strip().splitlines()[-1])


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def now_rfc3339(micro: bool = False) -> str:
    t = dt.datetime.now(dt.UTC)
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ" if micro else "%Y-%m-%dT%H:%M:%SZ")


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (httpx.HTTPError, OSError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what} (last: {last!r})")


def retrying_503(create: Callable[[], httpx.Response], timeout: float = 30.0,
                 interval: float = 0.2) -> httpx.Response:
    """A create as a client makes it that honours the webhook's 503 (QuotaPending, TemplatePending,
    NamespaceUnknown: nothing is wrong with the pod, "try again in a few seconds"; controllers retry by
    themselves): the same request again every `interval` while the answer is 503, and the first other
    answer; after `timeout`, the 503, for the test's assertion to show. Every e2e create of a GPU pod made
    after a quota was set or changed goes through it (E2E.gpu_pod does by default): the gate may refuse
    again after a probe passed (a figure counted anew, a DeviceClass the webhook's view saw meanwhile that
    adds keys the pod is charged), and a fixed wait is a race."""
    deadline = time.monotonic() + timeout
    waited: list[str] = []  # the 503s' messages: shown with the test's output (pytest -rP, or on failure)
    while True:
        answer = create()
        if answer.status_code != 503 or time.monotonic() >= deadline:
            if waited:
                print(f"retried a 503 {len(waited)} times, the first: {waited[0]}")
            return answer
        waited.append(answer.text[:400])
        time.sleep(interval)


def gate_open(namespace: str, probes: list[Callable[[], httpx.Response]]) -> None:
    """Once the ResourceQuota is in force: the webhook's quota gate passes a figure SETTLE_SECONDS after its
    watch showed it counted (webhook/quota_gate.py), refusing GPU pods with 503 QuotaPending until then. Waits
    until each probe (a dry-run create: it holds nothing) is answered otherwise, then a moment more for a
    second replica, whose watch may be that much behind the one that answered. Before a burst whose answers
    are counted; a create that must be admitted retries 503s still (`retrying_503`)."""
    wait_for(f"the quota gate open in {namespace}", lambda: all(probe().status_code != 503 for probe in probes),
             timeout=30, interval=0.2)
    time.sleep(0.5)


# -- processes -------------------------------------------------------------------------------------

_LIVE: set[Proc] = set()


@dataclass(eq=False)
class Proc:
    """A child in its own process group, output to a log file; stop() ends the whole group."""

    name: str
    args: list[str]
    log_path: Path
    env: dict[str, str] | None = None
    popen: subprocess.Popen[bytes] | None = None

    def start(self) -> Proc:
        log = self.log_path.open("ab")
        self.popen = subprocess.Popen(self.args, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                      start_new_session=True, env={**os.environ, **(self.env or {})})
        log.close()
        _LIVE.add(self)
        return self

    def alive(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def service_pid(self) -> int | None:
        """The process doing the work, whose CPU time overhead.py reads: this child."""
        return self.popen.pid if self.popen is not None and self.alive() else None

    def stop(self, timeout: float = 10.0) -> None:
        if self.popen is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.popen.pid, signal.SIGTERM)
        try:
            self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
            self.popen.wait()
        _LIVE.discard(self)

    def signal(self, sig: int) -> None:
        """A signal to the whole group: SIGKILL (a crash, an OOM kill), SIGSTOP/SIGCONT (a frozen process)."""
        if self.popen is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)

    def kill(self) -> None:
        """SIGKILL, reaped: nothing of it runs afterwards (a start() may follow, as a restart)."""
        self.signal(signal.SIGKILL)
        if self.popen is not None:
            self.popen.wait()
        _LIVE.discard(self)

    def tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@atexit.register
def _stop_everything() -> None:
    for proc in list(_LIVE):
        proc.stop(timeout=3)


# -- the API -------------------------------------------------------------------------------------

PLURALS = {"ServiceAccount": "serviceaccounts", "ConfigMap": "configmaps", "Service": "services",
           "Deployment": "deployments", "PodDisruptionBudget": "poddisruptionbudgets", "Role": "roles",
           "RoleBinding": "rolebindings", "ClusterRole": "clusterroles", "ClusterRoleBinding": "clusterrolebindings",
           "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
           "ValidatingWebhookConfiguration": "validatingwebhookconfigurations", "Namespace": "namespaces",
           "Secret": "secrets", "Pod": "pods", "Node": "nodes", "Lease": "leases", "ResourceQuota": "resourcequotas",
           "EndpointSlice": "endpointslices", "NetworkPolicy": "networkpolicies",
           "ResourceSlice": "resourceslices", "DeviceClass": "deviceclasses", "ResourceClaim": "resourceclaims",
           "ResourceClaimTemplate": "resourceclaimtemplates", "DeviceTaintRule": "devicetaintrules"}
CLUSTER_SCOPED = {"ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration",
                  "ValidatingWebhookConfiguration", "Namespace", "Node", "ResourceSlice", "DeviceClass",
                  "DeviceTaintRule"}


class Api:
    """A thin admin client (httpx): paths, JSON in and out, what the API server answers."""

    def __init__(self, server: str, ca: Path, token: str) -> None:
        self.server, self.ca, self.token = server, ca, token
        self.http = httpx.Client(base_url=server, verify=str(ca), timeout=30.0,
                                 headers={"Authorization": f"Bearer {token}"},
                                 limits=httpx.Limits(max_connections=64, max_keepalive_connections=64))

    def close(self) -> None:
        self.http.close()

    @staticmethod
    def path(kind: str, name: str | None = None, namespace: str | None = None, api_version: str = "v1") -> str:
        base = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
        ns = "" if kind in CLUSTER_SCOPED or namespace is None else f"/namespaces/{namespace}"
        return f"{base}{ns}/{PLURALS[kind]}" + (f"/{name}" if name else "")

    def get(self, path: str, **params: Any) -> Obj:
        r = self.http.get(path, params=params)
        r.raise_for_status()
        return dict(r.json())

    def create(self, path: str, body: Obj, **params: Any) -> httpx.Response:
        return self.http.post(path, content=json.dumps(body), params=params,
                              headers={"Content-Type": "application/json"})

    def merge_patch(self, path: str, body: Obj) -> Obj:
        r = self.http.patch(path, content=json.dumps(body), headers={"Content-Type": "application/merge-patch+json"})
        r.raise_for_status()
        return dict(r.json())

    def apply(self, obj: Obj, manager: str = "e2e") -> Obj:
        """Server-side apply, as `kubectl apply --server-side` (and Helm 4) do."""
        meta = obj["metadata"]
        path = self.path(obj["kind"], meta["name"], meta.get("namespace"), obj["apiVersion"])
        r = self.http.patch(path, content=json.dumps(obj), params={"fieldManager": manager, "force": "true"},
                            headers={"Content-Type": "application/apply-patch+yaml"})
        if r.status_code >= 400:
            raise RuntimeError(f"apply {obj['kind']} {meta['name']}: {r.status_code} {r.text}")
        return dict(r.json())

    def delete(self, path: str, grace: int | None = None) -> httpx.Response:
        params = {} if grace is None else {"gracePeriodSeconds": str(grace)}
        return self.http.delete(path, params=params)

    def token_for(self, namespace: str, service_account: str, seconds: int = 6 * 3600) -> str:
        """A TokenRequest for the ServiceAccount: what the kubelet would mount into its pod."""
        r = self.create(f"/api/v1/namespaces/{namespace}/serviceaccounts/{service_account}/token",
                        {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                         "spec": {"expirationSeconds": seconds}})
        r.raise_for_status()
        return str(r.json()["status"]["token"])

    def kubeconfig(self, path: Path, token: str, user: str) -> Path:
        config = {"apiVersion": "v1", "kind": "Config", "current-context": "e2e",
                  "clusters": [{"name": "e2e", "cluster": {"server": self.server,
                                                           "certificate-authority": str(self.ca)}}],
                  "users": [{"name": user, "user": {"token": token}}],
                  "contexts": [{"name": "e2e", "context": {"cluster": "e2e", "user": user}}]}
        path.write_text(yaml.safe_dump(config))
        path.chmod(0o600)
        return path


# -- the Service network: an HTTP CONNECT proxy as the API server's "cluster" egress ----------------

class ServiceProxy:
    """What kube-proxy gives the API server: a Service's ClusterIP:port reaches its backends. The
    API server sends every connection to the cluster network (webhooks by Service reference among
    them) through its egress selector; this is that proxy (HTTP CONNECT on a Unix socket), with
    routes to the processes the harness runs. So the chart's webhook configurations stay exactly
    as rendered (clientConfig.service, no URL), and the API server checks the webhook's
    certificate against the Service's DNS name (`name.namespace.svc`), as in a cluster."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path
        self.routes: dict[str, list[tuple[str, int]]] = {}
        self._rr = itertools.count()
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._handle(self.request)

        class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
            daemon_threads = True
            request_queue_size = 512  # the API server opens connections in bursts; 5 drops some

        self.server = Server(str(socket_path), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="service-proxy", daemon=True)
        self.thread.start()

    def route(self, cluster_ip: str, port: int, backends: list[tuple[str, int]]) -> None:
        """The API server dials a Service by its ClusterIP (its service resolver), as kube-proxy routes.
        `backends` are the Service's ready endpoints: the harness updates them as readiness changes."""
        self.routes[f"{cluster_ip}:{port}"] = list(backends)

    def _handle(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = client.recv(4096)
            if not chunk:
                return
            head += chunk
        target = head.split(b"\r\n", 1)[0].split(b" ")[1].decode()
        backends = self.routes.get(target) or []
        upstream = None
        if backends:  # one endpoint per connection, as kube-proxy picks it: a dead one is not skipped
            host, port = backends[next(self._rr) % len(backends)]
            with contextlib.suppress(OSError):
                upstream = socket.create_connection((host, port), timeout=5)
        if upstream is None:
            client.sendall(b"HTTP/1.1 503 Service Unavailable\r\n\r\n")
            return
        client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
        upstream.settimeout(None)
        _pipe(client, upstream)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _pipe(a: socket.socket, b: socket.socket) -> None:
    peers = {a: b, b: a}
    try:
        while True:
            ready, _, _ = select.select(list(peers), [], [], 60)
            if not ready:
                continue
            for s in ready:
                data = s.recv(65536)
                if not data:
                    return
                peers[s].sendall(data)
    except OSError:
        return
    finally:
        a.close()
        b.close()


# -- the control plane -------------------------------------------------------------------------------

@dataclass
class ControlPlane:
    bin_dir: Path
    work: Path
    procs: dict[str, Proc] = field(default_factory=dict)
    api: Api | None = None
    proxy: ServiceProxy | None = None
    server: str = ""
    startup_seconds: float = 0.0

    @property
    def ca_path(self) -> Path:
        return self.work / "ca.crt"

    def start(self) -> ControlPlane:
        t0 = time.monotonic()
        w = self.work
        ca = trustme.CA()
        ca.cert_pem.write_to_path(str(w / "ca.crt"))
        serving = ca.issue_cert("127.0.0.1", "localhost", "kubernetes", "kubernetes.default",
                                "kubernetes.default.svc", "kubernetes.default.svc.cluster.local", "10.0.0.1")
        serving.private_key_and_cert_chain_pem.write_to_path(str(w / "apiserver.pem"))
        sa_key = ec.generate_private_key(ec.SECP256R1())
        (w / "sa.key").write_bytes(sa_key.private_bytes(serialization.Encoding.PEM,
                                                         serialization.PrivateFormat.TraditionalOpenSSL,
                                                         serialization.NoEncryption()))
        (w / "sa.pub").write_bytes(sa_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                                     serialization.PublicFormat.SubjectPublicKeyInfo))
        # Static tokens: the test's admin, and the two control-plane components with their own
        # user names (the default RBAC bindings for system:kube-controller-manager and
        # system:kube-scheduler apply to them).
        kcm_token, sched_token = (base64.b32encode(os.urandom(10)).decode().lower() for _ in range(2))
        (w / "tokens.csv").write_text(
            f'{ADMIN_TOKEN},e2e-admin,e2e-admin,"system:masters"\n'
            f"{kcm_token},system:kube-controller-manager,system:kube-controller-manager\n"
            f"{sched_token},system:kube-scheduler,system:kube-scheduler\n")
        self.proxy = ServiceProxy(w / "egress.sock")
        (w / "egress.yaml").write_text(yaml.safe_dump({
            "apiVersion": "apiserver.k8s.io/v1beta1", "kind": "EgressSelectorConfiguration",
            "egressSelections": [
                {"name": "cluster", "connection": {"proxyProtocol": "HTTPConnect",
                                                    "transport": {"uds": {"udsName": str(w / "egress.sock")}}}},
                {"name": "controlplane", "connection": {"proxyProtocol": "Direct"}},
                {"name": "etcd", "connection": {"proxyProtocol": "Direct"}},
            ]}))

        etcd_port, peer_port, api_port = free_port(), free_port(), free_port()
        self._run("etcd", [
            str(self.bin_dir / "etcd"), "--name=e2e", f"--data-dir={w / 'etcd'}",
            f"--listen-client-urls=http://127.0.0.1:{etcd_port}",
            f"--advertise-client-urls=http://127.0.0.1:{etcd_port}",
            f"--listen-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-advertise-peer-urls=http://127.0.0.1:{peer_port}",
            f"--initial-cluster=e2e=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync", "--log-level=warn"])
        self.server = f"https://127.0.0.1:{api_port}"
        self._run("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"),
            f"--etcd-servers=http://127.0.0.1:{etcd_port}",
            "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={api_port}",
            f"--tls-cert-file={w / 'apiserver.pem'}", f"--tls-private-key-file={w / 'apiserver.pem'}",
            f"--client-ca-file={w / 'ca.crt'}",
            f"--token-auth-file={w / 'tokens.csv'}",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={w / 'sa.pub'}", f"--service-account-signing-key-file={w / 'sa.key'}",
            "--authorization-mode=Node,RBAC",
            # The defaults (NamespaceLifecycle, ServiceAccount, DefaultTolerationSeconds, Mutating and
            # Validating webhooks, ResourceQuota, ...) plus NodeRestriction, as kubeadm sets it.
            "--enable-admission-plugins=NodeRestriction",
            "--service-cluster-ip-range=10.0.0.0/24",
            # 1.37 refuses a loopback advertise address with an endpoint reconciler (it would publish
            # 127.0.0.1 as the `kubernetes` Service's endpoint); nothing here reaches the API server
            # through that Service, so no reconciler (as envtest runs it).
            "--endpoint-reconciler-type=none",
            f"--egress-selector-config-file={w / 'egress.yaml'}",
            "--profiling=false", "--v=1"])
        self.api = Api(self.server, self.ca_path, ADMIN_TOKEN)
        wait_for("kube-apiserver /readyz", lambda: self._check_alive() and self.api.http.get(
            "/readyz").status_code == 200, timeout=60)
        self.startup_seconds = time.monotonic() - t0

        kcm_kc = self.api.kubeconfig(w / "kcm.kubeconfig", kcm_token, "system:kube-controller-manager")
        self._run("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"), f"--kubeconfig={kcm_kc}",
            f"--authentication-kubeconfig={kcm_kc}", f"--authorization-kubeconfig={kcm_kc}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--leader-elect=false",
            f"--service-account-private-key-file={w / 'sa.key'}", f"--root-ca-file={w / 'ca.crt'}",
            "--use-service-account-credentials=true", "--controllers=*",
            # One Python thread renews every node's Lease on a 2-core machine shared with other work;
            # a late round must not look like a node failure (default 50 s). The health tests flip
            # the Ready condition itself, which the controller acts on at once.
            "--node-monitor-grace-period=120s",
            # The scale test adds 1,000 nodes at once; each needs one write from the node lifecycle
            # controller to lift its not-ready taint, which the default 20 QPS client paced past 3 minutes.
            "--kube-api-qps=100", "--kube-api-burst=200", "--v=1"])
        sched_kc = self.api.kubeconfig(w / "scheduler.kubeconfig", sched_token, "system:kube-scheduler")
        self._run("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"), f"--kubeconfig={sched_kc}",
            f"--authentication-kubeconfig={sched_kc}", f"--authorization-kubeconfig={sched_kc}",
            "--bind-address=127.0.0.1", f"--secure-port={free_port()}", "--leader-elect=false", "--v=1"])
        return self

    def _run(self, name: str, args: list[str]) -> Proc:
        proc = Proc(name, args, self.work / f"{name}.log").start()
        self.procs[name] = proc
        return proc

    def _check_alive(self) -> bool:
        for proc in self.procs.values():
            if not proc.alive():
                raise RuntimeError(f"{proc.name} exited ({proc.popen.returncode if proc.popen else '?'}):\n"
                                   f"{proc.tail()}")
        return True

    def restart(self, name: str) -> float:
        """`name` killed (SIGKILL) and started again with the same flags, port and data: etcd or
        kube-apiserver crashing and coming back. Returns the seconds until the API server was ready again."""
        t0 = time.monotonic()
        self.procs[name].kill()
        self.procs[name].start()
        self.wait_api_ready()
        return time.monotonic() - t0

    def wait_api_ready(self, timeout: float = 120.0) -> None:
        """/readyz, which checks etcd too: until then requests fail or hang."""
        assert self.api is not None
        api = self.api
        wait_for("kube-apiserver /readyz", lambda: self._check_alive() and api.http.get(
            "/readyz", timeout=5).status_code == 200, timeout=timeout, interval=0.2)

    def stop(self) -> None:
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            if name in self.procs:
                self.procs[name].stop()
        if self.api:
            self.api.close()
        if self.proxy:
            self.proxy.close()


def start_control_plane(work: Path | None = None) -> ControlPlane:
    # A CI timeout or `kill` sends SIGTERM, which by default ends Python without finalizers or
    # atexit: turn it into SystemExit so every child is still stopped.
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    work = work or Path(tempfile.mkdtemp(prefix="gpu-placement-e2e-"))
    plane = ControlPlane(binaries_dir(), work)
    try:
        return plane.start()
    except BaseException:
        plane.stop()
        raise


def namespace(api: Api, name: str, labels: dict[str, str] | None = None,
              annotations: dict[str, str] | None = None) -> str:
    """A namespace pods can be created in: the ServiceAccount admission plugin refuses them until the
    controller made `default`."""
    api.apply({"apiVersion": "v1", "kind": "Namespace",
               "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}}})
    wait_for(f"serviceaccount {name}/default",
             lambda: api.http.get(f"/api/v1/namespaces/{name}/serviceaccounts/default").status_code == 200)
    return name


def follow_pods(api: Api, path: str, on_pod: Callable[[Obj], None], stop: threading.Event, **selectors: str) -> None:
    """List then watch the pods at `path` until `stop`: `on_pod` for each listed, added or modified pod;
    a relist after an ERROR event or a broken stream."""
    rv = ""
    while not stop.is_set():
        try:
            if not rv:
                listing = api.get(path, **selectors)
                rv = listing["metadata"]["resourceVersion"]
                for pod in listing["items"]:
                    on_pod(pod)
            with api.http.stream("GET", path, params={"watch": "1", "resourceVersion": rv, **selectors,
                                                      "allowWatchBookmarks": "true", "timeoutSeconds": "60"},
                                 timeout=90) as stream:
                for line in stream.iter_lines():
                    if stop.is_set():
                        return
                    event = json.loads(line)
                    if event["type"] == "ERROR":
                        rv = ""
                        break
                    rv = event["object"]["metadata"].get("resourceVersion", rv)
                    if event["type"] in ("ADDED", "MODIFIED"):
                        on_pod(event["object"])
        except (httpx.HTTPError, ValueError, KeyError):
            if stop.wait(0.5):
                return
            rv = ""


# -- NVIDIA's DRA kubelet plugin, emulated ------------------------------------------------------------

class DraPlugin:
    """What dra-driver-nvidia-gpu's kubelet plugin publishes (gpu_placement.samples.dra, from v0.4.1):
    its DeviceClasses once, one ResourceSlice per node (pool = node), republished with its own health
    taints; and gone again (`stop`)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.slices: dict[str, str] = {}  # node -> slice name

    def install(self) -> None:
        from gpu_placement.samples.dra import device_classes

        for cls in device_classes():
            self.api.apply(cls)

    def publish(self, node: str, count: int = 2, **kwargs: Any) -> Obj:
        from gpu_placement.samples.dra import resource_slice

        obj = resource_slice(node, count, **kwargs)
        self.slices[node] = obj["metadata"]["name"]
        return self.api.apply(obj, manager="gpu-kubelet-plugin")

    def stop(self) -> None:
        for name in self.slices.values():
            self.api.delete(f"/apis/resource.k8s.io/v1/resourceslices/{name}")
        for name in ("gpu.nvidia.com", "mig.nvidia.com"):
            self.api.delete(f"/apis/resource.k8s.io/v1/deviceclasses/{name}")
        self.slices.clear()


# -- kubelets, emulated ------------------------------------------------------------------------------

NODE_RESOURCES = {"cpu": "64", "memory": "512Gi", "pods": "110", "ephemeral-storage": "1Ti"}


class Kubelets:
    """Everything a kubelet would do for the nodes the tests make, done through the API."""

    def __init__(self, api: Api, lease_seconds: int = 40, renew_every: float = 10.0) -> None:
        self.api = api
        self.lease_seconds, self.renew_every = lease_seconds, renew_every
        self.nodes: dict[str, bool] = {}  # name -> heartbeating
        self.ready: dict[str, bool] = {}  # name -> the Ready status this kubelet posts
        self.operator_pods: dict[str, tuple[bool, str]] = {}  # gpu-operator pod -> (Ready, phase) posted
        self._pod_status = threading.RLock()  # a test's post and the status loop's repost, one at a time
        self.elsewhere: set[str] = set()  # namespaces whose pods another "kubelet" runs (tests/e2e/release.py)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._heartbeats, name="kubelet-leases", daemon=True),
                        threading.Thread(target=self._pods, name="kubelet-pods", daemon=True)]
        for t in self.threads:
            t.start()

    def stop(self) -> None:
        self._stop.set()

    # nodes
    def add_node(self, name: str, base: str | None, **kwargs: Any) -> Obj:
        node = make_node(name, base, **kwargs)
        status = node.pop("status")
        node["metadata"].pop("uid", None)
        for cond in status["conditions"]:
            cond.update(lastHeartbeatTime=now_rfc3339(), lastTransitionTime=now_rfc3339())
        status["nodeInfo"] = {"kubeletVersion": "v1.37.2", "architecture": "amd64", "operatingSystem": "linux",
                              "containerRuntimeVersion": "containerd://2.0.0", "kernelVersion": "6.8.0",
                              "osImage": "Ubuntu 24.04", "kubeProxyVersion": "", "machineID": "", "systemUUID": "",
                              "bootID": ""}
        status["addresses"] = [{"type": "Hostname", "address": name}]
        r = self.api.create("/api/v1/nodes", node)
        if r.status_code != 201:
            raise RuntimeError(f"create node {name}: {r.status_code} {r.text}")
        self._renew(name)
        out = self.api.merge_patch(f"/api/v1/nodes/{name}/status", {"status": status})
        with self._lock:
            self.nodes[name] = True
            self.ready[name] = kwargs.get("ready", True)
        return out

    def set_ready(self, name: str, ready: bool) -> None:
        """A kubelet that stops (NotReady) or resumes posting Ready."""
        with self._lock:
            self.ready[name] = ready
        cond = {"type": "Ready", "status": "True" if ready else "False",
                "reason": "KubeletReady" if ready else "KubeletNotReady",
                "message": "kubelet is posting ready status" if ready else "container runtime is down",
                "lastHeartbeatTime": now_rfc3339(), "lastTransitionTime": now_rfc3339()}
        self.api.http.patch(f"/api/v1/nodes/{name}/status",
                            content=json.dumps({"status": {"conditions": [cond]}}),
                            headers={"Content-Type": "application/strategic-merge-patch+json"}).raise_for_status()

    def _renew(self, name: str) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}"
        body = {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": name, "namespace": "kube-node-lease"},
                "spec": {"holderIdentity": name, "leaseDurationSeconds": self.lease_seconds,
                         "renewTime": now_rfc3339(micro=True)}}
        r = self.api.http.patch(path, content=json.dumps(body), params={"fieldManager": "kubelet", "force": "true"},
                                headers={"Content-Type": "application/apply-patch+yaml"})
        r.raise_for_status()

    def _heartbeats(self) -> None:
        def renew(name: str) -> None:
            if not self._stop.is_set():
                with contextlib.suppress(httpx.HTTPError):
                    self._renew(name)

        with ThreadPoolExecutor(4, thread_name_prefix="kubelet-lease") as pool:
            next_round = time.monotonic()
            while not self._stop.wait(max(0.0, next_round - time.monotonic())):
                next_round = time.monotonic() + self.renew_every  # a fixed period, as each kubelet keeps
                with self._lock:
                    names = [n for n, alive in self.nodes.items() if alive]
                list(pool.map(renew, names))
                if not self._stop.is_set():
                    self._post_changed_ready()
                    self._post_changed_pod_ready()

    def _post_changed_ready(self) -> None:
        """The kubelet's status loop (every 10 s): a Ready condition that is not what this kubelet posts
        is posted again. The node lifecycle controller sets Unknown when heartbeats stop arriving, e.g.
        while the API server was paused past --node-monitor-grace-period; a kubelet puts Ready back."""
        with self._lock:
            wanted = dict(self.ready)
        try:
            items = self.api.get("/api/v1/nodes", resourceVersion="0")["items"] if wanted else []
        except httpx.HTTPError:
            return
        for node in items:
            name = node["metadata"]["name"]
            posted = [c["status"] for c in node.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
            if name in wanted and posted != ["True" if wanted[name] else "False"]:
                with contextlib.suppress(httpx.HTTPError):
                    self.set_ready(name, wanted[name])

    def _post_changed_pod_ready(self) -> None:
        """The same for the GPU Operator's pods (validators, driver pods): when heartbeats stopped, the node
        lifecycle controller marked them not Ready (MarkPodsNotReady); their kubelet posts Ready again."""
        with self._lock:
            wanted = dict(self.operator_pods)
        try:
            items = self.api.get("/api/v1/namespaces/gpu-operator/pods", resourceVersion="0")["items"] if wanted else []
        except httpx.HTTPError:
            return
        for pod in items:
            name = pod["metadata"]["name"]
            posted = [c["status"] for c in pod.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
            if name in wanted and posted != ["True" if wanted[name][0] else "False"]:
                with self._pod_status, contextlib.suppress(httpx.HTTPError):
                    latest = self.operator_pods.get(name)  # a test may have posted since the snapshot
                    if latest is not None:
                        self.set_pod_ready("gpu-operator", name, *latest)

    def wait_schedulable(self, names: list[str], timeout: float = 60.0) -> None:
        """Until the node lifecycle controller has lifted its not-ready taint from every node."""
        wanted = set(names)

        def tainted() -> list[str]:
            items = self.api.get("/api/v1/nodes")["items"]
            found = {n["metadata"]["name"] for n in items}
            return sorted(wanted - found) + [
                f"{n['metadata']['name']}:{t['key']}" for n in items if n["metadata"]["name"] in wanted
                for t in n["spec"].get("taints", []) if t["key"].startswith("node.kubernetes.io/")]

        last: list[str] = []

        def done() -> bool:
            last[:] = tainted()
            return not last
        try:
            wait_for("nodes without node.kubernetes.io taints", done, timeout=timeout,
                     interval=0.5 if len(names) < 50 else 5.0)
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}: {len(last)} left, e.g. {last[:5]}") from None

    # pods
    def add_validator(self, node: str, ready: bool = True) -> None:
        pod = validator_pod(node, ready)
        status = pod.pop("status")
        pod["metadata"].pop("uid", None)
        pod["metadata"].pop("ownerReferences", None)  # no such DaemonSet here: the garbage collector would delete it
        pod["spec"]["tolerations"] = [{"operator": "Exists"}]
        pod["spec"]["containers"][0]["resources"] = {}
        r = self.api.create("/api/v1/namespaces/gpu-operator/pods", pod)
        if r.status_code != 201:
            raise RuntimeError(f"create validator on {node}: {r.status_code} {r.text}")
        self.set_pod_ready("gpu-operator", pod["metadata"]["name"], ready, status.get("phase", "Running"))

    def set_pod_ready(self, namespace: str, name: str, ready: bool, phase: str = "Running") -> None:
        with self._pod_status:
            if namespace == "gpu-operator":
                self.operator_pods[name] = (ready, phase)
            self._post_pod_ready(namespace, name, ready, phase)

    def _post_pod_ready(self, namespace: str, name: str, ready: bool, phase: str) -> None:
        conds = [{"type": t, "status": "True" if ready or t == "PodScheduled" else "False",
                  "lastTransitionTime": now_rfc3339()} for t in ("PodScheduled", "Initialized", "ContainersReady",
                                                                  "Ready")]
        self.api.merge_patch(f"/api/v1/namespaces/{namespace}/pods/{name}/status",
                             {"status": {"phase": phase, "conditions": conds, "startTime": now_rfc3339()}})

    def _pods(self) -> None:
        """Bound pods start Running; pods being deleted are removed once their node "stopped" them."""
        follow_pods(self.api, "/api/v1/pods", self._kubelet_pod, self._stop, fieldSelector="spec.nodeName!=")

    def _kubelet_pod(self, pod: Obj) -> None:
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        if ns in self.elsewhere:
            return
        if meta.get("deletionTimestamp"):
            self.api.http.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}",
                                  content=json.dumps({"gracePeriodSeconds": 0,
                                                      "preconditions": {"uid": meta["uid"]}}),
                                  headers={"Content-Type": "application/json"})
            return
        if pod.get("status", {}).get("phase") == "Pending" and ns != "gpu-operator" and self._claims_prepared(pod):
            with contextlib.suppress(httpx.HTTPStatusError):
                self.set_pod_ready(ns, name, True)

    def _claims_prepared(self, pod: Obj) -> bool:
        """The kubelet's part for claims: it starts a pod only once each of its ResourceClaims is allocated
        and reserved for it (the scheduler does both before binding); the driver's plugin would then
        prepare the devices, which leaves nothing in the API. A pod whose claims are not there stays Pending."""
        ns, uid = pod["metadata"]["namespace"], pod["metadata"]["uid"]
        statuses = pod.get("status", {}).get("resourceClaimStatuses", [])
        generated = {s["name"]: s.get("resourceClaimName") for s in statuses}
        names = [ref.get("resourceClaimName") or generated.get(ref["name"])
                 for ref in pod["spec"].get("resourceClaims", [])]
        extended = pod.get("status", {}).get("extendedResourceClaimStatus")  # DRAExtendedResource's claim
        if extended:
            names.append(extended.get("resourceClaimName"))
        for name in names:
            if not name:
                return False
            r = self.api.http.get(f"/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims/{name}")
            status = r.json().get("status", {}) if r.status_code == 200 else {}
            if not status.get("allocation") or uid not in {c.get("uid") for c in status.get("reservedFor", [])}:
                return False
        return True
