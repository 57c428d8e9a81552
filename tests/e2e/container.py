"""A rendered pod's container run from its image, as a kubelet would start it; and the chart's probes.

A kubelet turns a container of a pod spec into one call to the container runtime: the image with
the container's command and args, the user and groups of the security contexts, a read-only root
filesystem, the capabilities, the env, and each volume mounted where the container says (ConfigMaps,
Secrets and the service-account token read-only, emptyDirs as scratch space). `run_args` makes the
same call with docker or podman (image/build.sh --print-engine says which, and the flags this machine
needs). What a pod has that a container on a shared machine cannot is rewritten by the caller, as
for local processes (tests/e2e/deploy.py): the network is the host's, so listen ports are free
ports of its loopback. `Container` runs it like `Proc` runs a process; `stop` is a kubelet's: SIGTERM,
then SIGKILL after the grace period.

`probe` runs one of a container's probes the way a kubelet does: httpGet against the container's
port (named ports resolved), exec inside the container (or, for a process from source, on this
machine, which shares the host network all the same).
"""

from __future__ import annotations

import functools
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from tests.e2e.cluster import Proc

ROOT = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = ROOT / "image" / "build.sh"
GRACE_SECONDS = 30  # terminationGracePeriodSeconds when the pod spec leaves it out
Obj = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Engine:
    command: tuple[str, ...]  # e.g. ("podman", "--runtime", "runc")
    flags: tuple[str, ...]  # what `run` needs on this machine (ulimits)

    @property
    def podman(self) -> bool:
        return self.command[0] == "podman"

    def run(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*self.command, *args], capture_output=True, text=True, timeout=timeout, check=check)

    def has_image(self, image: str) -> bool:
        return self.run("image", "inspect", image, check=False).returncode == 0


@functools.cache
def engine() -> Engine:
    """The engine `make image` builds with (docker when its daemon answers, else podman with runc)."""
    run = subprocess.run(["bash", str(BUILD_SCRIPT), "--print-engine"], capture_output=True, text=True, check=True)
    lines = [*run.stdout.splitlines(), ""]
    return Engine(tuple(lines[0].split()), tuple(lines[1].split()))


@dataclass(frozen=True, slots=True)
class Volume:
    """Where a pod volume's contents come from: a folder here, or a tmpfs (an emptyDir) of `size`."""

    host: Path | None = None
    size: str | None = None  # a Kubernetes quantity (sizeLimit), e.g. 16Mi


def security_context(pod_spec: Obj, container: Obj) -> Obj:
    """The container's effective securityContext: the pod's, overridden field by field by its own."""
    merged = {k: v for k, v in pod_spec.get("securityContext", {}).items()
              if k in ("runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile")}
    merged.update(container.get("securityContext", {}))
    return merged


def _tmpfs_size(quantity: str) -> str:
    for suffix, unit in (("Ki", "k"), ("Mi", "m"), ("Gi", "g")):
        if quantity.endswith(suffix):
            return quantity[: -len(suffix)] + unit
    return quantity


def run_args(name: str, pod_spec: Obj, container: Obj, args: Sequence[str], volumes: dict[str, Volume],
             env: dict[str, str], hostname: str, image: str | None = None,
             extra_mounts: Sequence[tuple[Path, str]] = ()) -> list[str]:
    """`run` arguments for a container of a pod spec: its image (or `image`), its command as the
    entrypoint, `args` (the caller's rewrite of its args), its security contexts, `env` (resolved by
    the caller: fieldRefs have no API here) and its volumeMounts from `volumes`. `extra_mounts`
    (host file or folder, path) are read-only binds a kubelet adds, e.g. the service-account token."""
    eng = engine()
    out = ["run", "--rm", "--name", name, "--network", "host", *eng.flags]
    if eng.podman:  # docker refuses a hostname on the host network; podman gives the pod's own UTS
        out += ["--hostname", hostname]
    sc = security_context(pod_spec, container)
    if "runAsUser" in sc:
        out += ["--user", f"{sc['runAsUser']}:{sc.get('runAsGroup', sc['runAsUser'])}"]
    fs_group = pod_spec.get("securityContext", {}).get("fsGroup")
    if fs_group is not None:
        out += ["--group-add", str(fs_group)]
    if sc.get("readOnlyRootFilesystem"):
        # podman adds writable tmpfs on /tmp, /run and /var/tmp to a read-only root; a kubelet does not.
        out += ["--read-only", *(["--read-only-tmpfs=false"] if eng.podman else [])]
    caps = sc.get("capabilities", {})
    out += [f"--cap-drop={c}" for c in caps.get("drop", [])] + [f"--cap-add={c}" for c in caps.get("add", [])]
    if sc.get("allowPrivilegeEscalation") is False:
        out += ["--security-opt", "no-new-privileges"]
    if sc.get("seccompProfile", {}).get("type") == "Unconfined":
        out += ["--security-opt", "seccomp=unconfined"]  # RuntimeDefault is the engine's default profile
    for key, value in env.items():
        out += ["--env", f"{key}={value}"]
    mounts = container.get("volumeMounts", [])
    for inner in mounts:  # a kubelet makes the mount points nested in a ConfigMap or Secret volume (kubernetes#60342)
        for outer in mounts:
            prefix, host = outer["mountPath"].rstrip("/") + "/", volumes[outer["name"]].host
            if host is not None and inner["mountPath"].startswith(prefix):
                (host / inner["mountPath"][len(prefix):]).mkdir(parents=True, exist_ok=True)
    for mount in mounts:
        volume = volumes[mount["name"]]
        if volume.host is None:
            size = f",size={_tmpfs_size(volume.size)}" if volume.size else ""
            out += ["--tmpfs", f"{mount['mountPath']}:rw,mode=1777{size}"]
        else:  # a kubelet mounts ConfigMaps, Secrets and projected volumes read-only, whatever the mount says
            out += ["--volume", f"{volume.host}:{mount['mountPath']}:ro"]
    for host, path in extra_mounts:
        out += ["--volume", f"{host}:{path}:ro"]
    command = container.get("command") or []
    if command:
        out += ["--entrypoint", command[0]]
    out += [image or container["image"], *command[1:], *args]
    if sc.get("runAsNonRoot") and "runAsUser" not in sc:
        raise ValueError(f"{name}: runAsNonRoot without runAsUser: a kubelet checks the image's USER")
    return out


@dataclass(eq=False)
class Container(Proc):
    """A container in the foreground of `docker run` / `podman run`, its output in the log; stop()
    is a kubelet's: SIGTERM to the container, SIGKILL after `grace` seconds."""

    container: str = ""
    grace: float = GRACE_SECONDS
    exit_code: int | None = None
    stop_seconds: float | None = None  # from SIGTERM to exit

    def start(self) -> Container:
        engine().run("rm", "--force", self.container, check=False)  # one left by a killed run
        super().start()
        return self

    def running(self) -> bool:
        """The container is up (created and started), not just its `run` client."""
        state = engine().run("inspect", "--format", "{{.State.Running}}", self.container, check=False)
        return state.stdout.strip() == "true"

    def service_pid(self) -> int | None:
        """The container's main process as this host numbers it (not the `run` client's, which
        only relays output)."""
        found = engine().run("inspect", "--format", "{{.State.Pid}}", self.container, check=False).stdout.strip()
        return int(found) if found.isdigit() and int(found) > 0 else None

    def stop(self, timeout: float | None = None) -> None:
        if self.popen is None:
            return
        grace = self.grace if timeout is None else timeout
        t0 = time.monotonic()
        if self.popen.poll() is None:
            engine().run("stop", "--time", str(int(grace)), self.container, timeout=grace + 60, check=False)
        try:
            self.exit_code = self.popen.wait(grace + 30)
        except subprocess.TimeoutExpired:
            self.popen.kill()
            self.exit_code = self.popen.wait()
        self.stop_seconds = time.monotonic() - t0
        engine().run("rm", "--force", self.container, check=False)
        super().stop(timeout=1)

    def kill(self) -> None:
        """A crash (SIGKILL to the container's process, as an OOM kill); killing only the `run` client
        would leave the container serving."""
        if self.popen is not None and self.popen.poll() is None:
            engine().run("kill", "--signal", "KILL", self.container, timeout=60, check=False)
        super().kill()

    def exec(self, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        return engine().run("exec", self.container, *argv, timeout=timeout, check=False)


LISTEN_FLAGS = ("--webhook-listen", "--extender-listen", "--health-listen")


def rewrite_listen(args: Sequence[str], local_port: Callable[[int], int]) -> list[str]:
    """The container's listen addresses moved to free ports of this machine's loopback."""
    out = list(args)
    for i, arg in enumerate(out[:-1]):
        if arg in LISTEN_FLAGS:
            out[i + 1] = f"127.0.0.1:{local_port(int(out[i + 1].rpartition(':')[2]))}"
    return out


def loopback_rewrite(ports: dict[int, int]) -> Callable[[str], str]:
    """The same move for an address written in a command (an exec probe's URL): 127.0.0.1:<container
    port> becomes the local port it listens on (read when called: ports fill as listeners are moved)."""
    def rewrite(arg: str) -> str:
        for container_port, local in ports.items():
            arg = arg.replace(f"127.0.0.1:{container_port}", f"127.0.0.1:{local}")
        return arg
    return rewrite


# -- probes ------------------------------------------------------------------------------------------

@dataclass
class Prober:
    """Runs a container's probes as a kubelet does. `port` maps a containerPort to where it listens
    here; `exec` runs a command in the container; `rewrite` applies the caller's address rewrite to
    an exec probe's command (it names the container's own loopback address)."""

    container: Obj
    port: Callable[[int], int]
    exec: Callable[[Sequence[str], float], subprocess.CompletedProcess[str]]
    rewrite: Callable[[str], str] = lambda arg: arg
    log: list[str] = field(default_factory=list)

    def _container_port(self, port: int | str) -> int:
        if isinstance(port, int):
            return port
        return int(next(p["containerPort"] for p in self.container.get("ports", []) if p.get("name") == port))

    def probe(self, kind: str) -> bool:
        """One run of the startupProbe, readinessProbe or livenessProbe (True when absent, as a kubelet)."""
        spec = self.container.get(f"{kind}Probe")
        if spec is None:
            return True
        timeout = float(spec.get("timeoutSeconds", 1))
        if "httpGet" in spec:
            get = spec["httpGet"]
            scheme = get.get("scheme", "HTTP").lower()
            url = f"{scheme}://127.0.0.1:{self.port(self._container_port(get['port']))}{get.get('path', '/')}"
            try:  # a kubelet does not verify the serving certificate, and counts 200-399 as success
                ok = 200 <= httpx.get(url, verify=False, timeout=timeout).status_code < 400
            except httpx.HTTPError as exc:
                ok = False
                self.log.append(f"{kind} {url}: {exc!r}")
            return ok
        if "exec" in spec:
            argv = [self.rewrite(str(a)) for a in spec["exec"]["command"]]
            try:
                result = self.exec(argv, timeout)
            except subprocess.TimeoutExpired:
                self.log.append(f"{kind} {argv}: timed out after {timeout} s")
                return False
            if result.returncode != 0:
                self.log.append(f"{kind} {argv}: exit {result.returncode}: {result.stderr.strip()[-300:]}")
            return result.returncode == 0
        raise NotImplementedError(f"{kind}Probe: {sorted(spec)}")

    def wait(self, kind: str, alive: Callable[[], bool], interval: float = 0.2) -> float:
        """Until the probe passes, within its failure budget (failureThreshold x periodSeconds after
        initialDelaySeconds), polled more often than periodSeconds; returns the seconds it took."""
        spec = self.container.get(f"{kind}Probe") or {}
        budget = (spec.get("initialDelaySeconds", 0) + spec.get("failureThreshold", 3) * spec.get("periodSeconds", 10))
        t0 = time.monotonic()
        while True:
            if not alive():
                raise RuntimeError(f"{kind} probe: the container exited; {self.log[-3:]}")
            if self.probe(kind):
                return time.monotonic() - t0
            if time.monotonic() - t0 > budget:
                raise TimeoutError(f"{kind} probe failed for {budget} s: {self.log[-3:]}")
            time.sleep(interval)

    def start_and_ready(self, alive: Callable[[], bool]) -> dict[str, float]:
        """What a kubelet needs before the pod is Ready and kept: startup passes, then readiness;
        a liveness run right after must pass too. Returns the seconds each took."""
        took = {"startup": self.wait("startup", alive)}
        took["readiness"] = self.wait("readiness", alive)
        if not self.probe("liveness"):
            raise RuntimeError(f"liveness probe failed on a ready container: {self.log[-3:]}")
        return took


def local_exec(argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """An exec probe for a process from source: the same command on this machine (same network),
    `python` being the interpreter the service runs on."""
    argv = [sys.executable if argv[0] == "python" else argv[0], *argv[1:]]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
