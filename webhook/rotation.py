"""Webhook certificates kept by the service itself (no cert-manager): a CA and serving certificate in
a Secret, the caBundle of both webhook configurations patched to trust it, rotation before expiry.

Every replica copies the Secret's serving pair to `cert_dir`, where `ReloadingTLS` picks it up.
Only the replica holding the Lease writes. Rotating the CA takes three steps, each at least
`overlap_seconds` apart, so that the API server never meets a certificate it does not trust:

1. stage: a new CA is made; the caBundle trusts old and new; serving continues with the old pair;
2. promote: the serving pair is reissued by the new CA; the caBundle still trusts both;
3. retire: the caBundle trusts the new CA alone.

A serving certificate near its end (CA healthy) is simply reissued by the same CA.
"""

from __future__ import annotations

import base64
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kubernetes.client import ApiClient

from gpu_placement.base.timestamps import parse_datetime
from gpu_placement.kube.api import OBJECT_TIMEOUT, ApiError, get_or_none, write
from gpu_placement.kube.lease import Lease
from gpu_placement.web.certs import cert_not_after, make_ca, make_serving_cert

__all__ = ["CertPaths", "CertificateManager", "RotationSettings"]

log = logging.getLogger("gpu_placement.rotation")
_STAGED_AT = "gpu-placement.io/ca-staged-at"
_PROMOTED_AT = "gpu-placement.io/ca-promoted-at"


@dataclass(slots=True, frozen=True)
class RotationSettings:
    ca_days: float = 3650
    serving_days: float = 365
    renew_serving_before: timedelta = timedelta(days=30)
    renew_ca_before: timedelta = timedelta(days=365)
    overlap_seconds: float = 600.0  # long enough for every API server to reload the caBundle
    check_interval: float = 60.0
    lease_seconds: int = 60

    def __post_init__(self) -> None:
        """Refuse settings under which a certificate the API server relies on could end unreplaced,
        or that would reissue on every pass (named by their `serve` flags)."""
        ca, serving = timedelta(days=self.ca_days), timedelta(days=self.serving_days)
        check, overlap = timedelta(seconds=self.check_interval), timedelta(seconds=self.overlap_seconds)
        if self.renew_ca_before >= ca:
            raise ValueError("--renew-ca-before must be shorter than --ca-lifetime (else every new CA "
                             "is rotated at once)")
        if self.renew_serving_before >= min(serving, ca - self.renew_ca_before):
            raise ValueError("--renew-serving-before must be shorter than --serving-cert-lifetime and than "
                             "--ca-lifetime minus --renew-ca-before (else it is reissued on every pass)")
        if self.renew_serving_before <= check:
            raise ValueError("--renew-serving-before must be longer than --cert-check-interval (else the "
                             "serving certificate can end before a check renews it)")
        if self.renew_ca_before <= overlap + check:
            raise ValueError("--renew-ca-before must be longer than --ca-overlap plus --cert-check-interval "
                             "(else the old CA can end before the new one serves)")

    @classmethod
    def from_args(cls, args: Any) -> RotationSettings:
        """From `serve`'s flags (durations in seconds)."""
        return cls(ca_days=args.ca_lifetime / 86400, serving_days=args.serving_cert_lifetime / 86400,
                   renew_serving_before=timedelta(seconds=args.renew_serving_before),
                   renew_ca_before=timedelta(seconds=args.renew_ca_before),
                   overlap_seconds=args.ca_overlap, check_interval=args.cert_check_interval)


@dataclass(slots=True, frozen=True)
class CertPaths:
    cert: Path
    key: Path


@dataclass(slots=True)
class _Material:
    ca_cert: bytes
    ca_key: bytes
    cert: bytes
    key: bytes
    trusted: list[bytes]  # CA certificates the caBundle carries, current first
    next_ca_cert: bytes | None = None
    next_ca_key: bytes | None = None
    annotations: dict[str, str] = field(default_factory=dict)

    def bundle(self) -> str:
        return base64.b64encode(b"".join(self.trusted)).decode()


class CertificateManager:
    def __init__(self, api: ApiClient, namespace: str, secret: str, service: str, webhook_configuration: str,
                 cert_dir: str | Path, settings: RotationSettings | None = None,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC), identity: str | None = None) -> None:
        self.api, self.namespace, self.secret = api, namespace, secret
        self.service, self.webhook_configuration = service, webhook_configuration
        self.cert_dir = Path(cert_dir)
        self.settings = settings or RotationSettings()
        self.clock = clock
        self.identity = identity or f"{socket.gethostname()}-{os.getpid()}"
        self.paths = CertPaths(self.cert_dir / "tls.crt", self.cert_dir / "tls.key")
        self.last_error: str | None = None
        self._resource_version: str | None = None  # of the Secret as last read; None: it does not exist
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- one pass ------------------------------------------------------------------------------
    def reconcile(self) -> bool:
        """One pass: lead if we can, make the Secret right, write our files. True when files exist."""
        try:
            lease_error: ApiError | None = None
            try:
                leading = self._lead()
            except ApiError as exc:  # the Lease refused (RBAC, its namespace): still serve what the Secret has
                leading, lease_error = False, exc
            if leading:
                self._write_secret_state()
            material = self._read_secret()
            if material is not None:
                self._write_files(material)
            if lease_error is not None:
                raise lease_error
            self.last_error = None
        except (ApiError, OSError) as exc:
            if str(exc) != self.last_error:
                log.error("webhook certificate reconcile failed: %s", exc)
            self.last_error = str(exc)
        return self.paths.cert.exists() and self.paths.key.exists()

    def _write_secret_state(self) -> None:
        now = self.clock()
        material = self._read_secret()
        created = self._resource_version is None
        if material is None:
            material = self._fresh()
        material = self._rotate(material, now)
        self._save(material, created)
        self._patch_bundles(material.bundle())

    def _fresh(self) -> _Material:
        ca_cert, ca_key = make_ca(days=self.settings.ca_days)
        cert, key = self._issue(ca_cert, ca_key)
        log.info("created webhook CA and serving certificate in secret %s/%s", self.namespace, self.secret)
        return _Material(ca_cert, ca_key, cert, key, [ca_cert])

    def _issue(self, ca_cert: bytes, ca_key: bytes) -> tuple[bytes, bytes]:
        return make_serving_cert(ca_cert, ca_key, self.service, self.namespace, days=self.settings.serving_days)

    def _rotate(self, m: _Material, now: datetime) -> _Material:
        s = self.settings
        overlap = timedelta(seconds=s.overlap_seconds)
        staged = parse_datetime(m.annotations.get(_STAGED_AT))
        promoted = parse_datetime(m.annotations.get(_PROMOTED_AT))
        if m.next_ca_cert is not None and m.next_ca_key is not None and staged and now - staged >= overlap:
            m.ca_cert, m.ca_key, m.next_ca_cert, m.next_ca_key = m.next_ca_cert, m.next_ca_key, None, None
            m.cert, m.key = self._issue(m.ca_cert, m.ca_key)
            m.trusted = [m.ca_cert, *[c for c in m.trusted if c != m.ca_cert]]
            m.annotations.pop(_STAGED_AT, None)
            m.annotations[_PROMOTED_AT] = now.isoformat()
            log.info("webhook CA rotation: serving certificate now issued by the new CA")
        elif promoted and m.next_ca_cert is None and len(m.trusted) > 1 and now - promoted >= overlap:
            m.trusted = [m.ca_cert]
            m.annotations.pop(_PROMOTED_AT, None)
            log.info("webhook CA rotation: old CA no longer trusted")
        elif m.next_ca_cert is None and not promoted and cert_not_after(m.ca_cert) - now <= s.renew_ca_before:
            m.next_ca_cert, m.next_ca_key = make_ca(days=s.ca_days)
            m.trusted = [m.ca_cert, m.next_ca_cert]
            m.annotations[_STAGED_AT] = now.isoformat()
            log.info("webhook CA rotation: new CA staged, caBundle trusts both")
        if cert_not_after(m.cert) - now <= s.renew_serving_before:
            m.cert, m.key = self._issue(m.ca_cert, m.ca_key)
            log.info("webhook serving certificate renewed")
        return m

    # -- the Secret ----------------------------------------------------------------------------
    def _secret_path(self, name: str | None = None) -> str:
        return f"/api/v1/namespaces/{self.namespace}/secrets" + (f"/{name}" if name else "")

    def _read_secret(self) -> _Material | None:
        secret = get_or_none(self.api, self._secret_path(self.secret), timeout=OBJECT_TIMEOUT)
        if secret is None:
            self._resource_version = None
            return None
        self._resource_version = secret["metadata"].get("resourceVersion")
        data = {k: base64.b64decode(v) for k, v in (secret.get("data") or {}).items()}
        if not all(k in data for k in ("ca.crt", "ca.key", "tls.crt", "tls.key")):
            log.warning("secret %s/%s lacks ca.crt/ca.key/tls.crt/tls.key: making a new CA",
                        self.namespace, self.secret)
            return None
        self._resource_version = secret["metadata"].get("resourceVersion")
        trusted = _split_pem(data.get("ca-bundle.crt") or data["ca.crt"])
        return _Material(data["ca.crt"], data["ca.key"], data["tls.crt"], data["tls.key"], trusted,
                         data.get("next-ca.crt"), data.get("next-ca.key"),
                         dict(secret["metadata"].get("annotations") or {}))

    def _save(self, m: _Material, created: bool) -> None:
        data = {"ca.crt": m.ca_cert, "ca.key": m.ca_key, "tls.crt": m.cert, "tls.key": m.key,
                "ca-bundle.crt": b"".join(m.trusted)}
        if m.next_ca_cert is not None and m.next_ca_key is not None:
            data.update({"next-ca.crt": m.next_ca_cert, "next-ca.key": m.next_ca_key})
        body: dict[str, Any] = {
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": self.secret, "namespace": self.namespace, "annotations": m.annotations,
                         "labels": {"app.kubernetes.io/managed-by": "gpu-placement"}},
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        }
        if created:
            write(self.api, "POST", self._secret_path(), body=body, timeout=OBJECT_TIMEOUT)
        else:
            body["metadata"]["resourceVersion"] = self._resource_version  # lost update -> 409, retried next pass
            write(self.api, "PUT", self._secret_path(self.secret), body=body, timeout=OBJECT_TIMEOUT)

    def _write_files(self, m: _Material) -> None:
        self.cert_dir.mkdir(parents=True, exist_ok=True)
        if self.paths.cert.exists() and self.paths.cert.read_bytes() == m.cert:
            return
        # Key first, then the certificate, each through a rename: a reader never sees half a file.
        for path, content in ((self.paths.key, m.key), (self.paths.cert, m.cert), (self.cert_dir / "ca.crt",
                                                                                   b"".join(m.trusted))):
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(content)
            tmp.chmod(0o600)
            tmp.replace(path)
        log.info("webhook serving certificate written to %s", self.cert_dir)

    def _patch_bundles(self, bundle: str) -> None:
        for kind in ("mutatingwebhookconfigurations", "validatingwebhookconfigurations"):
            path = f"/apis/admissionregistration.k8s.io/v1/{kind}/{self.webhook_configuration}"
            found = get_or_none(self.api, path, timeout=OBJECT_TIMEOUT)
            if found is None:
                log.warning("%s %s not found: nothing to patch", kind, self.webhook_configuration)
                continue
            webhooks = found.get("webhooks") or []
            ops = [{"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle}
                   for i, hook in enumerate(webhooks) if (hook.get("clientConfig") or {}).get("caBundle") != bundle]
            if not ops:
                continue
            write(self.api, "PATCH", path, body=ops, timeout=OBJECT_TIMEOUT, content_type="application/json-patch+json")
            log.info("patched caBundle of %s %s", kind, self.webhook_configuration)

    # -- the Lease -----------------------------------------------------------------------------
    def _lead(self) -> bool:
        """Hold the Lease `<secret>-lock` (coordination.k8s.io/v1): only its holder writes."""
        return Lease(self.api, self.namespace, f"{self.secret}-lock", self.identity, self.settings.lease_seconds,
                     self.clock).acquire()

    # -- running -------------------------------------------------------------------------------
    def start(self, wait_seconds: float = 60.0) -> CertPaths:
        """First pass now (waiting up to `wait_seconds` for the leader to fill the Secret), then one
        pass every `check_interval` in a thread."""
        deadline = time.monotonic() + wait_seconds
        while not self.reconcile():
            if time.monotonic() > deadline:
                raise RuntimeError(f"no webhook certificate after {wait_seconds:.0f} s: "
                                   f"{self.last_error or 'the Secret was not filled'}")
            time.sleep(1.0)

        def loop() -> None:
            while not self._stop.wait(self.settings.check_interval):
                self.reconcile()

        self._thread = threading.Thread(target=loop, name="cert-rotation", daemon=True)
        self._thread.start()
        return self.paths

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _split_pem(blob: bytes) -> list[bytes]:
    marker = b"-----END CERTIFICATE-----"
    return [part.strip() + b"\n" + marker + b"\n" for part in blob.split(marker) if part.strip()]
