"""gpu_placement/web/certs.py: what the CA and serving certificates say, the files, reuse, and the errors users see."""

from __future__ import annotations

import base64
import ipaddress
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from gpu_placement.web.certs import (
    CertificateError,
    cert_not_after,
    check_pair,
    ensure_self_signed,
    make_ca,
    make_serving_cert,
    read_certificate,
    seconds_until_expiry,
    subject_alt_names,
    write_bundle,
)

pytestmark = pytest.mark.timeout(30)

SERVICE_NAMES = ["hook", "hook.gpu", "hook.gpu.svc", "hook.gpu.svc.cluster.local"]


@pytest.fixture(scope="module")
def ca() -> tuple[bytes, bytes]:
    return make_ca()


def load(pem: bytes) -> x509.Certificate:
    return x509.load_pem_x509_certificate(pem)


def ext(cert: x509.Certificate, kind: type[x509.ExtensionType]) -> x509.Extension[x509.ExtensionType]:
    return cert.extensions.get_extension_for_class(kind)


def test_ca_is_a_p256_ca_that_signs_certificates(ca: tuple[bytes, bytes]) -> None:
    cert = load(ca[0])
    constraints = ext(cert, x509.BasicConstraints)
    assert constraints.critical and constraints.value.ca
    usage = ext(cert, x509.KeyUsage)
    assert usage.critical and usage.value.key_cert_sign
    assert isinstance(cert.public_key(), ec.EllipticCurvePublicKey)
    assert cert.public_key().curve.name == "secp256r1"
    assert cert.subject.rfc4514_string() == "CN=gpu-placement-ca"
    cert.verify_directly_issued_by(cert)
    assert timedelta(days=3649) < cert.not_valid_after_utc - datetime.now(UTC) <= timedelta(days=3650)
    assert b"PRIVATE KEY" in ca[1]


def test_serving_cert_names_the_service_and_extras(ca: tuple[bytes, bytes]) -> None:
    pem, key = make_serving_cert(*ca, "hook", "gpu", extra_sans=("hook.example.com", "10.0.0.7", "::1"))
    cert = load(pem)
    sans = ext(cert, x509.SubjectAlternativeName).value
    assert sans.get_values_for_type(x509.DNSName) == [*SERVICE_NAMES, "hook.example.com"]
    assert sans.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7"), ipaddress.ip_address("::1")]
    assert subject_alt_names(pem) == (*SERVICE_NAMES, "hook.example.com", "10.0.0.7", "::1")
    assert not ext(cert, x509.BasicConstraints).value.ca
    assert ext(cert, x509.ExtendedKeyUsage).value == x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH])
    assert cert.public_key().curve.name == "secp256r1"
    cert.verify_directly_issued_by(load(ca[0]))
    assert timedelta(days=364) < cert.not_valid_after_utc - datetime.now(UTC) <= timedelta(days=365)
    assert b"PRIVATE KEY" in key


def test_serving_cert_never_outlives_its_ca() -> None:
    short_ca = make_ca(days=10)
    pem, _ = make_serving_cert(*short_ca, "hook", "gpu", days=365)
    assert cert_not_after(pem) == cert_not_after(short_ca[0])


def test_expiry_helpers(ca: tuple[bytes, bytes]) -> None:
    pem, _ = make_serving_cert(*ca, "hook", "gpu", days=2)
    assert cert_not_after(pem).tzinfo is not None
    assert 2 * 86400 - 60 < seconds_until_expiry(pem) <= 2 * 86400
    assert seconds_until_expiry(pem.decode(), now=datetime.now(UTC) + timedelta(days=3)) < 0


def test_write_bundle_files_modes_and_ca_bundle(tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path / "out", "hook", "gpu")
    assert (bundle.ca_cert.name, bundle.cert.name, bundle.key.name) == ("ca.crt", "tls.crt", "tls.key")
    assert stat.S_IMODE(os.stat(bundle.key).st_mode) == 0o600
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["ca.crt", "tls.crt", "tls.key"]
    assert base64.b64decode(bundle.ca_bundle_b64) == bundle.ca_cert.read_bytes()
    check_pair(bundle.cert, bundle.key).verify_directly_issued_by(read_certificate(bundle.ca_cert))
    assert subject_alt_names(bundle.cert.read_bytes()) == tuple(SERVICE_NAMES)


def test_self_signed_covers_loopback_and_is_reused(tmp_path: Path) -> None:
    first = ensure_self_signed(tmp_path, "hook", "gpu", ("10.1.2.3",))
    assert subject_alt_names(first.cert.read_bytes()) == (*SERVICE_NAMES, "localhost", "10.1.2.3", "127.0.0.1")
    pem = first.cert.read_bytes()
    again = ensure_self_signed(tmp_path, "hook", "gpu", ("10.1.2.3",))
    assert again == first and again.cert.read_bytes() == pem


def test_self_signed_remade_when_names_change(tmp_path: Path) -> None:
    first = ensure_self_signed(tmp_path, "hook", "gpu")
    other = ensure_self_signed(tmp_path, "hook", "gpu", ("hook.example.com",))
    assert other.ca_bundle_b64 != first.ca_bundle_b64
    assert "hook.example.com" in subject_alt_names(other.cert.read_bytes())


def test_self_signed_remade_when_expiring_soon(tmp_path: Path) -> None:
    ca_cert, ca_key = make_ca()
    cert, key = make_serving_cert(ca_cert, ca_key, "hook", "gpu", days=20, extra_sans=("localhost", "127.0.0.1"))
    for name, data in (("ca.crt", ca_cert), ("tls.crt", cert), ("tls.key", key)):
        (tmp_path / name).write_bytes(data)
    bundle = ensure_self_signed(tmp_path, "hook", "gpu")
    assert seconds_until_expiry(bundle.cert.read_bytes()) > 300 * 86400


@pytest.mark.parametrize("broken", ["ca.crt", "tls.crt", "tls.key"])
def test_self_signed_remade_when_a_file_is_bad(tmp_path: Path, broken: str) -> None:
    first = ensure_self_signed(tmp_path, "hook", "gpu")
    (tmp_path / broken).write_bytes(b"garbage")
    second = ensure_self_signed(tmp_path, "hook", "gpu")
    check_pair(second.cert, second.key).verify_directly_issued_by(read_certificate(second.ca_cert))
    assert second.ca_bundle_b64 != first.ca_bundle_b64


def test_self_signed_remade_when_not_issued_by_the_ca(tmp_path: Path) -> None:
    first = ensure_self_signed(tmp_path, "hook", "gpu")
    first.ca_cert.write_bytes(make_ca()[0])  # a stranger's CA next to our pair
    second = ensure_self_signed(tmp_path, "hook", "gpu")
    check_pair(second.cert, second.key).verify_directly_issued_by(read_certificate(second.ca_cert))


def test_errors_name_the_file(tmp_path: Path, ca: tuple[bytes, bytes]) -> None:
    missing = tmp_path / "missing.crt"
    with pytest.raises(CertificateError, match=r"cannot read .*missing\.crt"):
        read_certificate(missing)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(CertificateError, match=r"notes\.txt is not a PEM certificate"):
        read_certificate(text)
    cert, _ = make_serving_cert(*ca, "hook", "gpu")
    (tmp_path / "tls.crt").write_bytes(cert)
    (tmp_path / "tls.key").write_bytes(cert)
    with pytest.raises(CertificateError, match=r"tls\.key is not a PEM private key"):
        check_pair(tmp_path / "tls.crt", tmp_path / "tls.key")
    (tmp_path / "tls.key").write_bytes(make_serving_cert(*ca, "hook", "gpu")[1])
    with pytest.raises(CertificateError, match=r"the key in .*tls\.key does not match the certificate in .*tls\.crt"):
        check_pair(tmp_path / "tls.crt", tmp_path / "tls.key")
    (tmp_path / "cut.crt").write_bytes(cert[: len(cert) // 2] + b"\n-----END CERTIFICATE-----\n")
    with pytest.raises(CertificateError, match=r"cut\.crt holds a PEM certificate that cannot be parsed"):
        read_certificate(tmp_path / "cut.crt")


def test_mismatched_ca_pair_is_refused() -> None:
    (ca_cert, _), (_, other_key) = make_ca(), make_ca()
    with pytest.raises(CertificateError, match="CA key does not match"):
        make_serving_cert(ca_cert, other_key, "hook", "gpu")
    with pytest.raises(CertificateError, match="not a PEM certificate"):
        make_serving_cert(b"nope", other_key, "hook", "gpu")
