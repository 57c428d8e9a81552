"""A real Prometheus server for tests, fed backfilled samples.

The samples are written as OpenMetrics, turned into TSDB blocks by `promtool tsdb
create-blocks-from openmetrics` (the documented backfill path), and served by Debian's `prometheus`
started on a free loopback port in a temp dir. `make test` puts both binaries in .venv/bin (linked from
PATH, or unpacked from Debian's package where they are missing).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import httpx

__all__ = ["PrometheusServer", "Series", "openmetrics", "tool"]

# (metric, labels, [(unix seconds, value), ...])
Series = tuple[str, dict[str, str], list[tuple[float, float]]]


def openmetrics(series: Iterable[Series]) -> str:
    """Gauges, one family per metric, each series' samples in time order, ending in `# EOF`."""
    families: dict[str, list[str]] = {}
    for metric, labels, samples in series:
        text = ",".join(f'{key}="{value}"' for key, value in sorted(labels.items()))
        lines = families.setdefault(metric, [f"# TYPE {metric} gauge"])
        lines += [f"{metric}{{{text}}} {_number(value)} {at:.3f}" for at, value in sorted(samples)]
    return "\n".join(line for lines in families.values() for line in lines) + "\n# EOF\n"


def _number(value: float) -> str:
    """OpenMetrics' spelling: NaN, +Inf and -Inf for the values that are not numbers."""
    if value != value:
        return "NaN"
    if value in (float("inf"), float("-inf")):
        return "+Inf" if value > 0 else "-Inf"
    return f"{value:g}"


def tool(name: str) -> str:
    """`prometheus` or `promtool`: the one `make install` put beside the venv's python, else one on PATH."""
    beside = Path(sys.executable).with_name(name)
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is missing: `make install` (or `make test`) puts it in .venv/bin")
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PrometheusServer:
    def __init__(self, workdir: Path, samples: str, retention: str = "1d") -> None:
        """`retention`: how far back from the newest sample Prometheus keeps blocks."""
        self.workdir = workdir
        self.data = data = workdir / "data"
        data.mkdir(parents=True)
        (workdir / "samples.om").write_text(samples)
        subprocess.run([tool("promtool"), "tsdb", "create-blocks-from", "openmetrics", str(workdir / "samples.om"),
                        str(data)], check=True, capture_output=True, timeout=120)
        (workdir / "prometheus.yml").write_text("global: {evaluation_interval: 1m}\nscrape_configs: []\n")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.retention = retention
        self._start()

    def _start(self) -> None:
        self._log = (self.workdir / "prometheus.log").open("ab")
        self.process = subprocess.Popen(
            [tool("prometheus"), f"--config.file={self.workdir / 'prometheus.yml'}", f"--storage.tsdb.path={self.data}",
             f"--web.listen-address=127.0.0.1:{self.port}", f"--storage.tsdb.retention.time={self.retention}"],
            stdout=self._log, stderr=subprocess.STDOUT)
        self._wait(lambda: httpx.get(f"{self.url}/-/ready", timeout=2).status_code == 200)

    def add_blocks(self, blocks: Path) -> None:
        """Stop, move the TSDB blocks made elsewhere (promtool's rule backfill) into the data dir, start
        again: Prometheus takes blocks in at start."""
        self.stop()
        for block in blocks.iterdir():
            if block.is_dir():
                shutil.move(str(block), self.data / block.name)
        self._start()

    def _wait(self, ready: Callable[[], bool], timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prometheus exited: {(self.workdir / 'prometheus.log').read_text()[-2000:]}")
            try:
                if ready():
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("prometheus did not become ready in time")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        self._log.close()
