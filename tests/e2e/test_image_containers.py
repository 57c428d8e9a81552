"""The chart's gpu-placement containers in this suite are the image `make image` built, started as
the chart renders them (tests/e2e/deploy.py, container.py), and the chart's probes pass against them.

Run by `make image-test` (E2E_IMAGE=1); `make e2e` leaves this file out, it ran just before."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import E2E
from tests.e2e.container import Container, engine, security_context
from tests.e2e.deploy import FROM_SOURCE, SERVICE_ACCOUNT_DIR, Pod

pytestmark = pytest.mark.timeout(300)


def test_the_suite_was_started_with_the_image() -> None:
    assert not FROM_SOURCE, "run with E2E_IMAGE=1 (make image-test does): the service runs from source here"

INSIDE = """
import json, os
def writable(path):
    try:
        with open(os.path.join(path, ".probe"), "w"):
            pass
        os.unlink(os.path.join(path, ".probe"))
        return True
    except OSError:
        return False
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()),
                  "cap_eff": int(status["CapEff"].strip(), 16), "no_new_privs": status["NoNewPrivs"].strip(),
                  "writable": {p: writable(p) for p in ("/", "/opt/venv", "/etc/gpu-placement", "/tmp")},
                  "token": os.path.exists("SERVICE_ACCOUNT_DIR/token"),
                  "cmdline": open("/proc/1/cmdline").read().split("\\0")}))
""".replace("SERVICE_ACCOUNT_DIR", SERVICE_ACCOUNT_DIR)


def _running(e2e: E2E) -> list[tuple[Pod, str]]:
    assert e2e.scheduler is not None
    return [(e2e.webhooks[0], "webhook"), (e2e.scheduler, "extender")]


def test_the_service_runs_from_the_image_as_the_chart_renders_it(e2e: E2E) -> None:
    for pod, name in _running(e2e):
        proc = pod.procs[name]
        assert isinstance(proc, Container) and proc.running(), f"{name} is not a container from the image"
        container = pod.container(name)
        sc = security_context(pod.template["spec"], container)
        field = "{{.ImageName}}" if engine().podman else "{{.Config.Image}}"
        image = engine().run("inspect", "--format", field, proc.container).stdout
        assert container["image"] in image
        result = proc.exec(["python", "-c", INSIDE], timeout=30)
        assert result.returncode == 0, result.stderr
        inside = json.loads(result.stdout)
        assert (inside["uid"], inside["gid"]) == (sc["runAsUser"], sc["runAsGroup"])
        assert pod.template["spec"]["securityContext"]["fsGroup"] in inside["groups"]
        assert inside["cap_eff"] == 0, "capabilities: drop [ALL]"
        assert inside["no_new_privs"] == "1", "allowPrivilegeEscalation: false"
        mounts = {m["mountPath"] for m in container["volumeMounts"]}
        assert inside["writable"] == {"/": False, "/opt/venv": False, "/etc/gpu-placement": False,
                                      "/tmp": "/tmp" in mounts}, "read-only root; only the emptyDir is writable"
        assert inside["token"], "the service-account token where a pod has it"
        # PID 1 is the entrypoint with the chart's args (listen ports moved): in-cluster, no kubeconfig.
        assert inside["cmdline"][1].endswith("gpu-placement") and "--kubeconfig" not in inside["cmdline"]
        assert inside["cmdline"][2:2 + 3] == [str(a) for a in container["args"][:3]]


def test_the_charts_probes_pass_against_the_containers(e2e: E2E) -> None:
    for pod, name in _running(e2e):
        prober = pod.prober(name)
        kinds = [k for k in ("startup", "readiness", "liveness") if f"{k}Probe" in pod.container(name)]
        assert kinds == ["startup", "readiness", "liveness"], name
        for kind in kinds:
            assert prober.probe(kind), f"{name} {kind}: {prober.log[-1:]}"
        assert e2e.probed[pod.procs[name].name], "the suite waited on them before using the container"
