"""`gpu-placement serve`: the view, its source, and one uvicorn server per component in one loop."""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
from typing import Any

from gpu_placement import metrics
from gpu_placement.config import load_config
from gpu_placement.logs import setup_logging
from gpu_placement.service import Core, core_from_cluster, core_from_snapshot
from gpu_placement.serving import run_servers

__all__ = ["SWITCH_INTERVAL_S", "serve"]

log = logging.getLogger("gpu_placement.serve")
# How long a thread may hold the GIL while another waits for it (Python's default: 5 ms). The watch
# threads do pure-Python work (a relist builds records for what changed); each time the request path
# wants the GIL back it waits up to this long, several times a request. Measured with
# benchmarks/relist_bench.py: 1 ms roughly halves /mutate's latency during a relist, at no cost seen
# when nothing else runs.
SWITCH_INTERVAL_S = 0.001


class UsageError(Exception):
    pass


def _webhook_tls(args: argparse.Namespace, core: Core) -> Any:
    from webhook.tls import ReloadingTLS

    namespace = args.namespace or os.environ.get("POD_NAMESPACE") or "gpu-placement"
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


def serve(args: argparse.Namespace) -> int:
    from webhook.tls import ReloadingTLS, make_server

    setup_logging(args.log_level)
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    config = load_config(args.config)
    if bool(args.extender_tls_cert) != bool(args.extender_tls_key):
        raise UsageError("--extender-tls-cert and --extender-tls-key go together")
    if getattr(args, "manage_certs", False):  # refuse bad lifetimes before connecting anywhere
        from webhook.rotation import RotationSettings

        try:
            RotationSettings.from_args(args)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
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
            servers.append(make_server(core.webhook_app(), host, port, tls=tls))
            _track_expiry("webhook", tls)
            _start_quota_mirror(args, core)
            _start_dra_taints(args, core)
            log.info("webhook listening on https://%s:%d", host, port)
        run_servers(servers)
    finally:
        core.stop()
    return 0


def _kinds(args: argparse.Namespace, config: Any) -> tuple[str, ...]:
    """What the live view watches: the core kinds, PodDisruptionBudgets for the extender's /preempt,
    and the mirrored ResourceQuotas where the webhook's quota mirror runs."""
    from gpu_placement.ingest import KINDS

    extra = ("poddisruptionbudgets",) if "extender" in args.components else ()
    if "webhook" in args.components and getattr(args, "quota_mirror", True) and config.mode != "audit":
        extra += ("resourcequotas",)
    return (*KINDS, *extra)


def _start_quota_mirror(args: argparse.Namespace, core: Core) -> None:
    """The ResourceQuota mirror: its own Lease, whatever the certificate mode."""
    if not getattr(args, "quota_mirror", True):
        return
    if core.config.mode == "audit":
        log.info("audit mode: namespace quotas are not mirrored into ResourceQuotas")
        return
    if core.api is None:
        log.info("no API server (--snapshot): namespace quotas are not mirrored into ResourceQuotas")
        return
    from webhook.quota_mirror import MirrorSettings, QuotaMirror

    namespace = args.namespace or os.environ.get("POD_NAMESPACE") or "gpu-placement"
    mirror = QuotaMirror(core.api, core.view, core.config, namespace, f"{socket.gethostname()}-{os.getpid()}",
                         MirrorSettings(lease_name=args.quota_lease))
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
                                 TaintSettings(lease_name=getattr(args, "dra_lease", "gpu-placement-dra")))
    controller.start()
    core.stoppers.append(controller.stop)


def _track_expiry(listener: str, tls: Any) -> None:
    if tls is not None:
        tls.start()
        metrics.CERT_EXPIRY.labels(listener).set_function(lambda: tls.not_after.timestamp())
