"""A kubelet for the release namespace: the pods the chart's Deployments make, run on this machine.

Real Helm (helm_python: the Helm v4 SDK) installs the chart; kube-controller-manager makes the
ReplicaSets and Pods; the harness's kube-scheduler binds them to a plain node. This class then does
what that node's kubelet would, for that namespace only:

- images: the ones this machine can run start as processes with the pod's own command, args, env
  and volumes (deploy.Pod): the chart's gpu-placement image (`gpu-placement:<appVersion>`: the venv's
  console script) and kube-scheduler at the control plane's version (the built binary). Any other
  image fails to pull: the pod stays Pending, its containers waiting with ErrImagePull;
- native sidecars (init containers with restartPolicy Always) first, the next container once the
  sidecar's startupProbe passes, as kubelet orders them;
- status: Running with a pod IP, then Ready while every container's readinessProbe (an HTTP GET on the
  local port its container port maps to) answers 200. The endpoint controller then publishes the pod
  in its Service's EndpointSlice and the Deployment controller counts it (what `helm --wait` waits for);
- Services: each one's ClusterIP is routed (the API server's egress proxy, as kube-proxy would) to
  the Ready pods it selects, and only those: a Service without Ready pods answers 503, as one without
  endpoints does;
- deletion: SIGTERM to the processes (their shutdown path, as on a rollout or uninstall), then the pod
  object removed.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from tests.e2e.cluster import Api, ControlPlane, Kubelets, follow_pods, now_rfc3339, wait_for
from tests.e2e.deploy import K8S_TAG, NAMESPACE, Pod

Obj = dict[str, Any]
CHART_VERSION = yaml.safe_load((Path(__file__).resolve().parents[2] / "charts/gpu-placement/Chart.yaml")
                               .read_text())["appVersion"]
RUNNABLE = {f"gpu-placement:{CHART_VERSION}", f"registry.k8s.io/kube-scheduler:{K8S_TAG}"}
_ips = itertools.count(10)
log = logging.getLogger("e2e.release-kubelet")


@dataclass
class Running:
    pod: Pod
    obj: Obj
    ip: str
    ready: bool = False
    containers: list[Obj] = field(default_factory=list)


class ReleaseKubelet:
    def __init__(self, plane: ControlPlane, api: Api, kubelets: Kubelets, namespace: str = NAMESPACE) -> None:
        self.plane, self.api, self.namespace = plane, api, namespace
        kubelets.elsewhere.add(namespace)
        self.runs: dict[str, Running] = {}  # pod uid ->
        self.started: set[str] = set()  # uids started or failed to pull: each handled once
        self.deleting: set[str] = set()
        self.stopped: list[str] = []  # names of the pods whose processes were stopped (SIGTERM)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(8, thread_name_prefix="release-kubelet")
        self.log_path = plane.work / "release-kubelet.log"
        handler = logging.FileHandler(self.log_path)
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        log.addHandler(handler)
        log.setLevel(logging.INFO)
        self._threads = [threading.Thread(target=self._watch, name="release-kubelet-watch", daemon=True),
                         threading.Thread(target=self._probe, name="release-kubelet-probes", daemon=True)]
        for thread in self._threads:
            thread.start()

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            runs = list(self.runs.values())
            self.runs.clear()
        self._pool.shutdown(wait=True, cancel_futures=True)
        for run in runs:
            run.pod.stop()

    # -- pods ----------------------------------------------------------------------------------
    def _watch(self) -> None:
        follow_pods(self.api, f"/api/v1/namespaces/{self.namespace}/pods", self._event, self._stop)

    def _event(self, pod: Obj) -> None:
        uid = pod["metadata"]["uid"]
        with self._lock:
            if pod["metadata"].get("deletionTimestamp"):
                if uid not in self.deleting:
                    self.deleting.add(uid)
                    self._pool.submit(self._logged, self._delete, pod)
                return
            if not pod["spec"].get("nodeName") or uid in self.started:
                return
            self.started.add(uid)
        self._pool.submit(self._logged, self._start, pod)

    @staticmethod
    def _logged(action: Any, pod: Obj) -> None:
        try:
            action(pod)
        except Exception:
            log.exception("%s %s failed", action.__name__, pod["metadata"]["name"])

    def _start(self, obj: Obj) -> None:
        meta, spec = obj["metadata"], obj["spec"]
        sidecars = [c for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always"]
        containers = [*sidecars, *spec["containers"]]
        missing = [c["image"] for c in containers if c["image"] not in RUNNABLE]
        log.info("start %s on %s (cannot pull: %s)", meta["name"], spec["nodeName"], missing or "none")
        if missing:
            self._status(meta["name"], {"phase": "Pending", "conditions": _conditions(False), "containerStatuses": [
                {"name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
                 "state": {"waiting": {"reason": "ErrImagePull",
                                       "message": f"failed to pull image {c['image']!r}: not found"}}}
                for c in containers]})
            return
        configmaps = [self.api.get(f"/api/v1/namespaces/{self.namespace}/configmaps/{v['configMap']['name']}")
                      for v in spec.get("volumes", []) if "configMap" in v]
        docs = [{"kind": "ConfigMap", **cm} for cm in configmaps]
        pod = Pod(self.plane, docs, meta["name"], meta["uid"][:8], template=obj)
        run = Running(pod, obj, f"10.244.1.{next(_ips)}", containers=containers)
        with self._lock:
            self.runs[meta["uid"]] = run
        for container in containers:
            pod.start(container["name"])
            if container in sidecars and "startupProbe" in container:
                with contextlib.suppress(TimeoutError):
                    wait_for(f"{meta['name']} {container['name']} startup", lambda c=container: self._passes(run, c),
                             timeout=60, interval=0.2)
        self._status(meta["name"], {"phase": "Running", "podIP": run.ip, "podIPs": [{"ip": run.ip}],
                                    "hostIP": "10.0.0.2", "startTime": now_rfc3339(),
                                    "conditions": _conditions(False)})
        log.info("running %s: %s", meta["name"], {name: proc.alive() for name, proc in pod.procs.items()})

    def _delete(self, obj: Obj) -> None:
        meta = obj["metadata"]
        log.info("deleting %s", meta["name"])
        with self._lock:
            run = self.runs.pop(meta["uid"], None)
        if run is not None:
            self._route()  # terminating: no longer an endpoint
            for container in reversed(run.containers):  # sidecars last, as kubelet stops them
                if container["name"] in run.pod.procs:
                    run.pod.stop(container["name"])
            self.stopped.append(meta["name"])
        for _ in range(10):  # as kubelet: until the API server has let the pod go
            r = self.api.http.request("DELETE", f"/api/v1/namespaces/{self.namespace}/pods/{meta['name']}",
                                      content=json.dumps({"gracePeriodSeconds": 0,
                                                          "preconditions": {"uid": meta["uid"]}}),
                                      headers={"Content-Type": "application/json"})
            log.info("deleted %s: %d", meta["name"], r.status_code)
            if r.status_code in (200, 404, 409):
                return
            self._stop.wait(1.0)

    def _status(self, name: str, status: Obj) -> None:
        with contextlib.suppress(httpx.HTTPStatusError):
            self.api.merge_patch(f"/api/v1/namespaces/{self.namespace}/pods/{name}/status", {"status": status})

    # -- readiness and routes ------------------------------------------------------------------
    def _passes(self, run: Running, container: Obj, kind: str = "startupProbe") -> bool:
        probe = (container.get(kind) or container.get("readinessProbe") or {}).get("httpGet")
        proc = run.pod.procs.get(container["name"])
        if proc is None or not proc.alive():
            return False
        if probe is None:
            return True
        port = probe["port"]
        if isinstance(port, str):
            port = next(p["containerPort"] for p in container.get("ports", []) if p["name"] == port)
        url = f"{probe.get('scheme', 'HTTP').lower()}://127.0.0.1:{run.pod.local_port(int(port))}{probe['path']}"
        try:
            return httpx.get(url, verify=False, timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def _probe(self) -> None:
        while not self._stop.wait(0.5):
            with self._lock:
                runs = list(self.runs.values())
            changed = False
            for run in runs:
                ready = all(self._passes(run, c, "readinessProbe") for c in run.containers)
                if ready != run.ready:
                    run.ready, changed = ready, True
                    log.info("%s ready: %s", run.obj["metadata"]["name"], ready)
                    self._status(run.obj["metadata"]["name"], {"conditions": _conditions(ready), "containerStatuses": [
                        {"name": c["name"], "image": c["image"], "imageID": "", "ready": ready, "started": True,
                         "restartCount": 0, "state": {"running": {"startedAt": now_rfc3339()}}}
                        for c in run.containers]})
            if changed or runs:
                self._route()

    def _route(self) -> None:
        """Each Service's ClusterIP to its Ready pods' local ports (targetPort by number or name)."""
        assert self.plane.proxy is not None
        try:
            services = self.api.get(f"/api/v1/namespaces/{self.namespace}/services")["items"]
        except httpx.HTTPError:
            return
        with self._lock:
            ready = [run for run in self.runs.values() if run.ready]
        for service in services:
            selector = service["spec"].get("selector") or {}
            members = [run for run in ready
                       if selector.items() <= (run.obj["metadata"].get("labels") or {}).items()]
            for port in service["spec"]["ports"]:
                backends = []
                for run in members:
                    target = port.get("targetPort", port["port"])
                    if isinstance(target, str):
                        target = next((p["containerPort"] for c in run.containers for p in c.get("ports", [])
                                       if p.get("name") == target), None)
                    if target is not None:
                        backends.append(("127.0.0.1", run.pod.local_port(int(target))))
                self.plane.proxy.route(service["spec"]["clusterIP"], port["port"], backends)


def _conditions(ready: bool) -> list[Obj]:
    value = "True" if ready else "False"
    return [{"type": "PodScheduled", "status": "True"}, {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": value}, {"type": "Ready", "status": value}]
