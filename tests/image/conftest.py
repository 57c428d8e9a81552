"""Fixtures of the image tests (`make image-test`; pyproject's norecursedirs keeps them out of `make test`).

The image `make image` built, run the way the chart's pod spec runs it: each container of the
rendered Deployments through tests/e2e/container.py (its user, read-only root, dropped capabilities,
env, args and mounts: ConfigMaps read-only, emptyDirs as tmpfs), with a snapshot mounted read-only
in place of the API server where a test says so, and every shell of the image masked (the service
must not need one). Beside it, where a test compares, the same container's command run from this
checkout on the same inputs.
"""

from __future__ import annotations

import itertools
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.cluster import Proc, free_port
from tests.e2e.container import Container, Prober, Volume, engine, loopback_rewrite, rewrite_listen, run_args
from tests.e2e.deploy import find, render
from tests.image.snapshot import write_big_snapshot

Obj = dict[str, Any]
SNAPSHOT_DIR = "/snapshot"  # where the snapshot folder is mounted
SNAPSHOT = f"{SNAPSHOT_DIR}/cluster.json"
GPU_PLACEMENT = str(Path(sys.executable).parent / "gpu-placement")
_names = itertools.count()


def without(args: Sequence[str], *flags: str) -> list[str]:
    """`args` less each of `flags` and its value (a flag's value is the next word unless that is a flag)."""
    out: list[str] = []
    skip = False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg in flags:
            skip = i + 1 < len(args) and not args[i + 1].startswith("--")
            continue
        out.append(arg)
    return out


@pytest.fixture(scope="session")
def image() -> str:
    """The chart's image (its default tag is the project's version): `make image` must have built it."""
    name = str(find(render(), "Deployment", "gpu-placement-webhook")["spec"]["template"]["spec"]["containers"][0]
               ["image"])
    if not engine().has_image(name):
        pytest.fail(f"{name} is not built: run `make image` first")
    return name


@pytest.fixture(scope="session")
def snapshot(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """(folder holding cluster.json, node names): 5,000 GPU nodes and the demo cluster."""
    folder = tmp_path_factory.mktemp("snapshot")
    folder.chmod(0o755)
    names = write_big_snapshot(folder / "cluster.json")
    (folder / "cluster.json").chmod(0o644)
    return folder, names


@pytest.fixture(scope="session")
def shells(image: str, tmp_path_factory: pytest.TempPathFactory) -> list[tuple[Path, str]]:
    """Read-only mounts of an empty file over every shell of the image (/etc/shells): nothing the
    service runs may need one."""
    listed = engine().run("run", "--rm", *engine().flags, "--entrypoint", "python", image, "-c",
                          "import os; print('\\n'.join(sorted({os.path.realpath(s.strip()) for s in "
                          "[*open('/etc/shells'), '/bin/sh'] if s.startswith('/') and os.path.exists(s.strip())})))"
                          ).stdout.split()
    assert len(listed) >= 2, listed  # /bin/sh's target and bash at least
    empty = tmp_path_factory.mktemp("noshell") / "empty"
    empty.write_bytes(b"")
    empty.chmod(0o444)
    return [(empty, shell) for shell in listed]


@dataclass
class Run:
    """One container of a rendered Deployment, from the image and (when asked) from source."""

    container: Container
    prober: Prober
    ports: dict[int, int]  # container port -> local port of the container
    args: list[str]  # the container's args, before the listen rewrite
    mounts: dict[str, Path]  # mount path in the container -> folder here (emptyDirs: a folder of their own)
    env: dict[str, str]
    started: float = 0.0  # when `run` was called (monotonic)
    source: Proc | None = None
    source_ports: dict[int, int] = field(default_factory=dict)
    source_started: float = 0.0
    ready_seconds: float = 0.0  # cold start: `run` to /readyz answering 200
    source_ready_seconds: float = 0.0

    def url(self, port: int, path: str, scheme: str = "http", source: bool = False) -> str:
        local = (self.source_ports if source else self.ports)[port]
        return f"{scheme}://127.0.0.1:{local}{path}"

    def start_source(self) -> Proc:
        """The same command from this checkout, its paths moved to the folders mounted into the container."""
        def here(arg: str) -> str:
            for path, folder in sorted(self.mounts.items(), key=lambda m: -len(m[0])):
                if arg == path or arg.startswith(path.rstrip("/") + "/"):
                    return str(folder) + arg[len(path.rstrip("/")):]
            return arg

        def local(port: int) -> int:
            return self.source_ports.setdefault(port, free_port())

        args = rewrite_listen([here(a) for a in self.args], local)
        self.source_started = time.monotonic()
        log = self.container.log_path.with_name("source.log")
        self.source = Proc(f"source-{self.container.name}", [GPU_PLACEMENT, *args], log, env=self.env).start()
        return self.source

    def stop(self) -> None:
        self.container.stop()
        if self.source:
            self.source.stop()


def _folders(spec: Obj, docs: list[Obj], work: Path, secrets: dict[str, Path]) -> dict[str, Volume]:
    """The pod's volumes: ConfigMaps written out, emptyDirs as tmpfs, Secrets from `secrets`."""
    volumes: dict[str, Volume] = {}
    for vol in spec.get("volumes", []):
        name = vol["name"]
        if "emptyDir" in vol:
            volumes[name] = Volume(None, vol["emptyDir"].get("sizeLimit"))
        elif "configMap" in vol:
            folder = work / "volumes" / name
            folder.mkdir(parents=True, exist_ok=True)
            for key, text in find(docs, "ConfigMap", vol["configMap"]["name"])["data"].items():
                (folder / key).write_text(text)
            volumes[name] = Volume(folder)
        elif "secret" in vol:
            volumes[name] = Volume(secrets[name])
    return volumes


class Chart:
    """Starts the rendered chart's containers from the image (and from source to compare)."""

    def __init__(self, image: str, work: Path, shells: list[tuple[Path, str]],
                 snapshot: Path | None = None) -> None:
        self.image, self.work, self.shells, self.snapshot = image, work, shells, snapshot
        self.runs: list[Run] = []

    def start(self, deployment: str, name: str, *, values: Obj | None = None,
              edit: Callable[[list[str]], list[str]] = list, secrets: dict[str, Path] | None = None,
              command: Sequence[str] = (), env: dict[str, str] | None = None,
              mounts: Sequence[tuple[Path, str]] = ()) -> Run:
        """`deployment`'s container `name` (chart rendered with `values`), its args passed through
        `edit` (e.g. a snapshot in place of the API server); `command` replaces the image's
        entrypoint, `mounts` adds read-only (folder, path) mounts."""
        docs = render(values)
        spec = find(docs, "Deployment", deployment)["spec"]["template"]["spec"]
        container = dict(next(c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name))
        if command:
            container["command"] = list(command)
        work = self.work / f"{name}-{next(_names)}"
        work.mkdir(parents=True)
        volumes = _folders(spec, docs, work, secrets or {})
        extra = [*self.shells, *mounts]
        if self.snapshot is not None:
            extra.append((self.snapshot, SNAPSHOT_DIR))
        ports: dict[int, int] = {}

        def local(port: int) -> int:
            return ports.setdefault(port, free_port())

        edited = edit([str(a) for a in container.get("args", [])])
        env = {"POD_NAMESPACE": "gpu-placement", **(env or {})}
        cname = f"image-test-{work.name}"
        cmd = run_args(cname, spec, container, rewrite_listen(edited, local), volumes, env, hostname=cname,
                       image=self.image, extra_mounts=extra)
        moved = {SNAPSHOT_DIR: self.snapshot} if self.snapshot else {}
        for mount in container.get("volumeMounts", []):
            folder = volumes[mount["name"]].host or work / "source" / mount["name"]
            folder.mkdir(parents=True, exist_ok=True)
            moved[mount["mountPath"]] = folder
        started = time.monotonic()
        proc = Container(cname, [*engine().command, *cmd], work / "container.log", container=cname,
                         grace=float(spec.get("terminationGracePeriodSeconds", 30))).start()
        prober = Prober(container, local, proc.exec, loopback_rewrite(ports))
        run = Run(proc, prober, ports, edited, moved, env, started)
        self.runs.append(run)
        return run

    def stop(self) -> None:
        for run in self.runs:
            run.stop()


@pytest.fixture
def chart(image: str, tmp_path: Path, shells: list[tuple[Path, str]],
          snapshot: tuple[Path, list[str]]) -> Iterator[Chart]:
    """Chart containers from the image, the 5,000-node snapshot mounted (args say whether to read it)."""
    tmp_path.chmod(0o755)
    runner = Chart(image, tmp_path, shells, snapshot[0])
    try:
        yield runner
    finally:
        runner.stop()


def wait_http(url: str, alive: Callable[[], bool], verify: Any = False, timeout: float = 120.0) -> float:
    """Seconds until `url` answers 200; fails if the process ends first."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if not alive():
            raise RuntimeError(f"exited before {url} answered")
        try:
            if httpx.get(url, verify=verify, timeout=2).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready within {timeout} s")


def exec_python(container: Container, code: str) -> str:
    result = container.exec(["python", "-c", code], timeout=30)
    assert result.returncode == 0, result.stderr
    return result.stdout
