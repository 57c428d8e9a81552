"""Does the slimmed image start as fast as the unslimmed one? Size and cold start of both.

    .venv/bin/python benchmarks/image_bench.py [--rounds 5] [--nodes 5000]

Builds (image/build.sh, layers cached) the Dockerfile as it is, and the same Dockerfile unslimmed:
pip byte-compiles the whole install and image/slim.py does not run (what the image was before it:
kubernetes.aio and its aiohttp stack in, a .pyc for every module). Then, alternating between the
two each round, runs the extender the chart's way (read-only root, user 65532, no capabilities)
over a snapshot of `--nodes` GPU nodes mounted read-only, and times `run` to /readyz answering 200;
and `--help` (interpreter and imports alone). Prints each image's venv size and the medians, the
unslimmed image being the floor. Run it under the machine's lock: `flock /tmp/e2e.lock ...`.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from tests.e2e.cluster import free_port  # noqa: E402
from tests.e2e.container import engine  # noqa: E402
from tests.image.snapshot import write_big_snapshot  # noqa: E402

VENV_SIZE = ("import os; print(sum(os.lstat(os.path.join(r, f)).st_size for r, _, fs in os.walk('/opt/venv') "
             "for f in fs))")


def build_unslimmed(tag: str) -> None:
    text = (ROOT / "Dockerfile").read_text()
    slim = "COPY image/slim.py /tmp/slim.py\nRUN /opt/pip/bin/python /tmp/slim.py /opt/venv\n"
    assert slim in text and " --no-compile" in text, "the Dockerfile changed: update this benchmark"
    variant = text.replace(slim, "").replace(" --no-compile", "")
    with tempfile.NamedTemporaryFile("w", dir=ROOT, prefix=".Dockerfile.", suffix=".unslimmed") as dockerfile:
        dockerfile.write(variant)
        dockerfile.flush()
        subprocess.run(["bash", "image/build.sh"], cwd=ROOT, check=True,
                       env={**os.environ, "IMAGE": tag, "DOCKERFILE": dockerfile.name})


def cold_start(image: str, snapshot: Path) -> float:
    port = free_port()
    name = f"image-bench-{port}"
    eng = engine()
    args = ["run", "--detach", "--rm", "--name", name, "--network", "host", *eng.flags, "--read-only",
            *(["--read-only-tmpfs=false"] if eng.podman else []), "--user", "65532:65532", "--cap-drop=ALL",
            "--volume", f"{snapshot}:/snapshot:ro", image, "serve", "--components", "extender",
            "--extender-listen", f"127.0.0.1:{port}", "--snapshot", "/snapshot/cluster.json"]
    t0 = time.monotonic()
    eng.run(*args)
    try:
        while time.monotonic() - t0 < 300:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200:
                    return time.monotonic() - t0
            except httpx.HTTPError:
                pass
            time.sleep(0.02)
        raise TimeoutError(f"{image}: not ready in 300 s")
    finally:
        eng.run("stop", "--time", "30", name, check=False)


def help_seconds(image: str) -> float:
    t0 = time.monotonic()
    engine().run("run", "--rm", *engine().flags, "--read-only", "--network", "none", image, "serve", "--help")
    return time.monotonic() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=5000)
    args = parser.parse_args()
    version = json.loads(subprocess.run([sys.executable, "-c", "import tomllib, json; print(json.dumps("
                                         "tomllib.load(open('pyproject.toml', 'rb'))['project']['version']))"],
                                        cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    slim, unslimmed = f"gpu-placement:{version}", f"gpu-placement:{version}-unslimmed"
    subprocess.run(["bash", "image/build.sh"], cwd=ROOT, check=True)
    build_unslimmed(unslimmed)
    with tempfile.TemporaryDirectory() as work:
        folder = Path(work)
        folder.chmod(0o755)
        write_big_snapshot(folder / "cluster.json", args.nodes)
        (folder / "cluster.json").chmod(0o644)
        starts: dict[str, list[float]] = {slim: [], unslimmed: []}
        helps: dict[str, list[float]] = {slim: [], unslimmed: []}
        for _ in range(args.rounds):
            for image in (unslimmed, slim):
                starts[image].append(cold_start(image, folder))
                helps[image].append(help_seconds(image))
    print(f"image_bench: {args.nodes} nodes, {args.rounds} rounds alternating, medians "
          "(2 shared cores, other engineers' work running)")
    for image in (unslimmed, slim):
        venv = int(engine().run("run", "--rm", *engine().flags, "--entrypoint", "python", image, "-c",
                                VENV_SIZE).stdout)
        size = int(engine().run("image", "inspect", "--format", "{{.Size}}", image).stdout)
        print(f"  {image:36} image {size / 1e6:6.1f} MB  venv {venv / 1e6:6.1f} MB  "
              f"cold start to /readyz {statistics.median(starts[image]):5.2f} s "
              f"(min {min(starts[image]):.2f})  `serve --help` {statistics.median(helps[image]):5.2f} s")
    ratio = statistics.median(starts[slim]) / statistics.median(starts[unslimmed])
    print(f"  slimmed / unslimmed cold start: {ratio:.2f} (floor: the unslimmed image)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
