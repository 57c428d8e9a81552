"""Snapshots: what `kubectl get nodes,pods,namespaces -A -o json|yaml` prints, files and folders, reloads."""

from __future__ import annotations

import asyncio
import copy
import os
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from extender.binding import SnapshotBinder
from gpu_placement.base.config import Config
from gpu_placement.samples.cluster import make_node, make_pod, namespace, validator_pod
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import Ingest
from gpu_placement.view.snapshot import SnapshotError, SnapshotSource, read_objects
from tests.support.waiting import wait_for

GPU = "nvidia.com/gpu"
H100 = 81559


def _objects() -> list[dict[str, Any]]:
    return [namespace("ml", {"gpu-placement.io/gpu-memory": "4Gi"}), namespace("gpu-operator"),
            make_node("gpu-1", "h100x8"), make_node("gpu-2", "t4-timeslicing"), validator_pod("gpu-1"),
            validator_pod("gpu-2"), make_pod("ml", "train", gpus={GPU: 2}, node="gpu-1"),
            make_pod("ml", "queued", gpus={GPU: 1})]


def kubectl_list(objects: list[dict[str, Any]]) -> dict[str, Any]:
    """`kubectl get nodes,pods,namespaces -A -o json`: one List, items carrying kind and apiVersion."""
    return {"apiVersion": "v1", "kind": "List", "items": copy.deepcopy(objects), "metadata": {"resourceVersion": ""}}


def _write(path: Path, data: bytes | str) -> None:
    """Write, and move the mtime on so a reload poll sees a change even within one clock tick."""
    before = path.stat().st_mtime_ns if path.exists() else 0
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    if before:
        os.utime(path, ns=(before + 10**9, before + 10**9))


def _kinds(objects: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return sorted((obj["kind"], obj["metadata"]["name"]) for obj in objects)


EXPECTED = _kinds(_objects())


def test_kubectl_json_list(tmp_path: Path) -> None:
    path = tmp_path / "cluster.json"
    _write(path, orjson.dumps(kubectl_list(_objects()), option=orjson.OPT_INDENT_2))
    assert _kinds(read_objects(path)) == EXPECTED


def test_kubectl_yaml_list_and_multi_document_yaml(tmp_path: Path) -> None:
    listed = tmp_path / "cluster.yaml"
    _write(listed, yaml.safe_dump(kubectl_list(_objects())))
    assert _kinds(read_objects(listed)) == EXPECTED
    documents = tmp_path / "cluster.yml"
    _write(documents, yaml.safe_dump_all(_objects()) + "---\n")  # a trailing empty document is fine
    assert _kinds(read_objects(documents)) == EXPECTED


def test_a_folder_of_several_files(tmp_path: Path) -> None:
    objects = _objects()
    (tmp_path / "nodes").mkdir()
    _write(tmp_path / "nodes" / "gpu.json", orjson.dumps(kubectl_list(objects[2:4])))
    _write(tmp_path / "namespaces.yaml", yaml.safe_dump(kubectl_list(objects[:2])))
    _write(tmp_path / "pods.yml", yaml.safe_dump_all(objects[4:]))
    _write(tmp_path / "README.md", "# not a snapshot file\n")
    assert _kinds(read_objects(tmp_path)) == EXPECTED


def test_typed_lists_whose_items_carry_no_kind(tmp_path: Path) -> None:
    """What the API server itself returns for `GET /api/v1/nodes`: a NodeList, items without kind."""
    def bare(objs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [{k: v for k, v in obj.items() if k not in ("kind", "apiVersion")} for obj in objs]

    objects = _objects()
    _write(tmp_path / "nodes.json", orjson.dumps({"apiVersion": "v1", "kind": "NodeList", "metadata": {},
                                                  "items": bare(objects[2:4])}))
    _write(tmp_path / "pods.json", orjson.dumps({"kind": "PodList", "items": bare(objects[4:])}))
    _write(tmp_path / "namespaces.yaml", yaml.safe_dump({"kind": "NamespaceList", "items": bare(objects[:2])}))
    assert _kinds(read_objects(tmp_path)) == EXPECTED


@pytest.mark.parametrize(("name", "text", "problem"), [
    ("broken.json", '{"kind": "List", "items": [', "not valid JSON"),
    ("broken.yaml", "kind: List\nitems: [\n  - {kind: Node\n", "not valid YAML"),
    ("nokind.json", '{"metadata": {"name": "gpu-1"}}', "has no kind (name 'gpu-1')"),
    ("noitems.json", '{"kind": "List", "items": {}}', "List has no items list"),
    ("scalar.yaml", "just a sentence\n", "expected Kubernetes objects or a List, found str"),
])
def test_a_file_that_does_not_parse_names_file_and_problem(tmp_path: Path, name: str, text: str,
                                                           problem: str) -> None:
    _write(tmp_path / "good.json", orjson.dumps(kubectl_list(_objects())))
    _write(tmp_path / name, text)
    for path in (tmp_path / name, tmp_path):  # alone, and inside a folder of good files
        with pytest.raises(SnapshotError) as caught:
            read_objects(path)
        assert str(caught.value).startswith(f"{tmp_path / name}: ")
        assert problem in str(caught.value)


def test_missing_path_and_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(SnapshotError, match="no such file or folder"):
        read_objects(tmp_path / "nope.json")
    with pytest.raises(SnapshotError, match=r"folder has no \.json, \.yaml or \.yml files"):
        read_objects(tmp_path)


# -- SnapshotSource ----------------------------------------------------------------------------
class Snapshot:
    def __init__(self, path: Path, objects: list[dict[str, Any]]) -> None:
        self.path = path
        _write(path, orjson.dumps(kubectl_list(objects)))
        self.config = Config()
        self.view = ClusterView(self.config)
        self.source = SnapshotSource(path, self.view, Ingest(self.config))
        self.source.load()

    def rewrite(self, objects: list[dict[str, Any]] | None = None, text: bytes | None = None) -> bool:
        _write(self.path, text if text is not None else orjson.dumps(kubectl_list(objects or [])))
        return self.source.reload_if_changed()

    def free(self, node: str) -> tuple[int, int | None]:
        return self.view.free_units[GPU][node], self.view.free_mib[GPU][node]


def test_load_builds_the_view(tmp_path: Path) -> None:
    snap = Snapshot(tmp_path / "cluster.json", _objects())
    assert sorted(snap.view.nodes) == ["gpu-1", "gpu-2"]
    assert snap.free("gpu-1") == (6, 6 * H100)
    assert snap.view.validator_state("gpu-1").ready
    assert snap.view.namespaces["ml"].get("gpu-placement.io/gpu-memory") == "4Gi"
    assert snap.view.listed == {"nodes", "pods", "namespaces", "poddisruptionbudgets"}


def test_reload_only_when_the_file_changes(tmp_path: Path) -> None:
    objects = _objects()
    snap = Snapshot(tmp_path / "cluster.json", objects)
    assert snap.source.reload_if_changed() is False  # nothing changed
    more = [*objects, make_node("gpu-3", "h100"), make_pod("ml", "eval", gpus={GPU: 4}, node="gpu-1")]
    assert snap.rewrite(more) is True
    assert sorted(snap.view.nodes) == ["gpu-1", "gpu-2", "gpu-3"]
    assert snap.free("gpu-1") == (2, 2 * H100)
    assert snap.source.reload_if_changed() is False
    fewer = [obj for obj in more if obj["metadata"]["name"] not in ("gpu-2", "train")]
    assert snap.rewrite(fewer) is True
    assert sorted(snap.view.nodes) == ["gpu-1", "gpu-3"]  # what left the file left the view
    assert snap.free("gpu-1") == (4, 4 * H100)
    assert "ml/train" not in snap.view.pods


def test_a_bad_reload_keeps_the_old_view(tmp_path: Path) -> None:
    snap = Snapshot(tmp_path / "cluster.json", _objects())
    generation = snap.view.generation
    assert snap.rewrite(text=b'{"kind": "List", "items": [') is False
    assert snap.source.last_error is not None and str(snap.path) in snap.source.last_error
    assert "not valid JSON" in snap.source.last_error
    assert sorted(snap.view.nodes) == ["gpu-1", "gpu-2"] and snap.free("gpu-1") == (6, 6 * H100)
    assert snap.view.generation == generation
    assert snap.source.reload_if_changed() is False  # the same bad file is not retried on every poll
    assert snap.rewrite([*_objects(), make_node("gpu-3", "h100")]) is True  # fixed: read again
    assert snap.source.last_error is None and "gpu-3" in snap.view.nodes


def test_a_file_deleted_keeps_the_old_view(tmp_path: Path) -> None:
    snap = Snapshot(tmp_path / "cluster.json", _objects())
    snap.path.unlink()
    assert snap.source.reload_if_changed() is False
    assert "no such file" in (snap.source.last_error or "")
    assert sorted(snap.view.nodes) == ["gpu-1", "gpu-2"]


def test_bindings_survive_a_reload(tmp_path: Path) -> None:
    objects = _objects()
    snap = Snapshot(tmp_path / "cluster.json", objects)
    binder = SnapshotBinder(snap.view, snap.source)
    asyncio.run(binder.bind("ml", "queued", "uid-ml-queued", "gpu-1"))
    assert snap.view.pods["ml/queued"].node == "gpu-1" and snap.free("gpu-1") == (5, 5 * H100)
    assert snap.rewrite([*objects, make_node("gpu-3", "h100")]) is True  # the file still shows it pending
    assert snap.view.pods["ml/queued"].node == "gpu-1"
    assert snap.free("gpu-1") == (5, 5 * H100)
    # a pod the snapshot did not hold yet is recorded too, and bound once a reload brings it
    asyncio.run(binder.bind("ml", "later", "", "gpu-2"))
    assert "ml/later" not in snap.view.pods
    assert snap.rewrite([*objects, make_pod("ml", "later", gpus={GPU: 1})]) is True
    assert snap.view.pods["ml/later"].node == "gpu-2"
    assert snap.free("gpu-2") == (7, 15360 - 4096)  # the namespace's 4Gi default on a time-sliced T4


def test_poll_thread_reloads_and_stops(tmp_path: Path) -> None:
    snap = Snapshot(tmp_path / "cluster.json", _objects())
    snap.source.start(interval=0.01)
    try:
        _write(snap.path, orjson.dumps(kubectl_list([*_objects(), make_node("gpu-3", "h100")])))
        wait_for(lambda: "gpu-3" in snap.view.nodes, 15, "the new node reloaded from the snapshot")
    finally:
        snap.source.stop()
    assert "snapshot-reload" not in [thread.name for thread in threading.enumerate()]
