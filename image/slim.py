"""Slim the service's venv in the image build (the Dockerfile's builder stage): `python slim.py /opt/venv`.

1. Prune what the service cannot import. The `kubernetes` distribution ships its client twice: the
   synchronous one the service uses (gpu_placement/kube/api.py: configuration, auth, one raw call) and
   an asyncio twin, `kubernetes.aio`, 60 MB of generated code. The twin goes, and with it each
   distribution kubernetes requires for it that nothing else requires (aiohttp-retry; aiohttp
   stays while the service's /bind uses it), found from the installed metadata.
2. Byte-code for exactly what the service imports. pip installed no .pyc (`--no-compile`); this
   runs each command the image serves once, as the chart runs it, with byte-code writing on, so
   Python writes a .pyc for every module that is imported and for no other (the thousands of
   generated API and model modules of `kubernetes.client` are imported lazily, by name, and the
   service names none). The .pyc files are then rewritten as unchecked-hash ones: valid whatever
   file times the copy into the final stage gives the sources, and never compared with them at start.
   The service's own modules are all compiled, seen or not: each is imported in some configuration
   the build cannot reach without a cluster (resource.k8s.io served: the DRA modules; `explain` of a
   pod with claims), and together they weigh about 1 MB.

`make image-test` checks the result from the other side: the service, run from the image as the
chart runs it, imports no module without its .pyc and none of what was pruned. The runs here also
smoke-test the build: a command that fails fails the build.
"""

from __future__ import annotations

import contextlib
import json
import os
import py_compile
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from importlib.metadata import PathDistribution
from pathlib import Path
from typing import Any

# The asyncio twin, and what kubernetes requires for it alone (aiohttp is the service's own
# dependency too since /bind went asynchronous: it stays, and so does what it needs).
PRUNED_PACKAGES = ["kubernetes/aio"]
PRUNED_OWNER = "kubernetes"
PRUNED_ROOTS = ["aiohttp", "aiohttp-retry"]

# A pod for `explain`, as a user would write it.
POD = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train", "namespace": "research"},
       "spec": {"containers": [{"name": "main", "image": "nvcr.io/nvidia/pytorch:24.05-py3",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


def _name(text: str) -> str:
    return re.sub(r"[-_.]+", "-", text).lower()


def _distributions(site: Path) -> dict[str, PathDistribution]:
    return {_name(d.metadata["Name"]): d for d in (PathDistribution(p) for p in site.glob("*.dist-info"))}


def _requires(dist: PathDistribution) -> set[str]:
    """Names of what a distribution needs, extras left out (none of them is installed for it)."""
    names = set()
    for req in dist.requires or []:
        if "extra ==" not in req:
            names.add(_name(re.split(r"[\s;<>=!~\[(]", req, maxsplit=1)[0]))
    return names


def exclusive_dependencies(dists: dict[str, PathDistribution], roots: list[str], owner: str) -> list[str]:
    """Of `roots` (requirements of `owner` for the part of it pruned) and what they need, the
    distributions that nothing else requires: each goes when every distribution requiring it is
    `owner` or goes too."""
    users = {name: {user for user, d in dists.items() if name in _requires(d)} for name in dists}
    candidates = {_name(r) for r in roots if _name(r) in dists}
    gone: set[str] = set()
    while True:
        more = {name for name in candidates - gone if users[name] <= gone | {owner}}
        if not more:
            return sorted(gone)
        gone |= more
        candidates |= {dep for name in more for dep in _requires(dists[name]) if dep in dists}


def prune(venv: Path, site: Path) -> None:
    for package in PRUNED_PACKAGES:
        shutil.rmtree(site / package)
        print(f"slim: removed {package} (never imported by the service)")
    dists = _distributions(site)
    for name in PRUNED_ROOTS:
        assert name in dists, f"{name} is not installed: update PRUNED_ROOTS"
    names = exclusive_dependencies(dists, PRUNED_ROOTS, PRUNED_OWNER)
    if names:
        subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "uninstall",
                        "--yes", "--quiet", *names], check=True)
        print(f"slim: uninstalled {', '.join(names)} (required for {PRUNED_OWNER}.aio only)")
    for name in sorted(set(PRUNED_ROOTS) - set(names)):
        needed = sorted(u for u, d in dists.items() if name in _requires(d) and u != PRUNED_OWNER)
        print(f"slim: kept {name} (required by {', '.join(needed)})")


# -- running the service's commands once ---------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(venv: Path, *args: str) -> None:
    run = subprocess.run([str(venv / "bin" / "gpu-placement"), *args], stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, timeout=300, check=False)
    if run.returncode != 0:
        raise RuntimeError(f"gpu-placement {' '.join(args)}: exit {run.returncode}\n{run.stdout[-3000:]}")


def _get(url: str, context: object = None) -> int:
    try:
        with urllib.request.urlopen(url, timeout=2, context=context) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def _serve(venv: Path, args: list[str], ready: str | None, seconds: float = 60) -> None:
    """`serve` until `ready` answers 200, then SIGTERM: exit 0 expected. With `ready` None (no API
    server to be ready with), a few seconds or until it gives up, whatever its exit."""
    import ssl

    insecure = ssl.create_default_context()
    insecure.check_hostname, insecure.verify_mode = False, ssl.CERT_NONE
    log = tempfile.TemporaryFile()  # noqa: SIM115 - read back on failure
    proc = subprocess.Popen([str(venv / "bin" / "gpu-placement"), "serve", *args], stdout=log,
                            stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + (seconds if ready else 3)
        while time.monotonic() < deadline and proc.poll() is None:
            if ready:
                with contextlib.suppress(OSError):
                    if _get(ready, insecure) == 200:
                        for path in ("/healthz", "/metrics"):
                            _get(ready.rsplit("/", 1)[0] + path, insecure)
                        break
            time.sleep(0.1)
        else:
            if ready:
                raise RuntimeError(f"serve {' '.join(args)}: not ready (exit {proc.poll()})\n{_tail(log)}")
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    if ready and code != 0:
        raise RuntimeError(f"serve {' '.join(args)}: exit {code} after SIGTERM\n{_tail(log)}")


def _tail(log: Any) -> str:
    log.seek(0)
    return str(log.read()[-3000:].decode(errors="replace"))


def run_commands(venv: Path, work: Path) -> None:
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # the point of these runs
    for command in ([], ["serve"], ["demo"], ["explain"], ["nodes"], ["certs"]):
        _run(venv, *command, "--help")
    _run(venv, "demo")  # every endpoint over real HTTP(S), as the API server and kube-scheduler call them
    snapshot, certs = work / "snapshot", work / "certs"
    _run(venv, "demo", "--write-snapshot", str(snapshot))
    (work / "pod.json").write_text(json.dumps(POD))
    _run(venv, "nodes", "--snapshot", str(snapshot))
    for output in ("text", "json"):
        _run(venv, "explain", str(work / "pod.json"), "--snapshot", str(snapshot), "--all", "-o", output)
    _run(venv, "certs", "--out", str(certs), "--service", "gpu-placement-webhook", "--namespace", "gpu-placement")
    # The chart's two containers over a snapshot, with the certificate as a mounted Secret gives it.
    extender, webhook = _free_port(), _free_port()
    _serve(venv, ["--snapshot", str(snapshot), "--components", "extender", "--extender-listen",
                  f"127.0.0.1:{extender}", "--managed-resources", "nvidia.com/gpu"],
           f"http://127.0.0.1:{extender}/readyz")
    _serve(venv, ["--snapshot", str(snapshot), "--components", "webhook", "--webhook-listen",
                  f"127.0.0.1:{webhook}", "--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key"),
                  "--log-level", "debug"], f"https://127.0.0.1:{webhook}/readyz")
    # The chart's args against an API server (none answers here: this covers loading the client
    # configuration and the first attempts, up to the error that ends them).
    kubeconfig = work / "kubeconfig"
    kubeconfig.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "build",
        "clusters": [{"name": "build", "cluster": {"server": f"https://127.0.0.1:{_free_port()}",
                                                   "certificate-authority": str(certs / "ca.crt")}}],
        "users": [{"name": "build", "user": {"token": "build"}}],
        "contexts": [{"name": "build", "context": {"cluster": "build", "user": "build"}}]}))
    cluster = ["--kubeconfig", str(kubeconfig), "--namespace", "gpu-placement"]
    _serve(venv, [*cluster, "--components", "webhook", "--webhook-listen", f"127.0.0.1:{webhook}",
                  "--tls-cert", str(certs / "tls.crt"), "--tls-key", str(certs / "tls.key"),
                  "--quota-lease", "gpu-placement-quota-mirror"], None)  # the quota mirror, its Lease
    _serve(venv, [*cluster, "--components", "webhook", "--webhook-listen", f"127.0.0.1:{webhook}", "--manage-certs",
                  "--cert-secret", "gpu-placement-webhook-tls", "--service", "gpu-placement-webhook",
                  "--webhook-configuration", "gpu-placement", "--cert-dir", str(work / "managed"),
                  "--quota-lease", "gpu-placement-quota-mirror"], None)
    _serve(venv, [*cluster, "--components", "extender", "--extender-listen", f"127.0.0.1:{extender}"], None)


def own_sources(site: Path) -> list[Path]:
    """Every module of the service's own distribution (gpu_placement, extender, webhook)."""
    dist = _distributions(site)["gpu-placement"]
    return [Path(str(dist.locate_file(f))) for f in dist.files or [] if f.suffix == ".py"]


def _module(site: Path, source: Path) -> str:
    return ".".join(source.relative_to(site).with_suffix("").parts).removesuffix(".__init__")


def freeze_bytecode(site: Path, also: list[Path]) -> tuple[int, int]:
    """Compile, as unchecked-hash .pyc, each source the runs left a .pyc for (that .pyc replaced) and
    each of `also`; returns (compiled, modules in the venv)."""
    sources = set(also)
    for pyc in list(site.rglob("__pycache__/*.pyc")):
        source = pyc.parent.parent / (pyc.name.split(".", 1)[0] + ".py")
        pyc.unlink()
        if source.exists():
            sources.add(source)
    for source in sources:
        py_compile.compile(str(source), doraise=True, invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)
    return len(sources), sum(1 for _ in site.rglob("*.py"))


def main() -> int:
    venv = Path(sys.argv[1])
    site = next((venv / "lib").glob("python3*/site-packages"))
    assert not any(site.rglob("*.pyc")), "install with pip --no-compile: the .pyc files come from the runs"
    prune(venv, site)
    with tempfile.TemporaryDirectory() as work:
        run_commands(venv, Path(work))
    own = own_sources(site)
    unseen = [s for s in own if not any((s.parent / "__pycache__").glob(f"{s.stem}.*.pyc"))]
    compiled, modules = freeze_bytecode(site, own)
    print(f"slim: {compiled} of {modules} modules byte-compiled: those the runs imported, and all {len(own)} of"
          f" the service's own ({len(unseen)} not imported by the runs: {', '.join(_module(site, s) for s in unseen)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
