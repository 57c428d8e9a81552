"""An NGC framework image of a release gpu-placement's NGC table lacks must not pass unchecked in
silence (issue 42): /validate warns (kubectl prints it) with the tag, that no CUDA check applies and the
fix, and counts the pod; `ngcReleases` in the configuration feeds the table newer rows without a new
release, and then the image's CUDA is checked like any other (docs/rules.md, CUDA compatibility)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from gpu_placement.app.cli import main
from gpu_placement.base.config import ConfigError, parse_config
from gpu_placement.base.cuda import ngc_table
from gpu_placement.facts.cudaneed import ngc_unlisted
from gpu_placement.observe.metrics import NGC_UNCHECKED
from gpu_placement.samples.cluster import driver_labels, make_node, namespace, validator_pod
from gpu_placement.view.ingest import Ingest
from gpu_placement.web.certs import CertBundle
from tests.support.webhook import TEST_CONFIG, Webhook, serving, user_pod

pytestmark = pytest.mark.timeout(30)
NEWEST = ngc_table().newest  # 26.03 on 2026-12-07
LATER = "26.07"  # a release NVIDIA shipped after the table's last
ROW = {"release": LATER, "cuda": "13.3.1",
       "source": "PyTorch Release 26.07 notes: 'Release 26.07 is based on CUDA 13.3.1'"}
PYTORCH = f"nvcr.io/nvidia/pytorch:{LATER}-py3"


def warned(hook: Webhook, pod: dict[str, Any], ns: str = "team-a", **kwargs: Any) -> list[str]:
    _, verdict = hook.admit(pod, ns, **kwargs)
    assert verdict["allowed"] is True, verdict
    return [w for w in verdict.get("warnings", ()) if "no CUDA check applies" in w]


def counted(why: str) -> float:
    return float(NGC_UNCHECKED.labels(why)._value.get())


def gpu_pod(image: str, **kwargs: Any) -> dict[str, Any]:
    return user_pod("team-a", "train", gpus={"nvidia.com/gpu": 1}, image=image, **kwargs)


def test_a_release_newer_than_the_table_is_warned_about_with_the_tag_and_the_fix_and_counted(hook: Webhook) -> None:
    before = counted("newer")
    (warning,) = warned(hook, gpu_pod(PYTORCH))
    assert warning == (
        f"pod team-a/train: no CUDA check applies: image {PYTORCH} is NGC release {LATER}, newer than "
        f"gpu-placement's table of NGC releases (its last is {NEWEST}), so no node's driver is checked against its "
        "CUDA and the pod may land on a driver too old for it: set gpu-placement.io/cuda on the pod or its namespace "
        f"(the CUDA of release {LATER}, from its release notes, e.g. \"13.0\"), or have the platform team add release "
        f"{LATER} to ngcReleases in gpu-placement's configuration (docs/rules.md, CUDA compatibility)")
    assert counted("newer") == before + 1
    assert warned(hook, gpu_pod(PYTORCH), dry_run=True)  # kubectl --dry-run=server sees it too, uncounted
    assert counted("newer") == before + 1


def test_a_release_the_table_skips_is_a_gap(hook: Webhook) -> None:
    before = counted("gap")
    (warning,) = warned(hook, gpu_pod("nvcr.io/nvidia/tensorflow:25.07-tf2-py3"))
    assert f"is NGC release 25.07, one gpu-placement's table of NGC releases lacks (22.09 to {NEWEST})" in warning
    assert counted("gap") == before + 1


def test_no_warning_where_a_cuda_requirement_is_checked_or_no_gpu_is_asked(hook: Webhook) -> None:
    before = counted("newer")
    assert warned(hook, gpu_pod(PYTORCH, annotations={"gpu-placement.io/cuda": "13.0"})) == []
    cuda_ns = namespace("cuda-ns", {"gpu-placement.io/quota": "nvidia.com/gpu=4", "gpu-placement.io/cuda": "13.0"})
    with hook.view.lock:
        hook.ingest.event(hook.view, Ingest.kind_of(cuda_ns) or "", "ADDED", cuda_ns)
    assert warned(hook, user_pod("cuda-ns", "train", gpus={"nvidia.com/gpu": 1}, image=PYTORCH), "cuda-ns") == []
    sidecar = gpu_pod(PYTORCH)
    sidecar["spec"]["containers"].append({"name": "tools", "image": "nvcr.io/nvidia/cuda:13.0.0-base-ubuntu24.04"})
    assert warned(hook, sidecar) == []  # the other image names a CUDA: that is checked
    env = gpu_pod(PYTORCH)
    env["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=13.0"}]
    assert warned(hook, env) == []
    assert warned(hook, gpu_pod("nvcr.io/nvidia/pytorch:24.05-py3")) == []  # in the table
    assert warned(hook, user_pod("web", "cpu", image=PYTORCH), "web") == []  # no GPU: no CUDA to check
    assert counted("newer") == before


@pytest.fixture(scope="module")
def fed(bundle: CertBundle) -> Iterator[Webhook]:
    with serving(bundle, {**TEST_CONFIG, "ngcReleases": [ROW]}) as hook:
        yield hook


def test_a_configured_row_makes_the_release_known_and_silences_the_warning(fed: Webhook) -> None:
    fed.reset()
    before = counted("newer")
    assert warned(fed, gpu_pod(PYTORCH)) == []
    assert counted("newer") == before
    later = "nvcr.io/nvidia/pytorch:26.08-py3"  # the next one is newer than the fed table's last
    (warning,) = warned(fed, gpu_pod(later))
    assert f"newer than gpu-placement's table of NGC releases (its last is {LATER})" in warning


def test_explain_checks_the_fed_release_against_each_driver(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                                            ) -> None:
    """With the row, the image needs CUDA 13.3.1: a 550 driver (CUDA 12.4) is DriverTooOld, a 590 one fits."""
    objects = [namespace("team", {"gpu-placement.io/quota": "nvidia.com/gpu=4"}), namespace("gpu-operator")]
    for name, driver in (("old", ("550.54.15", "12.4")), ("new", ("590.48.01", "13.3"))):
        objects += [make_node(name, "h100x8", labels=driver_labels(*driver)), validator_pod(name)]
    cluster = tmp_path / "cluster.json"
    cluster.write_bytes(orjson.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    pod = tmp_path / "train.yaml"
    pod.write_text(yaml.safe_dump(user_pod("team", "train", gpus={"nvidia.com/gpu": 1}, image=PYTORCH)))
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"ngcReleases": [ROW]}))

    assert main(["explain", str(pod), "--snapshot", str(cluster)]) == 0
    out = capsys.readouterr().out
    assert f"NGC release {LATER} is newer than gpu-placement's table of NGC releases (its last is {NEWEST}; a " \
           "platform engineer adds it to ngcReleases in the configuration)" in out
    assert "no CUDA check applies" in out  # the webhook's warning, as explain shows admission

    assert main(["explain", str(pod), "--snapshot", str(cluster), "--config", str(config)]) == 0
    out = capsys.readouterr().out
    assert (f"CUDA >= 13.3.1 (NGC pytorch {LATER} of container main, CUDA 13.3.1 by ngcReleases in gpu-placement's "
            "configuration, minor-version compatible)") in out
    verdicts = {line.split()[0]: line.split()[1] for line in out.splitlines() if line.startswith(("old ", "new "))}
    assert verdicts == {"old": "DriverTooOld", "new": "pass"}
    assert "no CUDA check applies" not in out


@pytest.mark.parametrize(("row", "message"), [
    ({**ROW, "release": 26.07}, 'ngcReleases[0].release must be an NGC release as its tags begin, YY.MM like "26.07" '
                                "(quote it: YAML reads 26.07 as a number), got 26.07"),
    ({**ROW, "release": "2026.07"}, "ngcReleases[0].release must be an NGC release as its tags begin"),
    ({**ROW, "cuda": 13.3}, 'ngcReleases[0].cuda must be the CUDA version the release notes give, like "13.3.1" '
                            "(quote it: YAML reads 13.3 as a number), got 13.3"),
    ({**ROW, "cuda": "13"}, 'ngcReleases[0].cuda must be major.minor[.patch] like "13.3.1", got \'13\''),
    ({**ROW, "cuda": "thirteen"}, "ngcReleases[0].cuda: \"thirteen\" is not a version number"),
    ({"release": LATER, "cuda": "13.3.1"}, "ngcReleases[0].source must say where the CUDA figure was read"),
    ({**ROW, "forwardCompat": ["535"]}, None),
    ({**ROW, "forwardCompat": ["R535"]}, 'ngcReleases[0].forwardCompat[0]: "R535" is not a version number'),
    ({**ROW, "notes": "x"}, "unknown key ngcReleases[0].notes"),
    ({"release": "24.05", "cuda": "12.6", "source": "x"}, "ngcReleases[0]: release 24.05 is in gpu-placement's own "
                                                          "NGC table with CUDA 12.4.1"),
])
def test_bad_rows_are_refused_naming_the_key(row: dict[str, Any], message: str | None) -> None:
    if message is None:
        assert parse_config({"ngcReleases": [row]}).ngc.releases[LATER].forward == ((535,),)
        return
    with pytest.raises(ConfigError) as caught:
        parse_config({"ngcReleases": [row]})
    assert str(caught.value).startswith(message), str(caught.value)


def test_a_row_a_later_table_holds_is_dropped_when_it_agrees_and_a_release_twice_is_refused() -> None:
    assert parse_config({"ngcReleases": [{"release": "24.05", "cuda": "12.4", "source": "x"}]}).ngc_releases == ()
    with pytest.raises(ConfigError, match=r"ngcReleases\[1\]\.release 26\.07 is listed twice"):
        parse_config({"ngcReleases": [ROW, ROW]})


def test_unlisted_images_are_found_by_string_work_alone() -> None:
    spec = {"initContainers": [{"name": "fetch", "image": "nvcr.io/nvidia/pytorch:26.09-py3-igpu"}],
            "containers": [{"name": "main", "image": PYTORCH}, {"name": "again", "image": PYTORCH},
                           {"name": "other", "image": "docker.io/someone/pytorch:26.07-py3"},
                           {"name": "known", "image": "nvcr.io/nvidia/jax:24.05-py3"},
                           {"name": "digest", "image": f"{PYTORCH}@sha256:{'0' * 64}"}]}
    assert [(u.image, u.release, u.newer) for u in ngc_unlisted(spec)] == [
        ("nvcr.io/nvidia/pytorch:26.09-py3-igpu", "26.09", True), (PYTORCH, LATER, True),
        (f"{PYTORCH}@sha256:{'0' * 64}", LATER, True)]
    assert ngc_unlisted(spec, parse_config({"ngcReleases": [ROW]}).ngc) == [
        ngc_unlisted(spec)[0]]
