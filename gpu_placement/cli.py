"""The `gpu-placement` command: serve, demo, explain, nodes, certs.

Exit status 0 on success, 2 on bad usage or bad input with a one-line message naming the problem.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson
import yaml

from gpu_placement.config import Config, ConfigError, load_config
from gpu_placement.snapshot import SnapshotError

__all__ = ["UsageError", "build_parser", "main"]


class UsageError(Exception):
    """Bad usage or bad input: printed as one line, exit status 2."""


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpu-placement", description="GPU placement for Kubernetes clusters that "
                                     "run the NVIDIA GPU Operator: scheduler extender and admission webhook.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser("serve", help="run the extender and/or the webhook")
    source = serve.add_mutually_exclusive_group()
    source.add_argument("--snapshot", metavar="PATH", help="cluster view from a file or folder of Kubernetes "
                        "JSON/YAML (reloaded when it changes) instead of an API server")
    source.add_argument("--kubeconfig", metavar="PATH", help="API server from this kubeconfig "
                        "(default: in-cluster config)")
    serve.add_argument("--config", metavar="FILE", help="configuration file (YAML)")
    serve.add_argument("--components", type=_components, default=("extender", "webhook"),
                       help="what to serve: extender,webhook (default both)")
    serve.add_argument("--extender-listen", type=_listen, default=("127.0.0.1", 8888), metavar="HOST:PORT",
                       help="extender address (default 127.0.0.1:8888; plain HTTP unless a TLS pair is given)")
    serve.add_argument("--extender-tls-cert", metavar="FILE")
    serve.add_argument("--extender-tls-key", metavar="FILE")
    serve.add_argument("--extender-max-body-bytes", type=int, default=64 * 2**20, metavar="N",
                       help="largest extender request accepted (default 64 MiB); larger ones get 413")
    serve.add_argument("--webhook-listen", type=_listen, default=("0.0.0.0", 8443), metavar="HOST:PORT",
                       help="webhook address (default 0.0.0.0:8443, always TLS)")
    serve.add_argument("--tls-cert", metavar="FILE", help="webhook serving certificate (reloaded when it changes)")
    serve.add_argument("--tls-key", metavar="FILE", help="webhook serving key")
    serve.add_argument("--self-signed", metavar="DIR", help="create a CA and serving certificate in DIR "
                       "(writes ca.crt) and serve with them")
    serve.add_argument("--manage-certs", action="store_true", help="keep the CA and serving certificate in a "
                       "Secret, patch the caBundle of the webhook configurations and rotate before expiry")
    serve.add_argument("--cert-secret", metavar="NAME", default="gpu-placement-webhook-tls")
    serve.add_argument("--service", metavar="NAME", default="gpu-placement-webhook",
                       help="webhook Service name (certificate SANs)")
    serve.add_argument("--namespace", metavar="NS", help="namespace of the Service and Secret "
                       "(default: $POD_NAMESPACE, else gpu-placement)")
    serve.add_argument("--webhook-configuration", metavar="NAME", default="gpu-placement",
                       help="name of the Mutating- and ValidatingWebhookConfiguration to patch")
    serve.add_argument("--cert-dir", metavar="DIR", default="/tmp/gpu-placement-certs",
                       help="where --manage-certs writes the serving pair (default /tmp/gpu-placement-certs)")
    serve.add_argument("--quota-mirror", action=argparse.BooleanOptionalAction, default=True,
                       help="keep a ResourceQuota in each namespace with gpu-placement.io/quota, so the API server "
                       "enforces it (default on; off in audit mode and with --snapshot)")
    serve.add_argument("--quota-lease", metavar="NAME", default="gpu-placement-quota-mirror",
                       help="Lease (in --namespace) that elects the one replica writing ResourceQuotas")
    serve.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])

    demo = commands.add_parser("demo", help="run the embedded demo cluster end to end and print what happened")
    demo.add_argument("--config", metavar="FILE", help="configuration file (default: the demo's own)")
    demo.add_argument("--write-snapshot", metavar="FILE", help="only write the demo cluster as a kubectl-style "
                      "List (JSON) to FILE, for `nodes` and `explain`")

    explain = commands.add_parser("explain", help="what the webhook would change, and every node's verdict")
    explain.add_argument("pod_file", metavar="POD_FILE", help="a Pod as JSON or YAML")
    explain.add_argument("--snapshot", metavar="PATH", required=True)
    explain.add_argument("--namespace", metavar="NS", help="namespace to admit the pod into")
    explain.add_argument("--config", metavar="FILE")

    nodes = commands.add_parser("nodes", help="one line per node: readiness, product, GPUs, driver, CUDA, memory")
    nodes.add_argument("--snapshot", metavar="PATH", required=True)
    nodes.add_argument("--config", metavar="FILE")

    certs = commands.add_parser("certs", help="write a CA and serving certificate; print the base64 caBundle")
    certs.add_argument("--out", metavar="DIR", required=True)
    certs.add_argument("--service", metavar="NAME", required=True)
    certs.add_argument("--namespace", metavar="NS", required=True)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "serve":
            from gpu_placement.serve import serve

            return serve(args)
        if args.command == "demo":
            from gpu_placement.demo import run_demo, write_snapshot

            if args.write_snapshot:
                return write_snapshot(args.write_snapshot)
            return run_demo(_config(args.config) if args.config else None)
        if args.command == "explain":
            return _explain(args)
        if args.command == "nodes":
            return _nodes(args)
        if args.command == "certs":
            return _certs(args)
    except (UsageError, ConfigError, SnapshotError, *_extra_errors()) as exc:
        print(f"gpu-placement {args.command}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    raise AssertionError(args.command)


def _extra_errors() -> tuple[type[Exception], ...]:
    """Errors of modules loaded on demand that also mean "bad usage or input"."""
    from gpu_placement import serve

    extra: list[type[Exception]] = [serve.UsageError]
    try:
        from gpu_placement.kube import KubeConfigError

        extra.append(KubeConfigError)
    except ImportError:  # pragma: no cover - the live source is optional at import time
        pass
    return tuple(extra)


def _config(path: str | None) -> Config:
    return load_config(path)


def _nodes(args: argparse.Namespace) -> int:
    from gpu_placement.report import NODE_HEADER, node_rows, table
    from gpu_placement.service import core_from_snapshot

    core = core_from_snapshot(_config(args.config), args.snapshot)
    print(table(NODE_HEADER, node_rows(core.view)))
    return 0


def read_pod_file(path: str) -> dict[str, Any]:
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from exc
    try:
        pod = orjson.loads(text) if text.lstrip()[:1] == b"{" else yaml.safe_load(text)
    except (orjson.JSONDecodeError, yaml.YAMLError) as exc:
        raise UsageError(f"{path}: not valid JSON or YAML: {str(exc).splitlines()[0]}") from exc
    if not isinstance(pod, dict) or pod.get("kind", "Pod") != "Pod" or not isinstance(pod.get("spec"), dict):
        found = pod.get("kind") if isinstance(pod, dict) else type(pod).__name__
        raise UsageError(f"{path}: expected a Pod with a spec, found {found}")
    return pod


def _explain(args: argparse.Namespace) -> int:
    from gpu_placement.explain import explain_pod
    from gpu_placement.service import core_from_snapshot

    pod = read_pod_file(args.pod_file)
    core = core_from_snapshot(_config(args.config), args.snapshot)
    print(explain_pod(core, pod, args.namespace))
    return 0


def _certs(args: argparse.Namespace) -> int:
    from webhook.certs import CertificateError, write_bundle

    try:
        bundle = write_bundle(args.out, args.service, args.namespace)
    except (CertificateError, OSError) as exc:
        raise UsageError(str(exc)) from exc
    print(f"wrote {bundle.ca_cert}, {bundle.cert}, {bundle.key}", file=sys.stderr)
    print(bundle.ca_bundle_b64)
    return 0


if __name__ == "__main__":
    sys.exit(main())
