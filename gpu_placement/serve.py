"""`gpu-placement serve`: the view, its source, and one uvicorn server per component in one loop."""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import platform
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from starlette.applications import Starlette

from gpu_placement import metrics
from gpu_placement.config import load_config
from gpu_placement.http import ops_routes
from gpu_placement.logs import setup_logging
from gpu_placement.service import Core, core_from_cluster, core_from_snapshot
from gpu_placement.serving import run_servers

__all__ = ["MMAP_THRESHOLD", "SWITCH_INTERVAL_S", "TRIM_THRESHOLD", "fix_malloc_thresholds", "health_app", "serve"]

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


class UsageError(Exception):
    pass


def _webhook_tls(args: argparse.Namespace, core: Core) -> Any:
    from webhook.tls import ReloadingTLS

    namespace = _namespace(args)
    chosen = [bool(args.tls_cert or args.tls_key), bool(args.self_signed), bool(args.manage_certs)]
    if sum(chosen) != 1:
        raise UsageError("the webhook always serves TLS: give exactly one of --tls-cert/--tls-key, "
                         "--self-signed DIR or --manage-certs")
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise UsageError("--tls-cert and --tls-key go together")
        return ReloadingTLS(args.tls_cert, args.tls_key)
    if args.self_signed:
        from webhook.certs import ensure_self_signed

        host = args.webhook_listen[0]
        extra = tuple(h for h in (host,) if h not in ("0.0.0.0", "::", ""))
        bundle = ensure_self_signed(args.self_signed, args.service, namespace, extra)
        log.info("self-signed webhook certificate in %s (trust %s)", args.self_signed, bundle.ca_cert)
        return ReloadingTLS(str(bundle.cert), str(bundle.key))
    from webhook.rotation import start_managed_certificates

    paths = start_managed_certificates(core, args, namespace)
    return ReloadingTLS(str(paths.cert), str(paths.key))


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


def serve(args: argparse.Namespace) -> int:
    from webhook.tls import ReloadingTLS, make_server

    setup_logging(args.log_level)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    fix_malloc_thresholds()
    config = load_config(args.config)
    if bool(args.extender_tls_cert) != bool(args.extender_tls_key):
        raise UsageError("--extender-tls-cert and --extender-tls-key go together")
    if getattr(args, "manage_certs", False):  # refuse bad lifetimes before connecting anywhere
        from webhook.rotation import RotationSettings

        try:
            RotationSettings.from_args(args)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    webhooks = _webhook_spec(args)
    core = (core_from_snapshot(config, args.snapshot, watch=True) if args.snapshot
            else core_from_cluster(config, args.kubeconfig, _kinds(args, config)))
    servers = []
    try:
        if "extender" in args.components and args.managed_resources:
            from extender.managed import UnmanagedResources

            UnmanagedResources(core.view, args.managed_resources)
        if "extender" in args.components:
            tls = (ReloadingTLS(args.extender_tls_cert, args.extender_tls_key) if args.extender_tls_cert else None)
            host, port = args.extender_listen
            servers.append(make_server(core.extender_app(args.extender_max_body_bytes), host, port, tls=tls))
            _track_expiry("extender", tls)
            log.info("extender listening on %s://%s:%d", "https" if tls else "http", host, port)
        if "webhook" in args.components:
            tls = _webhook_tls(args, core)
            host, port = args.webhook_listen
            server = make_server(core.webhook_app(), host, port, tls=tls)
            servers.append(server)
            _track_expiry("webhook", tls)
            _start_quota_mirror(args, core)
            if webhooks is not None:
                _start_registration(args, core, webhooks, server, Path(tls.cert_file).parent / "ca.crt")
            _start_dra_taints(args, core)
            log.info("webhook listening on https://%s:%d", host, port)
        if getattr(args, "health_listen", None):
            host, port = args.health_listen
            servers.append(make_server(health_app(core.readiness), host, port))
            log.info("health probes on http://%s:%d (/healthz, /readyz)", host, port)
        run_servers(servers)
    finally:
        core.stop()
    return 0


def health_app(ready: Callable[[], tuple[bool, str]]) -> Starlette:
    """`/healthz` and `/readyz` only: what kubelet's HTTP probes need, and nothing that changes anything."""
    return Starlette(routes=[route for route in ops_routes(ready) if route.path in ("/healthz", "/readyz")])


def _webhook_spec(args: argparse.Namespace) -> Any:
    if not getattr(args, "webhooks_file", None):
        return None
    if "webhook" not in args.components or args.snapshot:
        raise UsageError("--webhooks-file registers the webhook with an API server: it needs --components webhook "
                         "and no --snapshot")
    from webhook.registration import load_webhook_spec

    try:
        return load_webhook_spec(args.webhooks_file)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def _start_registration(args: argparse.Namespace, core: Core, spec: Any, server: Any, ca_file: Path) -> None:
    """Write the webhooks into their (empty) configurations once this replica answers."""
    from webhook.registration import WebhookRegistration

    registration = WebhookRegistration(core.api, args.webhook_configuration, _namespace(args), args.service, spec,
                                       lambda: bool(server.started) and core.readiness()[0], ca_file, _identity())
    registration.start()
    core.stoppers.append(registration.stop)


def _namespace(args: argparse.Namespace) -> str:
    return str(args.namespace or os.environ.get("POD_NAMESPACE") or "gpu-placement")


def _identity() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _kinds(args: argparse.Namespace, config: Any) -> tuple[str, ...]:
    """What the live view watches: the core kinds, PodDisruptionBudgets for the extender's /preempt,
    and the mirrored ResourceQuotas where the webhook's quota mirror runs."""
    from gpu_placement.ingest import KINDS

    extra = ("poddisruptionbudgets",) if "extender" in args.components else ()
    if "webhook" in args.components and getattr(args, "quota_mirror", True) and config.mode != "audit":
        extra += ("resourcequotas",)
    return (*KINDS, *extra)


def _start_quota_mirror(args: argparse.Namespace, core: Core) -> None:
    """The ResourceQuota mirror: its own Lease, whatever the certificate mode. In audit mode it only
    deletes the ResourceQuotas it kept (audit enforces nothing)."""
    if not getattr(args, "quota_mirror", True):
        return
    if core.api is None:
        log.info("no API server (--snapshot): namespace quotas are not mirrored into ResourceQuotas")
        return
    from webhook.quota_mirror import MirrorSettings, QuotaMirror

    if core.config.mode == "audit":
        log.info("audit mode: the ResourceQuotas mirrored in enforce mode are deleted, none is written")
    mirror = QuotaMirror(core.api, core.view, core.config, _namespace(args), _identity(),
                         MirrorSettings(lease_name=args.quota_lease, owner=getattr(args, "owner", None)))
    if core.dra.claims_from_templates:  # elsewhere `dra` namespaces stay on the device plugin (view.dra.templates_kept)
        from webhook.dra_templates import TemplateKeeper

        mirror.templates = TemplateKeeper(core.api, core.view, core.config, core.dra.version)
    mirror.start()
    core.stoppers.append(mirror.stop)


def _start_dra_taints(args: argparse.Namespace, core: Core) -> None:
    """DeviceTaintRules for unverified nodes' DRA devices: its own Lease, in the webhook replicas."""
    if core.api is None or not core.dra.served:
        return  # no API server, or no resource.k8s.io: nothing to taint (the log said which at start)
    if not core.config.dra.taints:
        log.info("dra.taints is false: no DeviceTaintRules are written; only the extender guards DRA pods")
        return
    from gpu_placement.dra.taints import TaintController, TaintSettings

    namespace = args.namespace or os.environ.get("POD_NAMESPACE") or "gpu-placement"
    controller = TaintController(core.api, core.view, core.config, namespace, f"{socket.gethostname()}-{os.getpid()}",
                                 TaintSettings(lease_name=getattr(args, "dra_lease", "gpu-placement-dra"),
                                               owner=getattr(args, "owner", None)))
    controller.start()
    core.stoppers.append(controller.stop)


def _track_expiry(listener: str, tls: Any) -> None:
    if tls is not None:
        tls.start()
        metrics.CERT_EXPIRY.labels(listener).set_function(lambda: tls.not_after.timestamp())
