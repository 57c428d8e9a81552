"""Process assembly: the cluster view, its source, and the HTTP apps built on them.

This module and the CLI are the only ones that import both `extender` and `webhook`.
"""

from __future__ import annotations

import gc
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette

from extender.app import DEFAULT_MAX_BODY
from extender.app import create_app as create_extender_app
from extender.binding import Binder, SnapshotBinder
from gpu_placement.base.config import Config
from gpu_placement.decide.placement import Placement
from gpu_placement.decide.rollout import track_rollout
from gpu_placement.facts.dra import DRA_KINDS
from gpu_placement.kube.discovery import DraApi
from gpu_placement.observe import metrics
from gpu_placement.outcomes.idle import track_idle
from gpu_placement.outcomes.record import Outcomes, track_outcomes
from gpu_placement.report.cluster_metrics import track_cluster
from gpu_placement.view.cluster import ClusterView, track_view
from gpu_placement.view.ingest import FILE_KINDS, KINDS, Ingest
from gpu_placement.view.snapshot import SnapshotSource

__all__ = ["Core", "core_from_cluster", "core_from_objects", "core_from_snapshot", "discover_dra", "freeze_heap"]

log = logging.getLogger("gpu_placement.app.assembly")


@dataclass(slots=True)
class Core:
    config: Config
    view: ClusterView
    ingest: Ingest
    placement: Placement
    binder: Binder
    readiness: Callable[[], tuple[bool, str]]
    stoppers: list[Callable[[], None]] = field(default_factory=list)
    api: Any = None  # the kubernetes ApiClient when the view comes from an API server
    dra: DraApi = field(default_factory=DraApi)  # what of resource.k8s.io the API server serves
    kinds: tuple[str, ...] = KINDS  # what the source lists and watches (ingest.OBJECT_KINDS where needed)
    config_source: str = "built-in defaults"  # where `config` came from, for commands that say so
    outcomes: Any = None  # gpu_placement.outcomes.record.Outcomes: launch outcomes and node times of this view

    def extender_app(self, max_body: int = DEFAULT_MAX_BODY) -> Starlette:
        return create_extender_app(self.view, self.placement, self.binder, self.readiness, max_body)

    def webhook_app(self, on_warned: Callable[[str, str, list[str]], None] | None = None) -> Starlette:
        from webhook.app import create_app as create_webhook_app

        # The mirrored ResourceQuotas in the view: /validate admits a quota namespace's GPU pods only once
        # the API server enforces its quota (webhook/quota_gate.py).
        return create_webhook_app(self.view, self.config, self.readiness, self.api,
                                  quota_gate="resourcequotas" in self.kinds, dra_version=self.dra.version,
                                  on_warned=on_warned)

    def stop(self) -> None:
        for stop in reversed(self.stoppers):
            stop()


def freeze_heap() -> None:
    """Move what the first full list built out of the garbage collector's sight: a full collection
    over hundreds of thousands of long-lived records costs hundreds of milliseconds, and one would
    otherwise land in the middle of a scheduling request."""
    gc.collect()
    gc.freeze()


def _view_ready(view: ClusterView) -> tuple[bool, str]:
    missing = [kind for kind in KINDS if kind not in view.listed]
    return (not missing, f"waiting for the first full list of {', '.join(missing)}" if missing else "")


def _with_telemetry(core: Core) -> Core:
    if core.config.telemetry.url:
        from gpu_placement.view.telemetry import TelemetrySource

        source = TelemetrySource(core.view, core.config.telemetry)
        source.start()
        core.stoppers.append(source.stop)
    return core


def _track(view: ClusterView, config: Config) -> Outcomes:
    """The view's own metrics, and the cluster's as the view sees it (namespace quotas parsed as the
    webhook parses them); its launch outcomes and node lifecycle times (counted where a counter runs)."""
    from gpu_placement.facts.policy import parse_policy
    from gpu_placement.report.namespaces import policy_problems

    track_view(view)
    track_cluster(view, config, lambda record: parse_policy(record, record.name, config).quota,
                  lambda record: policy_problems(record, config))
    outcomes = track_outcomes(Outcomes(view, config, heard=metrics.last_heard).start())
    track_idle(outcomes)
    return outcomes


def _placement(view: ClusterView, config: Config) -> Placement:
    """Placement, with its driver rollout's figures on /metrics."""
    placement = Placement(view, config)
    track_rollout(placement.rollout)
    return placement


def _core(config: Config, binder_for: Callable[[ClusterView], Binder]) -> Core:
    view = ClusterView(config)
    outcomes = _track(view, config)
    return Core(config, view, Ingest(config), _placement(view, config), binder_for(view), lambda: _view_ready(view),
                outcomes=outcomes)


def core_from_objects(config: Config, objects: list[dict[str, Any]]) -> Core:
    """A view of these objects only (the demo, tests): bindings are recorded in the view."""
    core = _core(config, SnapshotBinder)
    by_kind: dict[str, list[dict[str, Any]]] = {kind: [] for kind in (*FILE_KINDS, *DRA_KINDS)}
    for obj in objects:
        kind = Ingest.kind_of(obj)
        if kind is not None:
            by_kind[kind].append(obj)
    with core.view.lock:
        for kind in (*FILE_KINDS, *(k for k in DRA_KINDS if by_kind[k])):
            core.ingest.replace(core.view, kind, by_kind[kind])
    metrics.heard_from_source()  # the objects are the source, listed in full
    metrics.SOURCE_UP.set(1)
    freeze_heap()
    return core


def core_from_snapshot(config: Config, path: str | Path, watch: bool = False) -> Core:
    """Raises SnapshotError when the files cannot be read; with `watch`, reloads them when they change."""
    view = ClusterView(config)
    ingest = Ingest(config)
    source = SnapshotSource(path, view, ingest)
    source.load()
    freeze_heap()
    outcomes = _track(view, config)
    core = Core(config, view, ingest, _placement(view, config), SnapshotBinder(view, source), lambda: _view_ready(view),
                outcomes=outcomes)
    if watch:
        source.start()
        core.stoppers.append(source.stop)
        _with_telemetry(core)
    return core


def discover_dra(api: Any, tries: int = 5, wait: float = 2.0) -> DraApi:
    """resource.k8s.io as the API server serves it, asked a few times: the view cannot start without
    the API server anyway. Not served (or never answered): DRA stays off, and the log says so."""
    import urllib3

    from gpu_placement.kube.api import ApiError
    from gpu_placement.kube.discovery import discover

    for attempt in range(tries):
        try:
            found = discover(api)
            break
        except (ApiError, OSError, urllib3.exceptions.HTTPError) as exc:
            log.warning("discovery of resource.k8s.io failed (%s); attempt %d of %d", exc, attempt + 1, tries)
            time.sleep(wait)
    else:
        log.error("resource.k8s.io could not be discovered: DRA objects are not read; restart to try again")
        return DraApi()
    if found.served and not found.claims_from_templates:
        log.warning("DRA: resource.k8s.io is served only at %s, whose claims gpu-placement does not write: "
                    "namespaces annotated gpu-placement.io/allocation=dra stay on the device plugin "
                    "(Kubernetes 1.33 or later serves v1beta2)", found.version)
    if found.served:
        log.info("DRA: resource.k8s.io/%s served: ResourceSlices, DeviceClasses, ResourceClaims and their templates "
                 "are read; DeviceTaintRules at %s", found.version, found.taint_version or "none")
    else:
        log.info("DRA: resource.k8s.io is not served; GPU pods are judged by the device plugin's resources only")
    return found


def core_from_cluster(config: Config, kubeconfig: str | None, kinds: tuple[str, ...] = KINDS) -> Core:
    """List+watch a live API server (kubeconfig file, else in-cluster config); bind through it. `kinds`:
    KINDS and the OBJECT_KINDS the process's components need."""
    from extender.binding import ApiBinder
    from gpu_placement.kube.api import load_api_client
    from gpu_placement.view.live import LiveSource

    api = load_api_client(kubeconfig)
    view = ClusterView(config)
    ingest = Ingest(config)
    dra = discover_dra(api)
    view.dra.templates_kept = dra.claims_from_templates
    source = LiveSource(view, ingest, api, kinds=(*kinds, *dra.paths()), paths=dra.paths(),
                        selectors={"resourceslices": f"spec.driver={config.dra.driver}"})
    outcomes = _track(view, config)
    core = Core(config, view, ingest, _placement(view, config), ApiBinder(api), source.readiness, api=api,
                kinds=(*kinds, *dra.paths()), dra=dra, outcomes=outcomes)
    source.start()
    core.stoppers.append(source.stop)
    return _with_telemetry(core)
