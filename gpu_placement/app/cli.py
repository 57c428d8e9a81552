"""The `gpu-placement` command: serve, demo, explain, nodes, namespaces, rollout, survey, migrate, report, replay,
certs.

Exit status 0 on success, 2 on bad usage or bad input with a one-line message naming the problem (never a
traceback: an unexpected error is one line too, status 70, and GPU_PLACEMENT_DEBUG=1 shows its traceback);
`explain` also 3, 4 and 5 (gpu_placement/app/cli_explain.py); `survey` 1 on findings and `namespaces` 1 on
problems; `report` 3 for a window without data. Output cut short by a closed pipe (`| head`) ends
quietly with status 141, as a process killed by SIGPIPE reports in the shell.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gpu_placement.app.serve_options import DEFAULT_NAMESPACE, ServeOptions
from gpu_placement.base.config import Config, ConfigError, load_config
from gpu_placement.base.errors import UsageError
from gpu_placement.base.timestamps import format_duration, parse_duration, parse_time
from gpu_placement.view.snapshot import SnapshotError

__all__ = ["build_parser", "deployed_config", "main"]

_SERVE = ServeOptions()  # serve's flags take their defaults from here
Commands = Any  # argparse's _SubParsersAction, which it does not export: each command's parser is added to it


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:8888)")
    return host.strip("[]") or "0.0.0.0", int(port)


def _components(text: str) -> tuple[str, ...]:
    parts = tuple(p.strip() for p in text.split(",") if p.strip())
    unknown = [p for p in parts if p not in ("extender", "webhook")]
    if unknown or not parts:
        raise argparse.ArgumentTypeError(f"{text!r}: components are extender and/or webhook, e.g. extender,webhook")
    return parts


def _resources(text: str) -> tuple[str, ...]:
    names = tuple(p.strip() for p in text.split(",") if p.strip())
    if not names or any("/" not in name for name in names):
        raise argparse.ArgumentTypeError(f"{text!r}: a comma-separated list of resource names, e.g. "
                                         "nvidia.com/gpu,nvidia.com/mig-1g.10gb")
    return names


def _duration(text: str) -> float:
    """A positive duration in seconds from "90s", "10m", "1h30m", "365d"."""
    try:
        seconds = parse_duration(text, "smhd")
    except ValueError:
        seconds = 0.0
    if not seconds:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive duration such as 90s, 10m, 1h30m or 365d")
    return seconds


def _window(text: str) -> float:
    """`report --since`: whole minutes, from "30m", "12h", "7d", "2w", "1d12h" (the figures are read at minute
    marks, as the idle gauge's record is sampled)."""
    try:
        seconds = parse_duration(text, "mhdw")
    except ValueError:
        seconds = 0.0
    if not seconds:
        raise argparse.ArgumentTypeError(f"{text!r} is not a window of whole minutes such as 30m, 12h, 7d, 2w or "
                                         "1d12h (units m, h, d, w)")
    return seconds


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-placement", description="GPU placement for Kubernetes clusters that "
                                     "run the NVIDIA GPU Operator: scheduler extender and admission webhook.")
    parser.add_argument("--version", action="version", version=f"gpu-placement {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for add in (_serve_parser, _demo_parser, _explain_parser, _nodes_parser, _namespaces_parser, _rollout_parser,
                _survey_parser, _migrate_parser, _report_parser, _replay_parser, _certs_parser):
        add(commands)  # each sets func: what runs the command
    return parser


def _serve_parser(commands: Commands) -> None:
    serve = commands.add_parser("serve", help="run the extender and/or the webhook")
    serve.set_defaults(func=_serve)
    source = serve.add_mutually_exclusive_group()
    source.add_argument("--snapshot", metavar="PATH", help="cluster view from a file or folder of Kubernetes "
                        "JSON/YAML (reloaded when it changes) instead of an API server")
    source.add_argument("--kubeconfig", metavar="PATH", help="API server from this kubeconfig "
                        "(default: in-cluster config)")
    serve.add_argument("--config", metavar="FILE", help="configuration file (YAML)")
    serve.add_argument("--components", type=_components, default=_SERVE.components,
                       help="what to serve: extender,webhook (default both)")
    _serve_extender_arguments(serve)
    _serve_webhook_arguments(serve)
    _serve_certificate_arguments(serve)
    _serve_lease_arguments(serve)
    serve.add_argument("--log-level", default=_SERVE.log_level, choices=["debug", "info", "warning", "error"],
                       help="least severe log lines written (default %(default)s)")


def _serve_extender_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--extender-listen", type=_listen, default=_SERVE.extender_listen, metavar="HOST:PORT",
                       help=f"extender address (default {_address(_SERVE.extender_listen)}; plain HTTP unless a TLS "
                       "pair is given)")
    serve.add_argument("--extender-tls-cert", metavar="FILE", help="extender serving certificate (PEM, reloaded when "
                       "it changes): with --extender-tls-key the extender speaks HTTPS")
    serve.add_argument("--extender-tls-key", metavar="FILE", help="the key of --extender-tls-cert")
    serve.add_argument("--extender-max-body-bytes", type=int, default=_SERVE.extender_max_body_bytes, metavar="N",
                       help=f"largest extender request accepted (default {_SERVE.extender_max_body_bytes // 2**20} "
                       "MiB); larger ones get 413")
    serve.add_argument("--health-listen", type=_listen, metavar="HOST:PORT",
                       help="also serve only GET /healthz and /readyz there, plain HTTP (for kubelet's HTTP probes "
                       "when the extender listens on loopback)")
    serve.add_argument("--managed-resources", type=_resources, metavar="R1,R2,...",
                       help="the managedResources of kube-scheduler's extender configuration: warn (log and "
                       "metric) about GPU resources nodes offer beyond them, which bypass the extender")


def _serve_webhook_arguments(serve: argparse.ArgumentParser) -> None:
    serve.add_argument("--webhook-listen", type=_listen, default=_SERVE.webhook_listen, metavar="HOST:PORT",
                       help=f"webhook address (default {_address(_SERVE.webhook_listen)}, always TLS)")
    serve.add_argument("--tls-cert", metavar="FILE", help="webhook serving certificate (reloaded when it changes)")
    serve.add_argument("--tls-key", metavar="FILE", help="webhook serving key")
    serve.add_argument("--self-signed", metavar="DIR", help="create a CA and serving certificate in DIR "
                       "(writes ca.crt) and serve with them")
    serve.add_argument("--service", metavar="NAME", default=_SERVE.service,
                       help="webhook Service name (certificate SANs; default %(default)s)")
    serve.add_argument("--namespace", metavar="NS", help="namespace of the Service and Secret "
                       f"(default: $POD_NAMESPACE, else {DEFAULT_NAMESPACE})")
    serve.add_argument("--webhook-configuration", metavar="NAME", default=_SERVE.webhook_configuration,
                       help="name of the Mutating- and ValidatingWebhookConfiguration to patch (default %(default)s)")
    serve.add_argument("--webhooks-file", metavar="FILE",
                       help="the webhooks ({mutating: [...], validating: [...]}) to write into the (empty) "
                       "--webhook-configuration once this replica is ready and its --service has a ready "
                       "endpoint; nothing is sent to the webhook before")


def _serve_certificate_arguments(serve: argparse.ArgumentParser) -> None:
    """--manage-certs and its durations (webhook/rotation.py RotationSettings)."""
    serve.add_argument("--manage-certs", action="store_true", help="keep the CA and serving certificate in a "
                       "Secret, patch the caBundle of the webhook configurations and rotate before expiry")
    serve.add_argument("--cert-secret", metavar="NAME", default=_SERVE.cert_secret,
                       help="--manage-certs: the Secret (in --namespace) that keeps the CA and serving certificate "
                       "(default %(default)s)")
    serve.add_argument("--cert-dir", metavar="DIR", default=_SERVE.cert_dir,
                       help="where --manage-certs writes the serving pair (default %(default)s)")
    for flag, field, what in (
            ("--ca-lifetime", "ca_lifetime", "lifetime of each CA it makes"),
            ("--renew-ca-before", "renew_ca_before", "start a CA rotation this long before the CA ends"),
            ("--serving-cert-lifetime", "serving_cert_lifetime", "serving certificate lifetime, cut to its CA's end"),
            ("--renew-serving-before", "renew_serving_before",
             "reissue the serving certificate this long before it ends"),
            ("--ca-overlap", "ca_overlap", "time between the steps of a CA rotation, for every API server to "
             "reload the caBundle"),
            ("--cert-check-interval", "cert_check_interval", "how often the certificates are checked")):
        serve.add_argument(flag, type=_duration, default=getattr(_SERVE, field), metavar="DURATION",
                           help=f"--manage-certs: {what} (default {format_duration(getattr(_SERVE, field))}; "
                           "units s, m, h, d)")


def _serve_lease_arguments(serve: argparse.ArgumentParser) -> None:
    """What webhook replicas run beside their server, each under its Lease in --namespace."""
    serve.add_argument("--quota-mirror", action=argparse.BooleanOptionalAction, default=_SERVE.quota_mirror,
                       help="keep a ResourceQuota in each namespace with gpu-placement.io/quota, so the API server "
                       "enforces it; in audit mode, delete the ones kept before (default on; off with --snapshot)")
    serve.add_argument("--owner", metavar="NAME",
                       help="owner of every object the service writes (mirrored ResourceQuotas, DRA DeviceTaintRules): "
                       "this ValidatingWebhookConfiguration, so they go with it (helm uninstall); default: none "
                       "(a quota's own Namespace)")
    serve.add_argument("--events", action=argparse.BooleanOptionalAction, default=_SERVE.events,
                       help="write Kubernetes Events (webhook replicas, with an API server): on a Node when "
                       "gpu-placement's verdict for it changes, on a Namespace whose gpu-placement settings do "
                       "nothing, on a pod admitted with warnings (docs/operations.md, Events)")
    for flag, field, elects in (
            ("--quota-lease", "quota_lease", "the one replica writing ResourceQuotas"),
            ("--dra-lease", "dra_lease", "the one webhook replica writing DeviceTaintRules for unverified nodes' "
             "DRA devices (config dra.taints)"),
            ("--events-lease", "events_lease", "the one webhook replica writing Node and Namespace Events"),
            ("--outcomes-lease", "outcomes_lease", "the one webhook replica counting launch outcomes and node "
             "lifecycle times; its annotation keeps how far it has counted (docs/outcomes.md)"),
            ("--drivers-lease", "drivers_lease", "the one webhook replica writing each node's "
             "gpu-placement.io/settled-driver annotation (docs/rollouts.md)"),
            ("--fences-lease", "fences_lease", "the one webhook replica writing each node's "
             "gpu-placement.io/launch-fence annotation (docs/rules.md, LaunchFailures)"),
            ("--refused-lease", "refused_lease", "the one webhook replica writing the gpu-placement.io/refused label "
             "of the nodes every GPU pod is refused on (config refusedNodeLabel; docs/performance.md)")):
        serve.add_argument(flag, metavar="NAME", default=getattr(_SERVE, field),
                           help=f"Lease (in --namespace; default %(default)s) that elects {elects}")


def _demo_parser(commands: Commands) -> None:
    demo = commands.add_parser("demo", help="run the embedded demo cluster end to end and print what happened")
    demo.set_defaults(func=_demo)
    demo.add_argument("--config", metavar="FILE", help="configuration file (default: the demo's own)")
    demo.add_argument("--write-snapshot", metavar="FILE", help="only write the demo cluster as a kubectl-style "
                      "List (JSON) to FILE, for `nodes` and `explain`")


def _explain_parser(commands: Commands) -> None:
    explain = commands.add_parser("explain", help="what the webhook would change, and every node's verdict",
                                  epilog=_explain_epilog())
    explain.set_defaults(func=_explain)
    explain.add_argument("pod_file", metavar="FILE|-|KIND/NAME", help="a Pod, or any workload with a pod template "
                         "(Deployment, StatefulSet, DaemonSet, Job, CronJob, PyTorchJob, ...), as JSON or YAML, "
                         "multi-document YAML or a List; - reads it from standard input; or KIND/NAME of one in the "
                         "cluster or --snapshot: pod/NAME (a pod that exists), deploy/NAME, job/NAME, sts/NAME, "
                         "cronjob/NAME, pytorchjob/NAME, ...")
    _cluster_arguments(explain)
    explain.add_argument("-n", "--namespace", metavar="NS", help="namespace of KIND/NAME, or to create the file's "
                         "objects in, as kubectl create -f: an object naming another namespace is refused; default: "
                         "the object's own, else the context's (default with --snapshot)")
    explain.add_argument("--all", action="store_true", dest="show_all",
                         help="every node, not counts and a few examples per reason")
    explain.add_argument("-o", "--output", choices=["text", "json"], default="text",
                         help="json: every node, the webhook's patch and the exit status, for scripts")
    _config_argument(explain)


def _nodes_parser(commands: Commands) -> None:
    nodes = commands.add_parser("nodes", help="one line per node: what GPU pods get there, product, GPUs used and "
                                "free, driver, CUDA, memory")
    nodes.set_defaults(func=_nodes)
    _cluster_arguments(nodes)
    _config_argument(nodes)
    nodes.add_argument("-o", "--output", choices=["text", "wide", "json"], default="text",
                       help="wide adds driver, CUDA and GPU memory; json, everything for scripts")


def _namespaces_parser(commands: Commands) -> None:
    namespaces = commands.add_parser("namespaces", help="one line per namespace with gpu-placement.io/* "
                                     "annotations or labels: opted in or not, policy, quota used and limit, enforced "
                                     "or not, and what is wrong; exit status 1 when a namespace listed has a problem",
                                     epilog="exit status: 0 no namespace listed has a problem; 1 some do (the "
                                     "PROBLEMS column, problems in -o json), as survey exits 1 on findings; 2 bad "
                                     "usage or input")
    namespaces.set_defaults(func=_namespaces)
    _cluster_arguments(namespaces)
    _config_argument(namespaces)
    namespaces.add_argument("-A", "--all", action="store_true", dest="show_all",
                            help="every namespace, also those without gpu-placement annotations or labels")
    namespaces.add_argument("-o", "--output", choices=["text", "json"], default="text",
                            help="json: every namespace's selection, policy, quota and problems, for scripts")


def _rollout_parser(commands: Commands) -> None:
    rollout = commands.add_parser("rollout", help="driver versions and their nodes (done, pending, upgrading, "
                                  "soaking, failed), soak left, XID rate and failed GPU pods per version, next wave")
    rollout.set_defaults(func=_rollout)
    _cluster_arguments(rollout)
    rollout.add_argument("--prometheus", metavar="URL", help="Prometheus to read DCGM XID events from (default: "
                         "the config's telemetry.url)")
    rollout.add_argument("-o", "--output", choices=["text", "json"], default="text",
                         help="json: every version, its nodes and the next wave, for scripts")
    _config_argument(rollout)


def _survey_parser(commands: Commands) -> None:
    survey = commands.add_parser("survey", help="inventory of the GPU fleet per pool and product, and findings with "
                                 "stable codes and fixes (docs/survey.md); exit status 1 when there are findings")
    survey.set_defaults(func=_survey)
    _cluster_arguments(survey)
    survey.add_argument("-o", "--output", choices=["text", "markdown", "json", "html"], default="text",
                        help="html: one self-contained page drawing the fleet by pool and state")
    _config_argument(survey)


def _migrate_parser(commands: Commands) -> None:
    migrate = commands.add_parser("migrate", help="move one node from hand-installed drivers or hand-set labels to "
                                  "the GPU Operator: the steps, which are done, what the next waits for; --apply runs "
                                  "them (docs/survey.md)")
    migrate.set_defaults(func=_migrate)
    migrate.add_argument("node", metavar="NODE", help="the node to move, by name")
    _cluster_arguments(migrate)
    action = migrate.add_mutually_exclusive_group()
    action.add_argument("--apply", action="store_true", help="run the steps in order, saving the way back first; "
                        "stop at the first failure, at a step for a person, or at a wait longer than --timeout")
    action.add_argument("--undo", action="store_true", help="put back what the migration changed, as its way back "
                        "records it: the labels it removed, the cordon, a device plugin DaemonSet's affinity; each "
                        "only where it still holds what the migration wrote")
    migrate.add_argument("--backup-dir", metavar="DIR", default="gpu-placement-migrate",
                         help="where the way back of each node is saved, NODE.json (default ./%(default)s)")
    timeout = 600.0
    migrate.add_argument("--timeout", type=_duration, default=timeout, metavar="DURATION",
                         help=f"--apply: how long to wait for pods to go, the operator and the validator (default "
                         f"{format_duration(timeout)}); the kubectl commands of the plan wait as long")
    migrate.add_argument("-o", "--output", choices=["text", "json"], default="text",
                         help="json: the steps, their state and commands, for scripts")
    _config_argument(migrate)


def _report_parser(commands: Commands) -> None:
    report = commands.add_parser("report", help="the before/after table from Prometheus: launch success and its "
                                 "causes, node preparation and recovery, exclusion latency, GPU pods that waited, "
                                 "GPU-hours idle while pods waited (docs/outcomes.md)",
                                 epilog="exit status: 0 every window has data; 2 bad usage, or Prometheus cannot be "
                                 "read; 3 a window has no data (gpu-placement not scraped then, or the chart's "
                                 "recording rules not loaded): no figures for it, and the series it lacks are named")
    report.set_defaults(func=_report)
    report.add_argument("--prometheus", metavar="URL", help="Prometheus that scrapes gpu-placement and holds the "
                        "chart's recording rules (default: the config's telemetry.url)")
    since = 7 * 86400.0
    report.add_argument("--since", type=_window, default=since, metavar="WINDOW",
                        help="the window's length in whole minutes: units m, h, d, w, e.g. 30m, 12h, 7d, 2w, 1d12h "
                        f"(default {format_duration(since)})")
    report.add_argument("--until", metavar="TIME", help="the window's end, RFC 3339 with its zone "
                        "(2026-03-02T10:00:00Z) or YYYY-MM-DD, midnight UTC (default now)")
    report.add_argument("--compare", metavar="FROM..TO", help="before and after: the --since window ending at FROM "
                        "and the one ending at TO (each RFC 3339, YYYY-MM-DD or now)")
    report.add_argument("-o", "--output", choices=["text", "markdown", "json"], default="text",
                        help="json adds the PromQL behind each figure")
    report.add_argument("--config", metavar="FILE", help="configuration file (for telemetry.url)")


def _replay_parser(commands: Commands) -> None:
    replay = commands.add_parser("replay", help="replay a trace (Alibaba openb CSVs) through the real filter, scores "
                                 "and bind bookkeeping, no cluster: the GPUs each scoring strategy allocates")
    replay.set_defaults(func=_replay)
    replay.add_argument("--nodes", metavar="NODES", required=True, help="the trace's node CSV (sn, cpu_milli, "
                        "memory_mib, gpu, model), or a `kubectl get nodes -o json` file or folder")
    replay.add_argument("--pods", metavar="PODS", required=True, help="the trace's task CSV (name, cpu_milli, "
                        "memory_mib, num_gpu, gpu_milli[, gpu_spec]), or a `kubectl get pods -A -o json` file "
                        "(DaemonSet, static and finished pods do not arrive)")
    replay.add_argument("--arrivals", type=_arrivals, default=1.3, metavar="RATIO|as-is",
                        help="tasks arrive until they ask this many times the cluster's GPUs, listed tasks left "
                        "out or copies of them added at random as the ATC'23 simulator does (default %(default)s); "
                        "as-is: each listed task once")
    replay.add_argument("--seed", type=int, default=42, help="draws the tasks and their order as the ATC'23 "
                        "simulator does with the same seed (default %(default)s)")
    replay.add_argument("--seeds", type=_positive_int, default=1, metavar="N",
                        help="replay seeds SEED..SEED+N-1 and report means and spread (default %(default)s)")
    scoring = ("binpack", "fragmentation")
    replay.add_argument("--scoring", type=_strategies, default=scoring, metavar="a,b,c",
                        help=f"scoring strategies, side by side: binpack, spread, fragmentation (default "
                        f"{','.join(scoring)})")
    replay.add_argument("--mode", choices=["dra", "device-plugin"], default="dra",
                        help="dra: GPUs as DRA devices with consumable capacity, the allocator picks the device; "
                        "device-plugin: exclusive or time-sliced GPUs (default %(default)s)")
    replay.add_argument("--replicas", type=_positive_int, default=2, help="device-plugin: replicas of a "
                        "time-sliced GPU; tasks asking at most 1/REPLICAS of a GPU take one (default %(default)s)")
    replay.add_argument("--tier-size", type=_count, default=8, metavar="K",
                        help="/filter answers the best tier, at most K nodes; kube-scheduler's plugins choose within "
                        "it (the chart's config.scoring.tierSize: %(default)s); 0: every passing node, and "
                        "/prioritize's scores at --extender-weight")
    replay.add_argument("--extender-weight", type=_positive_int, default=5, dest="weight",
                        help="with --tier-size 0: kube-scheduler's weight of the extender's scores (the chart's "
                        "scheduler.extender.weight: %(default)s)")
    replay.add_argument("-o", "--output", choices=["text", "json"], default="text",
                        help="json: every figure of every strategy and seed, for scripts")
    replay.add_argument("--config", metavar="FILE", help="configuration file to judge with (scoring.strategy "
                        "is replaced by each strategy replayed)")


def _certs_parser(commands: Commands) -> None:
    certs = commands.add_parser("certs", help="write a CA and serving certificate; print the base64 caBundle",
                                description="Write a new CA and a serving certificate for the webhook's Service into "
                                "DIR, and print the CA as the base64 caBundle of the webhook configurations.")
    certs.set_defaults(func=_certs)
    certs.add_argument("--out", metavar="DIR", required=True, help="folder to write ca.crt, tls.crt and tls.key "
                       "(0600) into; made if missing; the CA's key is not kept")
    certs.add_argument("--service", metavar="NAME", required=True, help="the webhook's Service: the certificate "
                       "names NAME, NAME.NS, NAME.NS.svc and NAME.NS.svc.cluster.local")
    certs.add_argument("--namespace", metavar="NS", required=True, help="the namespace of that Service")


def _address(listen: tuple[str, int]) -> str:
    return f"{listen[0]}:{listen[1]}"


def _cluster_arguments(parser: argparse.ArgumentParser) -> None:
    """Where the cluster comes from: a snapshot, or a live API server as kubectl finds it."""
    parser.add_argument("--snapshot", metavar="PATH", help="a file or folder of Kubernetes JSON/YAML instead of "
                        "the cluster")
    parser.add_argument("--kubeconfig", metavar="PATH", help="kubeconfig (default: $KUBECONFIG, else "
                        "~/.kube/config, as kubectl)")
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context (default: the current one)")


def _config_argument(parser: argparse.ArgumentParser) -> None:
    """For commands that answer for the running service: by default they use its own configuration."""
    parser.add_argument("--config", metavar="FILE", help="configuration file (YAML) to judge with; default: the "
                        "deployed one, the chart's ConfigMap (labelled app.kubernetes.io/part-of=gpu-placement) in "
                        "the cluster or the snapshot, else the built-in defaults; the output says which")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return _run(args)
    except BrokenPipeError:
        # The reader went away (`| head`): say nothing more, and keep Python from writing a second
        # error when it flushes stdout at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 141
    except Exception as exc:
        if os.environ.get("GPU_PLACEMENT_DEBUG"):
            raise
        detail = " ".join(str(exc).split())[:300]
        print(f"gpu-placement {args.command}: unexpected error, a bug in gpu-placement ({type(exc).__name__}: "
              f"{detail}); GPU_PLACEMENT_DEBUG=1 shows the traceback", file=sys.stderr)
        return 70


def _run(args: argparse.Namespace) -> int:
    try:
        return int(args.func(args))
    except _usage_errors() as exc:  # looked up only when something went wrong: the imports wait till then
        print(f"gpu-placement {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _serve(args: argparse.Namespace) -> int:
    from gpu_placement.app.assembly import serve

    return serve(ServeOptions.from_args(args))


def _demo(args: argparse.Namespace) -> int:
    from gpu_placement.app.demo import run_demo, write_snapshot

    if args.write_snapshot:
        return _write_snapshot(args.write_snapshot, write_snapshot)
    return run_demo(_config(args.config) if args.config else None)


def _namespaces(args: argparse.Namespace) -> int:
    from gpu_placement.report.namespaces import run_namespaces

    return run_namespaces(args, _cluster)


def _usage_errors() -> tuple[type[Exception], ...]:
    """The errors that mean "bad usage or input", with those of modules loaded on demand."""
    from gpu_placement.replay.trace import TraceError

    extra: list[type[Exception]] = [UsageError, ConfigError, SnapshotError, TraceError]
    try:
        from gpu_placement.kube.api import KubeConfigError
        from gpu_placement.view.fetch import FetchError

        extra += [KubeConfigError, FetchError]
    except ImportError:  # pragma: no cover - the live source is optional at import time
        pass
    return tuple(extra)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0 or value > 100:
        raise argparse.ArgumentTypeError(f"{text} must be above 0 (and at most 100)")
    return value


def _arrivals(text: str) -> float | None:
    if text == "as-is":
        return None
    try:
        return _positive_float(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or as-is (each listed task once)") from None


def _positive_int(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of at least 1")
    return int(text)


def _count(text: str) -> int:
    if not text.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number, 0 or more")
    return int(text)


def _strategies(text: str) -> tuple[str, ...]:
    from gpu_placement.replay.report import STRATEGIES

    names = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [name for name in names if name not in STRATEGIES]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{text!r}: scoring strategies are {', '.join(STRATEGIES)} "
                                         "(comma-separated, e.g. binpack,fragmentation)")
    return names


def _replay(args: argparse.Namespace) -> int:
    from gpu_placement.replay.report import ReplayOptions, render_json, render_text, run_replays, stderr_if_terminal

    options = ReplayOptions(args.nodes, args.pods, args.scoring, args.mode, args.arrivals, args.seed, args.seeds,
                            args.weight, args.replicas, args.tier_size)
    config = _config(args.config) if args.config else None
    replays = run_replays(options, config, stderr_if_terminal())
    if args.output == "json":
        sys.stdout.buffer.write(render_json(replays) + b"\n")
    else:
        print(render_text(replays, options))
    return 0


def _config(path: str | None) -> Config:
    return load_config(path)


def _nodes(args: argparse.Namespace) -> int:
    from gpu_placement.report.nodes import run_nodes

    return run_nodes(args, _cluster)


def _report(args: argparse.Namespace) -> int:
    from gpu_placement.outcomes.report import Prometheus, ReportError, Window, compute, no_data, now, render

    url = args.prometheus or (str(_config(args.config).telemetry.url or "") if args.config else "")
    if not url:
        raise UsageError("give --prometheus URL (or --config FILE with telemetry.url): the report reads Prometheus")
    source = Prometheus(url)
    if args.compare:
        before, sep, after = args.compare.partition("..")
        if not sep or not before or not after:
            raise UsageError(f"--compare {args.compare!r}: FROM..TO, e.g. 2026-01-01..2026-02-01")
        ends = [_moment(before), _moment(after)]
    else:
        ends = [_moment(args.until) if args.until else now()]
    try:
        reports = [compute(source, Window.ending(end, args.since)) for end in ends]
    except ReportError as exc:
        raise UsageError(str(exc)) from None
    print(render(reports, args.output, _since(args.since)))
    return 3 if any(no_data(report) for report in reports) else 0


def _moment(text: str) -> float:
    """now, YYYY-MM-DD (midnight UTC) or RFC 3339 (a time with its zone), as Unix seconds."""
    from datetime import UTC, datetime

    if text == "now":
        from gpu_placement.outcomes.report import now

        return now()
    if re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
        try:
            return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()
        except ValueError:
            pass
    moment = parse_time(text)
    if moment is None:
        raise UsageError(f"{text!r} is not a time: now, YYYY-MM-DD or RFC 3339 with its zone (2026-03-02T10:00:00Z, "
                         "2026-03-02T11:00:00+01:00)")
    return moment


def _since(seconds: float) -> str:
    if seconds % 86400 == 0:
        return f"{seconds / 86400:g}d"
    return f"{seconds / 3600:g}h" if seconds % 3600 == 0 else f"{seconds / 60:g}m"


def _rollout(args: argparse.Namespace) -> int:
    from gpu_placement.report.rollout import run_rollout

    core, access, objects = _cluster(args)
    print(run_rollout(core, access, objects, args.prometheus, args.output))
    return 0


def _survey(args: argparse.Namespace) -> int:
    from gpu_placement.app.explain import admit
    from gpu_placement.survey.command import render, survey_cluster

    core, access, objects = _cluster(args)
    webhook = core.webhook_app()  # workload templates become pods through the webhook, as the API server makes them
    survey = survey_cluster(core, access, objects, lambda pod, namespace: admit(webhook, pod, namespace).pod)
    print(render(survey, args.output))
    return 1 if survey.findings else 0


def _migrate(args: argparse.Namespace) -> int:
    from pathlib import Path

    from gpu_placement.survey.migrate import DONE, MigrateError, NotMigratable, needed, plan, refusal
    from gpu_placement.survey.migrate_command import FAILED, apply, backup_file, read_live, read_snapshot, render_plan
    from gpu_placement.survey.migrate_command import undo as undo_node

    directory = Path(args.backup_dir)
    path = backup_file(directory, args.node)
    if args.snapshot:
        if args.apply or args.undo:
            raise UsageError("--apply and --undo change a live cluster: use --kubeconfig (or the current context), "
                             "not --snapshot")
        if args.kubeconfig or args.context:
            raise UsageError("--snapshot and --kubeconfig/--context exclude each other: one cluster at a time")
        from gpu_placement.view.snapshot import load_snapshot

        objects, access = load_snapshot(args.snapshot), None
    else:
        from gpu_placement.view.fetch import connect

        access, objects = connect(args.kubeconfig, args.context), []
    config = deployed_config(args, access, objects).config
    try:
        if args.apply and access is not None:  # --snapshot refused them above
            return apply(access, args.node, config, directory, args.timeout, sys.stdout)
        if args.undo and access is not None:
            return undo_node(access, args.node, directory, sys.stdout)
        state = read_snapshot(objects, args.node, config, path, timeout=args.timeout) if access is None else \
            read_live(access, args.node, config, path, args.timeout)
        why_not = refusal(state)
        if why_not:
            raise NotMigratable(why_not)
    except NotMigratable as exc:
        print(f"gpu-placement migrate: {exc}", file=sys.stderr)
        return 2
    except MigrateError as exc:
        print(f"gpu-placement migrate: {exc}", file=sys.stderr)
        return FAILED if args.apply or args.undo else 2
    why = needed(state)
    if why:
        print(why)
        return 0
    steps = plan(state)
    print(render_plan(state, steps, args.output))
    return 0 if all(step.state == DONE for step in steps) else 1


def _core(args: argparse.Namespace) -> tuple[Any, Any]:
    """The view of `--snapshot`, else of the live cluster read once, judged with the deployed
    configuration (`core.config_source` says which); and the live access, if any."""
    core, access, _ = _cluster(args)
    return core, access


def _cluster(args: argparse.Namespace, given: Sequence[dict[str, Any]] = (),
             namespace: str | None = None) -> tuple[Any, Any, list[dict[str, Any]]]:
    """`_core`, and the objects it was built from (explain runs kube-scheduler's filters on them).
    `given`: objects from the user's file laid over the cluster's (a Namespace written beside a Job);
    `namespace`: the one the answer is about (-n, else the file's), read where cluster-wide lists are refused."""
    from gpu_placement.app.assembly import core_from_objects

    if args.snapshot:
        if args.kubeconfig or args.context:
            raise UsageError("--snapshot and --kubeconfig/--context exclude each other: one cluster at a time")
        from gpu_placement.view.snapshot import load_snapshot

        # `namespaces` reads only Namespaces: a `kubectl get namespaces -o yaml` file is a snapshot for it.
        objects, access = load_snapshot(args.snapshot, "Namespace" if args.command == "namespaces" else "Node"), None
    else:
        from gpu_placement.view.fetch import connect, fetch_objects

        access = connect(args.kubeconfig, args.context)
        objects = fetch_objects(access, namespace or getattr(args, "namespace", None))
    if given:
        replaced = {(o.get("kind"), (o.get("metadata") or {}).get("name")) for o in given}
        objects = [o for o in objects if (o.get("kind"), (o.get("metadata") or {}).get("name")) not in replaced]
        objects += list(given)
    deployed = deployed_config(args, access, objects)
    core = core_from_objects(deployed.config, objects)
    core.config_source = deployed.source
    return core, access, objects


def deployed_config(args: argparse.Namespace, access: Any, objects: list[dict[str, Any]]) -> Any:
    """The configuration of a command that answers for the running service (`explain`, `nodes`,
    `rollout`): `--config FILE`, else the chart's ConfigMap in the cluster (`access`) or among the
    snapshot's `objects`, else the built-in defaults. A DeployedConfig: `.config`, `.source`."""
    from gpu_placement.app.deployed import LABEL_SELECTOR, DeployedConfig, from_config_maps, from_file

    if args.config:
        return from_file(args.config)
    if access is None:
        return from_config_maps([o for o in objects if o.get("kind") == "ConfigMap"], f"snapshot {args.snapshot}")
    from gpu_placement.base.config import Config
    from gpu_placement.view.fetch import FetchError, fetch_labelled

    refused = ""
    for path in ("/api/v1/configmaps", "/api/v1/namespaces/gpu-placement/configmaps"):  # the chart's namespace
        try:
            return from_config_maps(fetch_labelled(access, path, LABEL_SELECTOR, "ConfigMap"),
                                    f"context {access.context}")
        except FetchError as exc:
            if exc.status != 403:
                raise
            refused = refused or str(exc)
    return DeployedConfig(Config(), f"built-in defaults: ConfigMaps could not be read ({refused}); pass "
                                    "--config FILE with the deployed configuration")


def _explain(args: argparse.Namespace) -> int:
    from gpu_placement.app.cli_explain import run_explain

    return run_explain(args, _cluster)


def _write_snapshot(path: str, write: Any) -> int:
    """`demo --write-snapshot FILE`: a folder gets the file inside it; a path that cannot be written, one line."""
    target = Path(path)
    if target.is_dir():
        target = target / "demo-cluster.json"
    try:
        return int(write(str(target)))
    except OSError as exc:
        raise UsageError(f"--write-snapshot {path}: cannot write {target}: {exc.strerror or exc}") from None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gpu-placement")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def _explain_epilog() -> str:
    from gpu_placement.app.cli_explain import EXIT_CODES

    return EXIT_CODES


def _certs(args: argparse.Namespace) -> int:
    from gpu_placement.web.certs import CertificateError, write_bundle

    try:
        bundle = write_bundle(args.out, args.service, args.namespace)
    except (CertificateError, OSError) as exc:
        raise UsageError(str(exc)) from exc
    print(f"wrote {bundle.ca_cert}, {bundle.cert}, {bundle.key}", file=sys.stderr)
    print(bundle.ca_bundle_b64)
    return 0


if __name__ == "__main__":
    sys.exit(main())
