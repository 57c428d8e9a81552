"""The admission webhooks, written into their configurations by the service once a replica answers.

The chart installs the MutatingWebhookConfiguration and the ValidatingWebhookConfiguration (one
name) without webhooks: the API server then sends nothing anywhere, so nothing can be refused while
no replica answers (a first install whose image never pulls, a rollout that never becomes ready, a
release rolled back). The webhooks come from the chart too, in a file (`--webhooks-file`, from a
ConfigMap: `{mutating: [...], validating: [...]}`); a replica writes them into the two
configurations once

1. it is ready itself: its view is listed and its listener is up (what /readyz says), and
2. the webhook Service has a ready endpoint: kubelet has seen a replica's readiness probe pass, so
   the API server's calls reach a replica that answers (then a few seconds more for kube-proxy).

Each webhook gets as caBundle the CA its serving certificate chains to (`ca.crt` beside it: the
service's own with --manage-certs, cert-manager's with certManager.enabled), else the live one.

Who writes when: a replica writes once, after it became ready, and later only when a configuration
has no webhooks at all (someone emptied it). So during a rolling update the new replicas write their
webhooks as they become ready and the old ones never write theirs back. Helm owns the configurations
but not their webhooks (the chart renders none): `helm upgrade` and `helm rollback` leave the
webhooks as they are (three-way merge and server-side apply touch only what the chart sets), and
`helm uninstall` deletes the configurations, webhooks and all. The service never creates a
configuration (its RBAC allows get and patch on these two by name, nothing more).
"""

from __future__ import annotations

import base64
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import urllib3
import yaml
from kubernetes.client import ApiClient

from gpu_placement.base.names import REGISTERED_ANNOTATION
from gpu_placement.kube.api import OBJECT_TIMEOUT, ApiError, get, get_or_none, write
from gpu_placement.kube.leader import Worker
from gpu_placement.observe import metrics

__all__ = ["KINDS", "REGISTERED_ANNOTATION", "RegistrationSettings", "WebhookRegistration", "WebhookSpec",
           "load_webhook_spec"]

log = logging.getLogger("gpu_placement.registration")

KINDS = {"mutating": "mutatingwebhookconfigurations", "validating": "validatingwebhookconfigurations"}
WebhookSpec = dict[str, list[dict[str, Any]]]  # "mutating" | "validating" -> webhooks


@dataclass(slots=True, frozen=True)
class RegistrationSettings:
    interval_seconds: float = 1.0  # how often to look for readiness and the endpoint, until written
    recheck_seconds: float = 30.0  # then how often to look for emptied configurations (two GETs each time)
    settle_seconds: float = 3.0  # from the first ready endpoint to the write: kube-proxy programs the Service


def load_webhook_spec(path: str | Path) -> WebhookSpec:
    """The webhooks the chart rendered; ValueError naming the problem (serve exits 2 on it)."""
    try:
        data = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise ValueError(f"--webhooks-file {path}: {exc}") from None
    if not isinstance(data, dict) or set(data) - set(KINDS):
        raise ValueError(f"--webhooks-file {path}: expected a mapping with the keys mutating and validating")
    spec: WebhookSpec = {}
    for key in KINDS:
        hooks = data.get(key) or []
        if not isinstance(hooks, list) or not all(isinstance(h, dict) and h.get("name") and
                                                  isinstance(h.get("clientConfig"), dict) for h in hooks):
            raise ValueError(f"--webhooks-file {path}: {key} must be a list of webhooks, each with a name and "
                             "a clientConfig")
        spec[key] = hooks
    return spec


class WebhookRegistration(Worker):
    what = "webhook registration"
    log = log

    def __init__(self, api: ApiClient, configuration: str, namespace: str, service: str, spec: WebhookSpec,
                 ready: Callable[[], bool], ca_file: Path | None, identity: str,
                 settings: RegistrationSettings | None = None) -> None:
        self.api, self.configuration, self.namespace, self.service = api, configuration, namespace, service
        self.spec, self.ready, self.ca_file, self.identity = spec, ready, ca_file, identity
        self.settings = settings or RegistrationSettings()
        super().__init__()
        self.registered = False  # this replica has written the webhooks
        self.last_error: str | None = None
        self._endpoint_since: float | None = None
        self._waiting_for = ""
        self._gauge = metrics.WEBHOOKS_REGISTERED
        self._gauge.set(0)

    # -- running -------------------------------------------------------------------------------
    def _pause(self) -> None:
        self._stop.wait(self.settings.recheck_seconds if self.registered else self.settings.interval_seconds)

    def step(self) -> None:
        """One turn: write the webhooks when due. API errors are logged once each and retried."""
        try:
            if not self.registered:
                if self._due():
                    self._write_all("this replica is ready and the Service has a ready endpoint")
            else:
                emptied = [kind for kind in KINDS if self._get(kind) == []]
                if emptied:
                    self._write_all(f"the {' and '.join(emptied)} configuration had no webhooks")
            self.last_error = None
        except (ApiError, OSError, urllib3.exceptions.HTTPError) as exc:
            if str(exc) != self.last_error:
                log.error("webhook registration: %s; retrying in %.0f s", exc, self.settings.interval_seconds)
            self.last_error = str(exc)

    def _due(self) -> bool:
        """The endpoint is watched from the start, so on a rolling update (the old replicas are the
        Service's endpoints) a new replica writes as soon as it is ready itself."""
        now = time.monotonic()
        if not self._endpoint_ready():
            self._endpoint_since = None
            return self._wait(f"a ready endpoint of Service {self.namespace}/{self.service}")
        if self._endpoint_since is None:
            self._endpoint_since = now
        if not self.ready():
            return self._wait("this replica to be ready (its view listed, its listener up)")
        return now - self._endpoint_since >= self.settings.settle_seconds

    def _wait(self, what: str) -> bool:
        if what != self._waiting_for:
            log.info("webhook registration: waiting for %s before the API server is sent any pod", what)
            self._waiting_for = what
        return False

    # -- the API -------------------------------------------------------------------------------
    def _endpoint_ready(self) -> bool:
        slices = get(self.api, f"/apis/discovery.k8s.io/v1/namespaces/{self.namespace}/endpointslices",
                     query=[("labelSelector", f"kubernetes.io/service-name={self.service}")], timeout=OBJECT_TIMEOUT
                     ).get("items") or []
        # A missing `ready` counts as ready (discovery.k8s.io/v1 EndpointConditions).
        return any((endpoint.get("conditions") or {}).get("ready", True) is not False
                   for piece in slices for endpoint in piece.get("endpoints") or ())

    def _path(self, kind: str) -> str:
        return f"/apis/admissionregistration.k8s.io/v1/{KINDS[kind]}/{self.configuration}"

    def _get(self, kind: str) -> list[dict[str, Any]] | None:
        """The live webhooks of one configuration; None when the configuration does not exist."""
        current = get_or_none(self.api, self._path(kind), timeout=OBJECT_TIMEOUT)
        return None if current is None else list(current.get("webhooks") or [])

    def _write_all(self, why: str) -> None:
        bundle = self._ca_bundle()
        written = [kind for kind in KINDS if self._write(kind, bundle)]
        if not written:
            return
        self.registered = True
        self._gauge.set(1)
        self._waiting_for = ""
        log.info("webhook registration: wrote the webhooks of %s (%s) because %s", self.configuration,
                 ", ".join(written), why)

    def _write(self, kind: str, bundle: str | None) -> bool:
        current = get_or_none(self.api, self._path(kind), timeout=OBJECT_TIMEOUT)
        if current is None:
            log.warning("webhook registration: %s %s does not exist (deleted by hand, or the release is being "
                        "uninstalled): nothing registered; helm upgrade puts it back", KINDS[kind], self.configuration)
            return False
        meta = current.get("metadata") or {}
        live_ca = {hook.get("name"): (hook.get("clientConfig") or {}).get("caBundle")
                   for hook in current.get("webhooks") or ()}
        hooks = []
        for hook in self.spec[kind]:
            ca = bundle or live_ca.get(hook["name"])
            client = {k: v for k, v in hook["clientConfig"].items() if k != "caBundle"}
            hooks.append({**hook, "clientConfig": {**client, **({"caBundle": ca} if ca else {})}})
        stamp = f"{datetime.now(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')} by {self.identity}"
        ops: list[dict[str, Any]] = [{"op": "test", "path": "/metadata/resourceVersion",
                                      "value": meta.get("resourceVersion")},
                                     {"op": "add", "path": "/webhooks", "value": hooks}]
        if meta.get("annotations"):
            ops.append({"op": "add", "path": "/metadata/annotations/" + REGISTERED_ANNOTATION.replace("/", "~1"),
                        "value": stamp})
        else:
            ops.append({"op": "add", "path": "/metadata/annotations", "value": {REGISTERED_ANNOTATION: stamp}})
        # A 409/422 from the test op raises: changed meanwhile, written on the next turn.
        return write(self.api, "PATCH", self._path(kind), body=ops, timeout=OBJECT_TIMEOUT,
                     content_type="application/json-patch+json")

    def _ca_bundle(self) -> str | None:
        """Base64 of the CA file beside the serving certificate, if there is one."""
        if self.ca_file is None:
            return None
        try:
            pem = self.ca_file.read_bytes()
        except OSError:
            return None
        return base64.b64encode(pem).decode() if pem.strip() else None
