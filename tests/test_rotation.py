"""`serve --manage-certs`: the CA and serving pair in a Secret, the caBundle of both webhook
configurations, rotation with overlap, and the Lease that lets one replica write. Against the fake
API server through the real client."""

from __future__ import annotations

import base64
import ssl
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.exceptions import InvalidSignature

from gpu_placement.web.certs import cert_not_after, subject_alt_names
from tests.fakeapi import FakeApiServer
from tests.support.serve import CONFIG, NS, SECRET, SERVICE, webhook_configurations
from webhook.rotation import CertificateManager, RotationSettings

# Certificates are issued against the wall clock; the managers' clock starts there and moves ahead.
START = datetime.now(UTC)
# A CA of two years renewed in its last 400 days, serving certificates of a year renewed in their
# last 30: moving the clock 332 days ahead enters the CA's window while the serving pair is fine.
SETTINGS = RotationSettings(ca_days=730, serving_days=365, renew_ca_before=timedelta(days=400),
                            renew_serving_before=timedelta(days=30), lease_seconds=30, overlap_seconds=600)


def bundles(api: FakeApiServer) -> set[str]:
    found = set()
    for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
        obj = api.get(kind, CONFIG)
        assert obj is not None
        found.update(hook["clientConfig"].get("caBundle", "") for hook in obj["webhooks"])
    return found


def trusted_by(bundle_b64: str, cert_pem: bytes) -> bool:
    """Would an API server holding this caBundle accept this serving certificate?"""
    cert = x509.load_pem_x509_certificate(cert_pem)
    for ca in x509.load_pem_x509_certificates(base64.b64decode(bundle_b64)):
        try:
            cert.verify_directly_issued_by(ca)
            return True
        except (ValueError, TypeError, InvalidSignature):  # not this CA
            continue
    return False


@pytest.fixture
def clock() -> list[datetime]:
    return [START]


def manager(api: FakeApiServer, tmp_path: Path, clock: list[datetime], identity: str,
            settings: RotationSettings | None = None) -> CertificateManager:
    return CertificateManager(api.api_client(), NS, SECRET, SERVICE, CONFIG, tmp_path / identity,
                              settings or SETTINGS,
                              clock=lambda: clock[0], identity=identity)


def test_first_replica_creates_secret_patches_both_bundles_and_writes_files(
        fake_api: FakeApiServer, tmp_path: Path, clock: list[datetime]) -> None:
    webhook_configurations(fake_api)
    first = manager(fake_api, tmp_path, clock, "replica-a")
    assert first.reconcile(), first.last_error
    secret = fake_api.get("Secret", SECRET, NS)
    assert secret is not None and set(secret["data"]) >= {"ca.crt", "ca.key", "tls.crt", "tls.key", "ca-bundle.crt"}
    (bundle,) = bundles(fake_api)  # all three webhooks, in both configurations, trust the same CA
    cert = first.paths.cert.read_bytes()
    assert trusted_by(bundle, cert)
    assert set(subject_alt_names(cert)) >= {SERVICE, f"{SERVICE}.{NS}", f"{SERVICE}.{NS}.svc",
                                            f"{SERVICE}.{NS}.svc.cluster.local"}
    ssl.create_default_context().load_cert_chain(first.paths.cert, first.paths.key)  # a usable pair
    assert (first.paths.key.stat().st_mode & 0o777) == 0o600

    # A second replica does not lead while the lease is held; it serves the same pair.
    second = manager(fake_api, tmp_path, clock, "replica-b")
    assert second.reconcile()
    assert second.paths.cert.read_bytes() == cert
    lease = fake_api.get("Lease", f"{SECRET}-lock", NS)
    assert lease is not None and lease["spec"]["holderIdentity"] == "replica-a"
    version = fake_api.get("Secret", SECRET, NS)["metadata"]["resourceVersion"]  # type: ignore[index]
    second.reconcile()
    assert fake_api.get("Secret", SECRET, NS)["metadata"]["resourceVersion"] == version  # type: ignore[index]


def test_serving_certificate_renewed_before_expiry_by_the_same_ca(
        fake_api: FakeApiServer, tmp_path: Path, clock: list[datetime]) -> None:
    webhook_configurations(fake_api)
    leader = manager(fake_api, tmp_path, clock, "replica-a",
                     RotationSettings(renew_ca_before=timedelta(days=30), lease_seconds=30))  # a young CA
    leader.reconcile()
    old_cert = leader.paths.cert.read_bytes()
    (bundle,) = bundles(fake_api)
    leader.reconcile()
    assert leader.paths.cert.read_bytes() == old_cert  # far from expiry: kept
    clock[0] = cert_not_after(old_cert) - timedelta(days=10)  # inside the 30-day renewal window
    leader.reconcile()
    new_cert = leader.paths.cert.read_bytes()
    assert new_cert != old_cert
    assert bundles(fake_api) == {bundle}  # same CA: the caBundle does not move
    assert trusted_by(bundle, new_cert)


def test_ca_rotation_never_serves_an_untrusted_certificate(
        fake_api: FakeApiServer, tmp_path: Path, clock: list[datetime]) -> None:
    webhook_configurations(fake_api)
    leader = manager(fake_api, tmp_path, clock, "replica-a")
    leader.reconcile()
    (first_bundle,) = bundles(fake_api)
    ca_end = cert_not_after(base64.b64decode(first_bundle))
    seen = []

    def step(at: datetime) -> tuple[str, bytes]:
        clock[0] = at
        assert leader.reconcile(), leader.last_error
        (bundle,) = bundles(fake_api)
        cert = leader.paths.cert.read_bytes()
        assert trusted_by(bundle, cert), f"at {at}: the served certificate is not in the caBundle"
        seen.append(len(x509.load_pem_x509_certificates(base64.b64decode(bundle))))
        return bundle, cert

    near = START + timedelta(days=332)
    assert ca_end - near < SETTINGS.renew_ca_before
    _, staged_cert = step(near)  # 1. stage: trust both, keep serving the old pair
    assert seen[-1] == 2
    step(near + timedelta(seconds=60))  # before the overlap: nothing moves yet
    assert leader.paths.cert.read_bytes() == staged_cert
    _, promoted_cert = step(near + timedelta(seconds=700))  # 2. promote: new pair from the new CA
    assert promoted_cert != staged_cert and seen[-1] == 2
    assert not trusted_by(first_bundle, promoted_cert)
    final_bundle, _ = step(near + timedelta(seconds=1400))  # 3. retire: the new CA alone
    assert seen[-1] == 1 and final_bundle != first_bundle
    assert trusted_by(final_bundle, promoted_cert)  # the CA kept is the one that issued what is served


def test_lease_passes_to_another_replica_when_the_holder_stops(
        fake_api: FakeApiServer, tmp_path: Path, clock: list[datetime]) -> None:
    webhook_configurations(fake_api)
    a = manager(fake_api, tmp_path, clock, "replica-a")
    b = manager(fake_api, tmp_path, clock, "replica-b")
    a.reconcile()
    clock[0] += timedelta(seconds=31)  # a stopped renewing: its 30 s lease is over
    fake_api.delete("Secret", SECRET, NS)  # and something must be written
    assert b.reconcile(), b.last_error
    lease = fake_api.get("Lease", f"{SECRET}-lock", NS)
    assert lease is not None and lease["spec"]["holderIdentity"] == "replica-b"
    assert fake_api.get("Secret", SECRET, NS) is not None


def test_api_errors_are_reported_not_raised(fake_api: FakeApiServer, tmp_path: Path, clock: list[datetime]) -> None:
    webhook_configurations(fake_api)
    leader = manager(fake_api, tmp_path, clock, "replica-a")
    fake_api.fail_next(1, 403)
    assert not leader.reconcile()
    assert leader.last_error is not None and "403" in leader.last_error
    assert leader.reconcile(), leader.last_error  # the next pass recovers
    assert leader.last_error is None


def _flags(**overrides: float) -> object:
    from types import SimpleNamespace

    days = 86400.0
    return SimpleNamespace(**{"ca_lifetime": 3650 * days, "renew_ca_before": 365 * days,
                              "serving_cert_lifetime": 365 * days, "renew_serving_before": 30 * days,
                              "ca_overlap": 600.0, "cert_check_interval": 60.0, **overrides})


def test_settings_from_serve_flags_in_seconds() -> None:
    settings = RotationSettings.from_args(_flags(ca_lifetime=60, renew_ca_before=40, serving_cert_lifetime=60,
                                                 renew_serving_before=10, ca_overlap=8, cert_check_interval=1))
    assert timedelta(days=settings.ca_days) == timedelta(seconds=60)
    assert timedelta(days=settings.serving_days) == timedelta(seconds=60)
    assert (settings.renew_ca_before, settings.renew_serving_before) == (timedelta(seconds=40), timedelta(seconds=10))
    assert (settings.overlap_seconds, settings.check_interval) == (8, 1)
    assert RotationSettings.from_args(_flags()) == RotationSettings()  # the flags' defaults are the old ones


@pytest.mark.parametrize(("overrides", "message"), [
    ({"renew_ca_before": 3650 * 86400.0}, "--renew-ca-before must be shorter than --ca-lifetime"),
    ({"renew_serving_before": 365 * 86400.0}, "--renew-serving-before must be shorter than --serving-cert-lifetime"),
    ({"ca_lifetime": 100.0, "renew_ca_before": 50.0, "renew_serving_before": 60.0, "ca_overlap": 10.0,
      "cert_check_interval": 1.0}, "and than --ca-lifetime minus --renew-ca-before"),
    ({"cert_check_interval": 30 * 86400.0}, "--renew-serving-before must be longer than --cert-check-interval"),
    ({"ca_overlap": 365 * 86400.0}, "--renew-ca-before must be longer than --ca-overlap plus --cert-check-interval"),
])
def test_settings_that_could_let_a_certificate_lapse_are_refused(overrides: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RotationSettings.from_args(_flags(**overrides))


def test_certificates_of_seconds(tmp_path: Path) -> None:
    """Lifetimes under a day (what the e2e rotation uses) reach the certificates."""
    from gpu_placement.web.certs import make_ca, make_serving_cert

    ca, key = make_ca(days=60 / 86400)
    cert, _ = make_serving_cert(ca, key, SERVICE, NS, days=30 / 86400)
    now = datetime.now(UTC)
    assert timedelta(seconds=55) < cert_not_after(ca) - now <= timedelta(seconds=60)
    assert timedelta(seconds=25) < cert_not_after(cert) - now <= timedelta(seconds=30)


def test_a_refused_lease_is_reported_and_the_secret_still_served(
        fake_api: FakeApiServer, tmp_path: Path, clock: list[datetime]) -> None:
    """A Lease the API server refuses to create (RBAC edited) is an error, not another replica leading
    (gpu_placement/kube/lease.py): said in last_error, while the pair already in the Secret is still served."""
    webhook_configurations(fake_api)
    assert manager(fake_api, tmp_path, clock, "replica-a").reconcile()
    fake_api.delete("Lease", f"{SECRET}-lock", NS)
    fake_api.fail_next(1, 403, method="POST", path=f"/apis/coordination.k8s.io/v1/namespaces/{NS}/leases")
    follower = manager(fake_api, tmp_path, clock, "replica-b")
    assert follower.reconcile()  # the files, from the Secret
    assert follower.last_error is not None and follower.last_error.startswith(
        f"HTTP 403 Forbidden: Lease {NS}/{SECRET}-lock: ")
