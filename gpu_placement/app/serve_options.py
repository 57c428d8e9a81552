"""`gpu-placement serve`'s options, typed, each default written once: here. The command line's flags take
their defaults (and the defaults their help texts show) from `ServeOptions()`, and `from_args` builds the
options once from what argparse read; `serve` (gpu_placement/app/assembly.py) reads nothing else. A test
or a tool that runs part of `serve` gives the options it cares about and gets the flags' defaults for the
rest.

Light on purpose: the command line imports it for every command, so it imports no server or client.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, fields

from gpu_placement.web.shape import EXTENDER_MAX_BODY

__all__ = ["DEFAULT_NAMESPACE", "ServeOptions"]

DEFAULT_NAMESPACE = "gpu-placement"  # the chart's: the Service, the Secret and the Leases, without --namespace
_DAY = 86400.0


@dataclass(slots=True, frozen=True)
class ServeOptions:
    # What to serve, from which cluster view.
    components: tuple[str, ...] = ("extender", "webhook")
    snapshot: str | None = None  # a file or folder of Kubernetes objects instead of an API server
    kubeconfig: str | None = None  # None: the in-cluster configuration
    config: str | None = None  # the configuration file (YAML); None: the built-in defaults
    log_level: str = "info"
    # The extender.
    extender_listen: tuple[str, int] = ("127.0.0.1", 8888)
    extender_tls_cert: str | None = None  # with extender_tls_key: HTTPS
    extender_tls_key: str | None = None
    extender_max_body_bytes: int = EXTENDER_MAX_BODY
    health_listen: tuple[str, int] | None = None  # /healthz and /readyz only, plain HTTP
    managed_resources: tuple[str, ...] | None = None  # kube-scheduler's managedResources, to warn about the rest
    # The webhook and its certificate: one of tls_cert/tls_key, self_signed, manage_certs.
    webhook_listen: tuple[str, int] = ("0.0.0.0", 8443)
    tls_cert: str | None = None
    tls_key: str | None = None
    self_signed: str | None = None  # the folder of a CA and serving certificate made here
    manage_certs: bool = False
    cert_secret: str = "gpu-placement-webhook-tls"
    service: str = "gpu-placement-webhook"
    namespace: str | None = None  # None: $POD_NAMESPACE, else DEFAULT_NAMESPACE (`home`)
    webhook_configuration: str = "gpu-placement"
    webhooks_file: str | None = None
    cert_dir: str = "/tmp/gpu-placement-certs"
    # Certificate rotation with manage_certs, in seconds (webhook/rotation.py RotationSettings.from_args).
    ca_lifetime: float = 3650 * _DAY
    renew_ca_before: float = 365 * _DAY
    serving_cert_lifetime: float = 365 * _DAY
    renew_serving_before: float = 30 * _DAY
    ca_overlap: float = 600.0
    cert_check_interval: float = 60.0
    # What a webhook replica runs beside its server, each under its own Lease in `home`.
    quota_mirror: bool = True
    quota_lease: str = "gpu-placement-quota-mirror"
    owner: str | None = None  # the owner of every object written (mirrored quotas, DeviceTaintRules)
    dra_lease: str = "gpu-placement-dra"
    events: bool = True
    events_lease: str = "gpu-placement-events"
    outcomes_lease: str = "gpu-placement-outcomes"
    drivers_lease: str = "gpu-placement-drivers"
    fences_lease: str = "gpu-placement-launch-fences"
    refused_lease: str = "gpu-placement-refused"

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> ServeOptions:
        """The options `serve`'s parser read (every field is one of its flags)."""
        given = vars(args)
        return cls(**{field.name: given[field.name] for field in fields(cls)})

    @property
    def home(self) -> str:
        """The namespace of the Service, the Secret and the Leases: --namespace, else the pod's own."""
        return self.namespace or os.environ.get("POD_NAMESPACE") or DEFAULT_NAMESPACE
