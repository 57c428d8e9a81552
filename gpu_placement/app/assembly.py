"""The composition root: how the process is put together, read top to bottom once.

`serve` (`gpu-placement serve`) is the whole process: the configuration, the cluster view and its
source, the extender and webhook apps on their uvicorn servers, and the loops a webhook replica runs
under their Leases (quota mirror, DRA taints, Events, launch outcomes, certificates, webhook
registration). Below it, `Core`: the view, its source and the deciders, built from a live API server
(`core_from_cluster`), a snapshot (`core_from_snapshot`) or a list of objects (`core_from_objects`: the
demo, explain, tests).
`serve` reads its options (gpu_placement/app/serve_options.py, built once from the command line); nothing
below gpu_placement/app/ reads them: what a layer needs is handed to it here.

This module, the CLI and the commands are the only ones that import both `extender` and `webhook`.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import platform
import socket
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette

from extender.app import DEFAULT_MAX_BODY
from extender.app import create_app as create_extender_app
from extender.binding import Binder, SnapshotBinder
from gpu_placement.app.serve_options import ServeOptions
from gpu_placement.base.config import Config, load_config
from gpu_placement.base.errors import UsageError
from gpu_placement.controllers import events as _events  # noqa: F401 - registers gpu_placement_events_total on /metrics
from gpu_placement.decide.fences import track_fences
from gpu_placement.decide.placement import Placement
from gpu_placement.decide.rollout import track_rollout
from gpu_placement.facts.dra import DRA_KINDS
from gpu_placement.kube.api import WatchSettings
from gpu_placement.kube.discovery import DraApi
from gpu_placement.observe import metrics
from gpu_placement.observe.logs import setup_logging
from gpu_placement.outcomes.idle import track_idle
from gpu_placement.outcomes.record import Outcomes, track_outcomes
from gpu_placement.report.cluster_metrics import track_cluster
from gpu_placement.view.cluster import ClusterView, track_view
from gpu_placement.view.ingest import FILE_KINDS, KINDS, Ingest
from gpu_placement.view.snapshot import SnapshotSource
from gpu_placement.web.http import ops_routes
from gpu_placement.web.serving import run_servers

__all__ = ["MMAP_THRESHOLD", "SWITCH_INTERVAL_S", "TRIM_THRESHOLD", "Core", "core_from_cluster",
           "core_from_objects", "core_from_snapshot", "discover_dra", "fix_malloc_thresholds", "freeze_heap",
           "health_app", "serve"]

log = logging.getLogger("gpu_placement.serve")
# How long a thread may hold the GIL while another waits for it (Python's default: 5 ms). The watch
# threads do pure-Python work (a relist builds records for what changed); each time the request path
# wants the GIL back it waits up to this long, several times a request. Measured with
# benchmarks/relist_bench.py: 1 ms roughly halves /mutate's latency during a relist, at no cost seen
# when nothing else runs.
SWITCH_INTERVAL_S = 0.001
# glibc malloc's thresholds, fixed (mallopt) instead of left to glibc. A block of at least MMAP_THRESHOLD
# bytes is mapped on its own and unmapped when freed; the heap gives back its top beyond TRIM_THRESHOLD.
# Left to itself glibc raises the first to the size of each mapped block freed (up to 32 MiB) and the
# second to twice that, so after one request body of some MiB every large body, answer and parsed string
# came from the heap, and the heap kept its free space resident: under hostile input
# (benchmarks/fuzz_rss.py, issue 36) it held 35 MiB free, RSS crept up by about 1 MiB per 10,000
# requests with no live memory behind it, and malloc_trim(0) gave 33 MiB back. Fixed: the heap 25 MiB
# with 8 MiB free, RSS flat. 2 MiB keeps the hot path's large blocks in the heap (an extender answer is
# 447 KiB at 5,000 nodes, 1.3 MiB at 15,000): at glibc's own 128 KiB each answer was mapped afresh and
# /filter's p50 rose by half (benchmarks/extender_bench.py); at 2 MiB it is as before.
MMAP_THRESHOLD = 2 * 2**20
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD  # what glibc's own rule would set for that threshold
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc malloc.h


# -- the process: gpu-placement serve ---------------------------------------------------------------------------------

def serve(options: ServeOptions) -> int:
    from gpu_placement.web.tls import ReloadingTLS, make_server

    setup_logging(options.log_level)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    fix_malloc_thresholds()
    config = load_config(options.config)
    if bool(options.extender_tls_cert) != bool(options.extender_tls_key):
        raise UsageError("--extender-tls-cert and --extender-tls-key go together")
    if options.manage_certs:  # refuse bad lifetimes before connecting anywhere
        from webhook.rotation import RotationSettings

        try:
            RotationSettings.from_args(options)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    webhooks = _webhook_spec(options)
    core = (core_from_snapshot(config, options.snapshot, watch=True, needs_nodes=True) if options.snapshot
            else core_from_cluster(config, options.kubeconfig, _kinds(options, config)))
    servers = []
    try:
        if "extender" in options.components and options.managed_resources:
            from extender.managed import UnmanagedResources

            UnmanagedResources(core.view, options.managed_resources)
        if "extender" in options.components:
            tls = (ReloadingTLS(options.extender_tls_cert, options.extender_tls_key)
                   if options.extender_tls_cert and options.extender_tls_key else None)  # both or neither (above)
            host, port = options.extender_listen
            servers.append(make_server(core.extender_app(options.extender_max_body_bytes), host, port, tls=tls))
            _track_expiry("extender", tls)
            log.info("extender listening on %s://%s:%d", "https" if tls else "http", host, port)
        if "webhook" in options.components:
            tls = _webhook_tls(options, core)
            host, port = options.webhook_listen
            server = make_server(core.webhook_app(_start_events(options, core)), host, port, tls=tls)
            servers.append(server)
            _track_expiry("webhook", tls)
            _start_quota_mirror(options, core)
            if webhooks is not None:
                _start_registration(options, core, webhooks, server, Path(tls.cert_file).parent / "ca.crt")
            _start_dra_taints(options, core)
            _start_outcome_counter(options, core)
            _start_settled_drivers(options, core)
            _start_launch_fences(options, core)
            _start_refused_nodes(options, core)
            log.info("webhook listening on https://%s:%d", host, port)
        if options.health_listen:
            host, port = options.health_listen
            servers.append(make_server(health_app(core.readiness), host, port))
            log.info("health probes on http://%s:%d (/healthz, /readyz)", host, port)
        run_servers(servers)
    finally:
        core.stop()
    return 0


def fix_malloc_thresholds() -> bool:
    """Fix glibc malloc's mmap and trim thresholds (above), unless MALLOC_MMAP_THRESHOLD_ or
    MALLOC_TRIM_THRESHOLD_ is set (glibc took those). False where the C library is not glibc."""
    if platform.libc_ver()[0] != "glibc" or {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_"} & os.environ.keys():
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):  # no mallopt in the process's C library
        return False
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def health_app(ready: Callable[[], tuple[bool, str]]) -> Starlette:
    """`/healthz` and `/readyz` only: what kubelet's HTTP probes need, and nothing that changes anything."""
    return Starlette(routes=[route for route in ops_routes(ready) if route.path in ("/healthz", "/readyz")])


def _kinds(options: ServeOptions, config: Any) -> tuple[str, ...]:
    """What the live view watches: the core kinds, PodDisruptionBudgets for the extender's /preempt,
    and the mirrored ResourceQuotas where the webhook's quota mirror runs."""
    from gpu_placement.view.ingest import KINDS

    extra: tuple[str, ...] = ("poddisruptionbudgets",) if "extender" in options.components else ()
    if "webhook" in options.components and options.quota_mirror and config.mode != "audit":
        extra += ("resourcequotas",)
    return (*KINDS, *extra)


def _webhook_spec(options: ServeOptions) -> Any:
    if not options.webhooks_file:
        return None
    if "webhook" not in options.components or options.snapshot:
        raise UsageError("--webhooks-file registers the webhook with an API server: it needs --components webhook "
                         "and no --snapshot")
    from webhook.registration import load_webhook_spec

    try:
        return load_webhook_spec(options.webhooks_file)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _webhook_tls(options: ServeOptions, core: Core) -> Any:
    from gpu_placement.web.tls import ReloadingTLS

    namespace = options.home
    chosen = [bool(options.tls_cert or options.tls_key), bool(options.self_signed), bool(options.manage_certs)]
    if sum(chosen) != 1:
        raise UsageError("the webhook always serves TLS: give exactly one of --tls-cert/--tls-key, "
                         "--self-signed DIR or --manage-certs")
    if options.tls_cert or options.tls_key:
        if not (options.tls_cert and options.tls_key):
            raise UsageError("--tls-cert and --tls-key go together")
        return ReloadingTLS(options.tls_cert, options.tls_key)
    if options.self_signed:
        from gpu_placement.web.certs import ensure_self_signed

        host = options.webhook_listen[0]
        extra = tuple(h for h in (host,) if h not in ("0.0.0.0", "::", ""))
        bundle = ensure_self_signed(options.self_signed, options.service, namespace, extra)
        log.info("self-signed webhook certificate in %s (trust %s)", options.self_signed, bundle.ca_cert)
        return ReloadingTLS(str(bundle.cert), str(bundle.key))
    from webhook.rotation import CertificateManager, RotationSettings

    if core.api is None:
        raise UsageError("--manage-certs needs the API server (not --snapshot)")
    manager = CertificateManager(core.api, namespace, options.cert_secret, options.service,
                                 options.webhook_configuration, options.cert_dir, RotationSettings.from_args(options))
    paths = manager.start()
    core.stoppers.append(manager.stop)
    return ReloadingTLS(str(paths.cert), str(paths.key))


def _track_expiry(listener: str, tls: Any) -> None:
    if tls is not None:
        tls.start()
        metrics.CERT_EXPIRY.labels(listener).set_function(lambda: tls.not_after.timestamp())


# -- the core: the view, its source and the deciders ------------------------------------------------------------------

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
    outcomes: Outcomes | None = None  # launch outcomes and node lifecycle times of this view

    def extender_app(self, max_body: int = DEFAULT_MAX_BODY) -> Starlette:
        return create_extender_app(self.view, self.placement, self.binder, self.readiness, max_body)

    def webhook_app(self, on_warned: Callable[[str, str, str, list[str], str], None] | None = None) -> Starlette:
        from webhook.app import create_app as create_webhook_app

        # The mirrored ResourceQuotas in the view: /validate admits a quota namespace's GPU pods only once
        # the API server enforces its quota (webhook/quota_gate.py).
        return create_webhook_app(self.view, self.config, self.readiness, self.api,
                                  quota_gate="resourcequotas" in self.kinds, dra_version=self.dra.version,
                                  on_warned=on_warned)

    def stop(self) -> None:
        for stop in reversed(self.stoppers):
            stop()


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
    readiness = source.readiness
    if "resourcequotas" in kinds:  # the quota gate trusts a figure it has seen for a while (webhook/quota_gate.py)
        from webhook.quota_gate import settled_readiness

        readiness = settled_readiness(readiness, view)
    core = Core(config, view, ingest, _placement(view, config), ApiBinder(api), readiness, api=api,
                kinds=(*kinds, *dra.paths()), dra=dra, outcomes=outcomes)
    source.start()
    core.stoppers.append(source.stop)
    return _with_telemetry(core)


def core_from_snapshot(config: Config, path: str | Path, watch: bool = False, needs_nodes: bool = False) -> Core:
    """Raises SnapshotError when the files cannot be read (or, `needs_nodes`, hold no Node: not a snapshot);
    with `watch`, reloads them when they change."""
    view = ClusterView(config)
    ingest = Ingest(config)
    source = SnapshotSource(path, view, ingest, needs_nodes=needs_nodes)
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


def discover_dra(api: Any, tries: int = 5, settings: WatchSettings | None = None) -> DraApi:
    """resource.k8s.io as the API server serves it, asked a few times, waiting between tries as the
    watches do (`settings.backoff`: growing, jittered): the view cannot start without the API server
    anyway. Not served (or never answered): DRA stays off, and the log says so."""
    import random

    import urllib3

    from gpu_placement.kube.api import ApiError
    from gpu_placement.kube.discovery import discover

    settings = settings or WatchSettings()
    for attempt in range(1, tries + 1):
        try:
            found = discover(api)
            break
        except (ApiError, OSError, urllib3.exceptions.HTTPError) as exc:
            log.warning("discovery of resource.k8s.io failed (%s); attempt %d of %d", exc, attempt, tries)
            if attempt < tries:
                time.sleep(settings.backoff(attempt, random.random()))
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


def _core(config: Config, binder_for: Callable[[ClusterView], Binder]) -> Core:
    view = ClusterView(config)
    outcomes = _track(view, config)
    return Core(config, view, Ingest(config), _placement(view, config), binder_for(view), lambda: _view_ready(view),
                outcomes=outcomes)


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
    track_fences(placement.fences)
    return placement


def _with_telemetry(core: Core) -> Core:
    if core.config.telemetry.url:
        from gpu_placement.view.telemetry import TelemetrySource

        source = TelemetrySource(core.view, core.config.telemetry)
        source.start()
        core.stoppers.append(source.stop)
    return core


def _view_ready(view: ClusterView) -> tuple[bool, str]:
    missing = [kind for kind in KINDS if kind not in view.listed]
    return (not missing, f"waiting for the first full list of {', '.join(missing)}" if missing else "")


def freeze_heap() -> None:
    """Move what the first full list built out of the garbage collector's sight: a full collection
    over hundreds of thousands of long-lived records costs hundreds of milliseconds, and one would
    otherwise land in the middle of a scheduling request."""
    gc.collect()
    gc.freeze()


# -- what a webhook replica runs beside its server, each under its own Lease ------------------------------------------

def _start_quota_mirror(options: ServeOptions, core: Core) -> None:
    """The ResourceQuota mirror: its own Lease, whatever the certificate mode. In audit mode it only
    deletes the ResourceQuotas it kept (audit enforces nothing)."""
    if not options.quota_mirror:
        return
    if core.api is None:
        log.info("no API server (--snapshot): namespace quotas are not mirrored into ResourceQuotas")
        return
    from gpu_placement.controllers.quota_mirror import MirrorSettings, QuotaMirror

    if core.config.mode == "audit":
        log.info("audit mode: the ResourceQuotas mirrored in enforce mode are deleted, none is written")
    mirror = QuotaMirror(core.api, core.view, core.config, options.home, _identity(),
                         MirrorSettings(lease_name=options.quota_lease, owner=options.owner))
    version = core.dra.version  # served whenever claims_from_templates
    if core.dra.claims_from_templates and version is not None:  # elsewhere `dra` namespaces stay on the device
        from gpu_placement.controllers.templates import TemplateKeeper  # plugin (view.dra.templates_kept)

        mirror.templates = TemplateKeeper(core.api, core.view, core.config, version)
    mirror.start()
    core.stoppers.append(mirror.stop)


def _start_dra_taints(options: ServeOptions, core: Core) -> None:
    """DeviceTaintRules for unverified nodes' DRA devices: its own Lease, in the webhook replicas."""
    if core.api is None or not core.dra.served:
        return  # no API server, or no resource.k8s.io: nothing to taint (the log said which at start)
    if not core.config.dra.taints:
        log.info("dra.taints is false: no DeviceTaintRules are written; only the extender guards DRA pods")
        return
    from gpu_placement.controllers.dra_taints import TaintController, TaintSettings

    controller = TaintController(core.api, core.view, core.config, options.home, _identity(),
                                 TaintSettings(lease_name=options.dra_lease, owner=options.owner),
                                 fences=core.placement.fences)
    controller.start()
    core.stoppers.append(controller.stop)


def _start_outcome_counter(options: ServeOptions, core: Core) -> None:
    """Launch outcomes and node lifecycle times, counted by the holder of its Lease (webhook replicas)."""
    if core.api is None or core.outcomes is None:
        log.info("no API server (--snapshot): launch outcomes are not counted (the Lease keeps what is counted)")
        return
    from gpu_placement.outcomes.counter import CounterSettings, OutcomeCounter

    counter = OutcomeCounter(core.api, core.outcomes, options.home, _identity(),
                             CounterSettings(lease_name=options.outcomes_lease))
    counter.start()
    core.stoppers.append(counter.stop)


def _start_settled_drivers(options: ServeOptions, core: Core) -> None:
    """Each node's settled driver on its Node (gpu-placement.io/settled-driver), written by the holder of
    its Lease: a driver pod of that version is a reinstall and does not soak (docs/rollouts.md)."""
    if core.api is None:
        log.info("no API server (--snapshot): no settled drivers are recorded; every driver pod younger than "
                 "rollout.soakMinutes soaks unless its Node carries gpu-placement.io/settled-driver")
        return
    from gpu_placement.controllers.settled_drivers import SettledDrivers, SettledSettings

    recorder = SettledDrivers(core.api, core.placement.rollout, options.home, _identity(),
                              SettledSettings(lease_name=options.drivers_lease))
    recorder.start()
    core.stoppers.append(recorder.stop)


def _start_launch_fences(options: ServeOptions, core: Core) -> None:
    """Each node's launch fences on its Node (gpu-placement.io/launch-fence), written by the holder of its
    Lease: a fence outlives the failed pods that showed it (docs/rules.md, LaunchFailures)."""
    if core.api is None or not core.config.launch_fence.enabled:
        return  # --snapshot: a fence lives on its failed pods only
    from gpu_placement.controllers.launch_fences import FenceSettings, LaunchFenceWriter

    writer = LaunchFenceWriter(core.api, core.placement.fences, options.home, _identity(),
                               FenceSettings(lease_name=options.fences_lease))
    writer.start()
    core.stoppers.append(writer.stop)


def _start_refused_nodes(options: ServeOptions, core: Core) -> None:
    """gpu-placement.io/refused on the nodes every GPU pod is refused on, written by the holder of its Lease
    (config refusedNodeLabel: the webhook keeps the GPU pods it routes off them; docs/performance.md)."""
    if not core.config.refused_node_label:
        return
    if core.api is None:
        log.info("no API server (--snapshot): no node is labelled gpu-placement.io/refused")
        return
    from gpu_placement.controllers.refused_nodes import RefusedNodes, RefusedSettings

    writer = RefusedNodes(core.api, core.view, core.config, options.home, _identity(),
                          RefusedSettings(lease_name=options.refused_lease))
    writer.start()
    core.stoppers.append(writer.stop)


def _start_events(options: ServeOptions, core: Core) -> Any:
    """Kubernetes Events (gpu_placement/controllers/events.py) from the webhook replicas: Node and Namespace ones by the
    holder of --events-lease, a pod's admission warnings by the replica that admitted it. Returns the
    webhook's hook for those warnings (None: no API server, or --no-events)."""
    if core.api is None or not options.events:
        return None
    from gpu_placement.controllers.events import EventWriter, PodWarnings, watch_fences, watch_namespaces, watch_nodes
    from gpu_placement.kube.lease import Lease
    from gpu_placement.report.namespaces import policy_problems

    identity = _identity()
    lease = Lease(core.api, options.home, options.events_lease, identity, 30)
    writer = EventWriter(core.api, identity, lease)
    writer.start()
    core.stoppers.append(writer.stop)
    watch_nodes(core.view, core.config, writer)
    watch_fences(core.placement.fences, writer)
    watch_namespaces(core.view, writer, lambda record: policy_problems(record, core.config))
    return PodWarnings(core.view, writer).admitted


def _start_registration(options: ServeOptions, core: Core, spec: Any, server: Any, ca_file: Path) -> None:
    """Write the webhooks into their (empty) configurations once this replica answers."""
    from webhook.registration import WebhookRegistration

    registration = WebhookRegistration(core.api, options.webhook_configuration, options.home, options.service, spec,
                                       lambda: bool(server.started) and core.readiness()[0], ca_file, _identity())
    registration.start()
    core.stoppers.append(registration.stop)


def _identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"
