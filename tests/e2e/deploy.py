"""The chart, installed for real on the e2e control plane, and its pods run on this machine.

Rendered by Helm (helm-python-sdk, as tests/test_chart.py does); every object goes through the API
server by server-side apply. No kubelet runs the Deployments' pods, so `Pod` here plays one: it runs
a container of the rendered pod template with its exact command and args, its volumes as folders
(ConfigMaps written out, emptyDirs empty) and its env. What a pod gives that a process on a shared
machine cannot is rewritten, and only that:

- ports: every "pod" here shares one loopback, so each listen address gets a free port (and the
  scheduler's extender urlPrefix follows the extender's);
- identity: no in-cluster service-account mount outside a pod, so each process gets a kubeconfig
  holding a TokenRequest token of its chart ServiceAccount (`--kubeconfig` for gpu-placement;
  `clientConnection.kubeconfig` in kube-scheduler's config, which ignores the flag when --config
  is given). RBAC is exactly what the chart grants those accounts.

The gpu-placement containers (the webhook, the scheduler pod's extender sidecar) run with
E2E_IMAGE=1 (what `make e2e` sets unless told E2E_IMAGE=0) from the chart's image, as a kubelet starts them
(tests/e2e/container.py: `make image` built it): the rendered user, read-only root, capabilities,
env, args and mounts, the token mounted where a pod has it. kube-scheduler is always the binary the
suite built. Without E2E_IMAGE (pytest run by hand) they run as processes from this checkout.
"""

from __future__ import annotations

import base64
import os
import sys
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import helm_python
import yaml

from tests.e2e.cluster import Api, ControlPlane, Proc, free_port, wait_for
from tests.e2e.container import (
    Container,
    Prober,
    Volume,
    engine,
    local_exec,
    loopback_rewrite,
    rewrite_listen,
    run_args,
)

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "gpu-placement"
RELEASE = NAMESPACE = "gpu-placement"
GPU_PLACEMENT = str(Path(sys.executable).parent / "gpu-placement")
FROM_SOURCE = os.environ.get("E2E_IMAGE", "") in ("", "0")  # E2E_IMAGE=1: containers from the image
SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
Obj = dict[str, Any]


K8S_TAG = "v1.37.2"  # the control plane's version (tests/e2e/build_control_plane.sh): kube-scheduler's image tag


def render(values: Obj | None = None) -> list[Obj]:
    """Offline, as `helm template` renders: kube-scheduler's tag must then be given."""
    values = dict(values or {})
    scheduler = dict(values.get("scheduler") or {})
    scheduler["image"] = {"tag": K8S_TAG, **(scheduler.get("image") or {})}
    values["scheduler"] = scheduler
    with helm_python.Chart.load(CHART) as chart:
        files = chart.render(values, name=RELEASE, namespace=NAMESPACE)
    return [doc for path, text in sorted(files.items()) if path.endswith(".yaml")
            for doc in yaml.safe_load_all(text) if doc]


def install(api: Api, docs: list[Obj]) -> None:
    """`helm install --create-namespace`, by server-side apply: namespace, then everything else
    (RBAC before workloads, the webhook configurations last, as Helm orders kinds)."""
    api.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
    order = ["NetworkPolicy", "PodDisruptionBudget", "ServiceAccount", "Secret", "ConfigMap", "ClusterRole",
             "ClusterRoleBinding", "Role", "RoleBinding", "Service", "Deployment", "MutatingWebhookConfiguration",
             "ValidatingWebhookConfiguration"]
    for doc in sorted(docs, key=lambda d: order.index(d["kind"]) if d["kind"] in order else len(order)):
        api.apply(doc, manager="helm")


def find(docs: list[Obj], kind: str, name: str) -> Obj:
    found = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, (kind, name)
    return found[0]


@dataclass
class Pod:
    """One replica of a rendered Deployment (or a live Pod: `template` and `docs` holding its
    ConfigMaps), its containers as local processes."""

    plane: ControlPlane
    docs: list[Obj]
    deployment: str
    replica: int | str = 0
    ports: dict[int, int] = field(default_factory=dict)  # container port -> local port
    procs: dict[str, Proc] = field(default_factory=dict)
    # The containers meant to run (tests/e2e/supervisor.py restarts them when they exit), with the
    # serve flags each was started with; the lock orders a test's stop() with a restart.
    wanted: set[str] = field(default_factory=set)
    extra_args: dict[str, tuple[str, ...]] = field(default_factory=dict)
    lock: threading.RLock = field(default_factory=threading.RLock)
    template: Obj = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.template = self.template or find(self.docs, "Deployment", self.deployment)["spec"]["template"]
        self.dir = self.plane.work / f"{self.deployment}-{self.replica}"
        self.dir.mkdir(exist_ok=True)
        api = self.plane.api
        assert api is not None
        spec = self.template["spec"]
        self.service_account = spec["serviceAccountName"]
        self.token = api.token_for(NAMESPACE, self.service_account)
        self.kubeconfig = api.kubeconfig(self.dir / "kubeconfig", self.token, self.service_account)
        self.volumes: dict[str, Path] = {}
        self.rendered: dict[Path, str] = {}  # each ConfigMap file as the chart rendered it
        for vol in spec.get("volumes", []):
            path = self.dir / "volumes" / vol["name"]
            path.mkdir(parents=True, exist_ok=True)
            if "configMap" in vol:
                cm = find(self.docs, "ConfigMap", vol["configMap"]["name"])
                for key, text in cm["data"].items():
                    (path / key).write_text(text)
                    self.rendered[path / key] = text
            self.volumes[vol["name"]] = path

    def local_port(self, container_port: int) -> int:
        if container_port not in self.ports:
            self.ports[container_port] = free_port()
        return self.ports[container_port]

    def _mounts(self, container: Obj) -> list[tuple[str, Path]]:
        return sorted(((m["mountPath"], self.volumes[m["name"]]) for m in container.get("volumeMounts", [])),
                      key=lambda m: -len(m[0]))

    def _path(self, value: str, mounts: list[tuple[str, Path]]) -> str:
        if value.startswith("--") and "=" in value:  # --config=/etc/...
            flag, _, rest = value.partition("=")
            return f"{flag}={self._path(rest, mounts)}"
        for mount_path, local in mounts:
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                return str(local) + value[len(mount_path.rstrip("/")):]
        return value

    def container(self, name: str) -> Obj:
        spec = self.template["spec"]  # the extender is a native sidecar: an init container that keeps running
        return dict(next(c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name))

    def command(self, name: str, extra_args: tuple[str, ...] = ()) -> tuple[list[str], dict[str, str]]:
        container = self.container(name)
        mounts = self._mounts(container)
        args = [self._path(str(a), mounts) for a in container.get("command", []) + container.get("args", [])]
        env = self._env(container)
        if name == "kube-scheduler":
            args[0] = str(self.plane.bin_dir / "kube-scheduler")
            config_arg = next(i for i, a in enumerate(args) if a.startswith("--config="))
            config_path = Path(args[config_arg].split("=", 1)[1])
            # From the rendered text, not the file: a restart must not map the local ports again.
            config = yaml.safe_load(self.rendered[config_path])
            config["clientConnection"] = {"kubeconfig": str(self.kubeconfig)}
            for ext in config.get("extenders", []):
                prefix, _, port = ext["urlPrefix"].rpartition(":")
                if int(port) not in self.ports.values():  # not rewritten yet (a restart reads it back)
                    ext["urlPrefix"] = f"{prefix}:{self.local_port(int(port))}"
            config_path.write_text(yaml.safe_dump(config))
            kc = str(self.kubeconfig)
            args += ["--bind-address=127.0.0.1", f"--secure-port={self.local_port(10259)}",
                     f"--authentication-kubeconfig={kc}", f"--authorization-kubeconfig={kc}"]
        else:  # the gpu-placement image: ENTRYPOINT ["gpu-placement"]
            args = [GPU_PLACEMENT, *rewrite_listen(args, self.local_port), "--kubeconfig", str(self.kubeconfig),
                    *extra_args]
        return args, env

    @staticmethod
    def _env(container: Obj) -> dict[str, str]:
        env = {e["name"]: NAMESPACE for e in container.get("env", [])
               if e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.namespace"}
        env.update({e["name"]: e["value"] for e in container.get("env", []) if "value" in e})
        return env

    def start(self, name: str, extra_args: tuple[str, ...] = ()) -> Proc:
        """The container's process; `extra_args` are serve flags a test adds (gpu-placement only)."""
        log = self.dir / f"{name}.log"
        with self.lock:
            if name == "kube-scheduler" or FROM_SOURCE:
                args, env = self.command(name, extra_args)
                proc: Proc = Proc(f"{self.deployment}-{self.replica}-{name}", args, log, env=env).start()
            else:
                proc = self._container(name, extra_args, log).start()
            self.procs[name] = proc
            self.wanted.add(name)
            self.extra_args[name] = extra_args
        return proc

    def _container(self, name: str, extra_args: tuple[str, ...], log: Path) -> Container:
        """The container from the chart's image, as a kubelet starts it: the API server found as
        in a pod (KUBERNETES_SERVICE_HOST/PORT, the token and CA mounted at SERVICE_ACCOUNT_DIR)."""
        container, spec = self.container(name), self.template["spec"]
        image = container["image"]
        if not engine().has_image(image):
            raise RuntimeError(f"image {image} not built: run `make image` (or run with E2E_IMAGE=0)")
        account = self.dir / "serviceaccount"
        account.mkdir(exist_ok=True)
        (account / "token").write_text(self.token)
        (account / "ca.crt").write_bytes(self.plane.ca_path.read_bytes())
        (account / "namespace").write_text(NAMESPACE)
        volumes = {vol["name"]: self._volume_source(vol, account) for vol in spec.get("volumes", [])}
        mounts = []
        # A Pod the API server stored carries the token as a projected volume (kube-api-access-*) and
        # its mount; a Deployment's template does not: mount it where the admission plugin would.
        mounted = {m["mountPath"] for m in container.get("volumeMounts", [])}
        if spec.get("automountServiceAccountToken", True) and SERVICE_ACCOUNT_DIR not in mounted:
            mounts.append((account, SERVICE_ACCOUNT_DIR))
        host, _, port = self.plane.server.removeprefix("https://").rpartition(":")
        env = {**self._env(container), "KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": port}
        args = [*rewrite_listen([str(a) for a in container.get("args", [])], self.local_port), *extra_args]
        pod_name = f"{self.deployment}-{self.replica}"
        cmd = run_args(f"e2e-{pod_name}-{name}", spec, container, args, volumes, env, hostname=pod_name,
                       extra_mounts=mounts)
        return Container(f"{pod_name}-{name}", [*engine().command, *cmd], log, container=f"e2e-{pod_name}-{name}",
                         grace=float(spec.get("terminationGracePeriodSeconds", 30)))

    def _volume_source(self, vol: Obj, account: Path) -> Volume:
        """emptyDir: a tmpfs; configMap: its folder; secret: the Secret's keys as files, as a
        kubelet writes them (defaultMode, group fsGroup); the projected service-account volume: the
        token, CA and namespace in `account`."""
        if "emptyDir" in vol:
            return Volume(None, vol["emptyDir"].get("sizeLimit"))
        if "projected" in vol and any("serviceAccountToken" in src for src in vol["projected"].get("sources", [])):
            return Volume(account)
        path = self.volumes[vol["name"]]
        if "secret" in vol:
            assert self.plane.api is not None
            secret = self.plane.api.get(f"/api/v1/namespaces/{NAMESPACE}/secrets/{vol['secret']['secretName']}")
            group = self.template["spec"].get("securityContext", {}).get("fsGroup", 0)
            for key, value in secret.get("data", {}).items():
                (path / key).write_bytes(base64.b64decode(value))
                os.chown(path / key, 0, group)
                (path / key).chmod(vol["secret"].get("defaultMode", 0o644))
        elif "configMap" not in vol:
            raise NotImplementedError(f"volume {vol['name']}: {sorted(vol)}")
        return Volume(path)

    def prober(self, name: str) -> Prober:
        """The chart's probes of this container, run against it (exec probes inside the container,
        or here for a process from source; both on the host network, so the listen rewrite applies)."""
        proc = self.procs[name]
        run = proc.exec if isinstance(proc, Container) else local_exec
        return Prober(self.container(name), self.local_port, run, loopback_rewrite(self.ports))

    def stop(self, name: str | None = None) -> None:
        """Stopped on purpose (SIGTERM): not restarted."""
        for key in [name] if name else list(self.procs):
            with self.lock:
                self.wanted.discard(key)
            self.procs[key].stop()

    def kill(self, name: str) -> None:
        """A crash (SIGKILL: an OOM kill, a segfault); kubelet restarts it (tests/e2e/supervisor.py)."""
        self.procs[name].kill()

    def lose(self) -> None:
        """The pod is gone at once, every container SIGKILLed (its node lost, the pod force-deleted)."""
        with self.lock:
            self.wanted.clear()
            for proc in self.procs.values():
                proc.kill()


def webhook_port(pod: Pod, docs: list[Obj]) -> int:
    container = next(c for c in pod.template["spec"]["containers"] if c["name"] == "webhook")
    return pod.local_port(int(container["ports"][0]["containerPort"]))


def wait_ready(proc: Proc, url: str, verify: Any = False, timeout: float = 60.0) -> None:
    import httpx

    def ready() -> bool:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited:\n{proc.tail()}")
        return httpx.get(url, verify=verify, timeout=2).status_code == 200

    wait_for(f"{proc.name} {url}", ready, timeout=timeout, interval=0.2)
