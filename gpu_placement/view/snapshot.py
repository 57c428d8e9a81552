"""A cluster view from files: what `kubectl get nodes,pods,namespaces -A -o json` (or `-o yaml`) prints.

A path is a file or a folder of `.json`/`.yaml`/`.yml` files. Bindings made by `/bind` in snapshot
mode are kept here and laid over every reload, so a reload does not forget them.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import yaml

from gpu_placement.facts.dra import DRA_KINDS
from gpu_placement.observe import metrics
from gpu_placement.view.cluster import ClusterView
from gpu_placement.view.ingest import FILE_KINDS, Ingest

__all__ = ["SnapshotError", "SnapshotSource", "load_snapshot", "read_objects"]

log = logging.getLogger("gpu_placement.snapshot")
_SUFFIXES = (".json", ".yaml", ".yml")
_LIST_ITEM_KIND = {"NodeList": "Node", "PodList": "Pod", "NamespaceList": "Namespace"}
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class SnapshotError(Exception):
    """A snapshot that cannot be read; the message names the file and the problem."""


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.suffix in _SUFFIXES and p.is_file())
        if not files:
            raise SnapshotError(f"{path}: folder has no .json, .yaml or .yml files")
        return files
    if not path.exists():
        raise SnapshotError(f"{path}: no such file or folder")
    return [path]


def read_objects(path: str | Path) -> list[dict[str, Any]]:
    objects: list[dict[str, Any]] = []
    for file in _files(Path(path)):
        try:
            text = file.read_bytes()
        except OSError as exc:
            raise SnapshotError(f"{file}: cannot read: {exc.strerror}") from exc
        for doc in _documents(file, text):
            objects.extend(_flatten(file, doc))
    return objects


def load_snapshot(path: str | Path, needs: str = "Node") -> list[dict[str, Any]]:
    """The objects of a snapshot, refused when it holds no `needs` object: a Job's YAML or a pod list
    given as `--snapshot` would otherwise be judged as a cluster without a node (`0/0 nodes are
    available`), and the answer would look like one about the cluster."""
    objects = read_objects(path)
    _require(objects, path, needs)
    return objects


def _require(objects: list[dict[str, Any]], path: str | Path, needs: str = "Node") -> None:
    """SnapshotError unless `objects` hold a `needs` (Node; Namespace for `namespaces`)."""
    if any(o.get("kind") == needs for o in objects):
        return
    kinds: dict[str, int] = {}
    for obj in objects:
        kinds[str(obj.get("kind"))] = kinds.get(str(obj.get("kind")), 0) + 1
    held = ", ".join(f"{n} {kind}" for kind, n in sorted(kinds.items())) or "no object"
    raise SnapshotError(f"no {needs.lower()}s in {path} (it holds {held}): is it a snapshot? Make one with "
                        "gpu-placement demo --write-snapshot FILE, or kubectl get nodes,pods,namespaces,configmaps -A "
                        "-o json > cluster.json")


def _documents(file: Path, text: bytes) -> list[Any]:
    if file.suffix == ".json" or text.lstrip()[:1] in (b"{", b"["):
        try:
            return [orjson.loads(text)]
        except orjson.JSONDecodeError as exc:
            raise SnapshotError(f"{file}: not valid JSON: {exc}") from exc
    try:
        return [doc for doc in yaml.load_all(text, Loader=_Loader) if doc is not None]
    except yaml.YAMLError as exc:
        raise SnapshotError(f"{file}: not valid YAML: {exc}") from exc


def _flatten(file: Path, doc: Any) -> Iterator[dict[str, Any]]:
    if isinstance(doc, list):
        for item in doc:
            yield from _flatten(file, item)
        return
    if not isinstance(doc, dict):
        raise SnapshotError(f"{file}: expected Kubernetes objects or a List, found {type(doc).__name__}")
    kind = str(doc.get("kind") or "")
    if kind == "List" or kind in _LIST_ITEM_KIND:
        items = doc.get("items")
        if not isinstance(items, list):
            raise SnapshotError(f"{file}: {kind or 'List'} has no items list")
        for item in items:
            if isinstance(item, dict) and "kind" not in item and kind in _LIST_ITEM_KIND:
                item = {**item, "kind": _LIST_ITEM_KIND[kind]}  # the API server's List items carry no kind
            yield from _flatten(file, item)
        return
    if not kind:
        raise SnapshotError(f"{file}: an object has no kind (name {doc.get('metadata', {}).get('name')!r})")
    yield doc


class SnapshotSource:
    def __init__(self, path: str | Path, view: ClusterView, ingest: Ingest, needs_nodes: bool = False) -> None:
        """`needs_nodes`: a file without a Node is refused (serve's: not a snapshot), a reload of one too."""
        self.path = Path(path)
        self.needs_nodes = needs_nodes
        self.view = view
        self.ingest = ingest
        self.bindings: dict[tuple[str, str], str] = {}  # (namespace, pod) -> node, from /bind
        self.last_error: str | None = None
        self._stamp: tuple[tuple[str, float, int], ...] = ()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def load(self) -> None:
        """Read the files and make the view match them; raises SnapshotError, keeping the old view."""
        stamp = self._fingerprint()
        by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in (*FILE_KINDS, *DRA_KINDS)}
        objects = read_objects(self.path)
        if self.needs_nodes:
            _require(objects, self.path)
        for obj in objects:
            kind = Ingest.kind_of(obj)
            if kind is not None:
                by_kind[kind].append(obj)
        for pod in by_kind["pods"]:
            meta, spec = pod.get("metadata") or {}, pod.setdefault("spec", {})
            node = self.bindings.get((meta.get("namespace") or "default", meta.get("name") or ""))
            if node and not spec.get("nodeName"):
                spec["nodeName"] = node
        with self.view.lock:
            for kind in FILE_KINDS:
                self.ingest.replace(self.view, kind, by_kind[kind])
            for kind in DRA_KINDS:  # read only from a snapshot that has some (or had, to empty them)
                if by_kind[kind] or kind in self.view.listed:
                    self.ingest.replace(self.view, kind, by_kind[kind])
        self._stamp = stamp
        self.last_error = None
        metrics.heard_from_source()
        metrics.SOURCE_UP.set(1)

    def record_binding(self, namespace: str, name: str, node: str) -> None:
        self.bindings[(namespace, name)] = node

    def _fingerprint(self) -> tuple[tuple[str, float, int], ...]:
        try:
            files = _files(self.path)
            return tuple((str(f), f.stat().st_mtime, f.stat().st_size) for f in files)
        except (SnapshotError, OSError):
            return ()

    def reload_if_changed(self) -> bool:
        if self._fingerprint() == self._stamp:
            metrics.heard_from_source()
            return False
        try:
            self.load()
        except SnapshotError as exc:
            if str(exc) != self.last_error:
                log.error("snapshot reload failed, keeping the last view: %s", exc)
            self.last_error = str(exc)
            metrics.SNAPSHOT_RELOADS.labels("error").inc()
            metrics.SOURCE_UP.set(0)
            self._stamp = self._fingerprint()  # report once per bad version, not every poll
            return False
        log.info("snapshot reloaded from %s", self.path)
        metrics.SNAPSHOT_RELOADS.labels("ok").inc()
        return True

    def start(self, interval: float = 1.0) -> None:
        def poll() -> None:
            while not self._stop.wait(interval):
                self.reload_if_changed()

        self._thread = threading.Thread(target=poll, name="snapshot-reload", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
