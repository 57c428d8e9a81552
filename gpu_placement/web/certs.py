"""Webhook certificates: a CA, a serving certificate for the in-cluster Service names, the files a
TLS listener reads, and the expiry helpers that rotation and the expiry gauge use.

Keys are ECDSA P-256: small, fast to make, and accepted by every Kubernetes API server.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import os
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

__all__ = [
    "CA_CERT_FILE",
    "CERT_FILE",
    "KEY_FILE",
    "LOCAL_SANS",
    "CertBundle",
    "CertificateError",
    "cert_not_after",
    "check_pair",
    "ensure_self_signed",
    "make_ca",
    "make_serving_cert",
    "read_certificate",
    "read_private_key",
    "seconds_until_expiry",
    "serving_sans",
    "subject_alt_names",
    "write_bundle",
]

log = logging.getLogger("gpu_placement.certs")

CA_CERT_FILE, CERT_FILE, KEY_FILE = "ca.crt", "tls.crt", "tls.key"
# `serve --self-signed` and the demo are reached on the loopback too, not only through the Service.
LOCAL_SANS = ("localhost", "127.0.0.1")
RENEW_BEFORE = timedelta(days=30)
_BACKDATE = timedelta(minutes=5)  # tolerate clocks a little behind ours


class CertificateError(Exception):
    """A certificate or key the user gave (or we found on disk) cannot be used; the message says which and why."""


@dataclass(slots=True, frozen=True)
class CertBundle:
    ca_cert: Path
    cert: Path
    key: Path
    ca_bundle_b64: str  # what a webhook configuration's clientConfig.caBundle takes


# -- making ----------------------------------------------------------------------------------------

def make_ca(common_name: str = "gpu-placement-ca", days: float = 3650) -> tuple[bytes, bytes]:
    """A self-signed CA that may sign serving certificates only (pathlen 0). Returns (cert PEM, key PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
    now = _now()
    cert = (
        _builder(name, name, key.public_key(), now - _BACKDATE, now + timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_key_usage(digital_signature=True, key_cert_sign=True, crl_sign=True), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def make_serving_cert(ca_cert_pem: bytes, ca_key_pem: bytes, service: str, namespace: str, days: float = 365,
                      extra_sans: Iterable[str] = ()) -> tuple[bytes, bytes]:
    """A serving certificate for `service` in `namespace`, signed by the CA. Returns (cert PEM, key PEM).

    It never outlives its CA: a longer `days` is cut to the CA's own end."""
    ca = _parse_cert(ca_cert_pem, "the CA certificate")
    ca_key = _parse_key(ca_key_pem, "the CA key")
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CertificateError("the CA key is neither an ECDSA nor an RSA key.")
    if not _same_public_key(ca, ca_key):
        raise CertificateError("the CA key does not match the CA certificate.")
    key = ec.generate_private_key(ec.SECP256R1())
    sans = serving_sans(service, namespace, extra_sans)
    now = _now()
    not_after = min(now + timedelta(days=days), ca.not_valid_after_utc)
    cert = (
        _builder(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, sans[2])]), ca.subject, key.public_key(),
                 now - _BACKDATE, not_after)
        .add_extension(x509.SubjectAlternativeName([_general_name(s) for s in sans]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_key_usage(digital_signature=True), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return _cert_pem(cert), _key_pem(key)


def serving_sans(service: str, namespace: str, extra_sans: Iterable[str] = ()) -> tuple[str, ...]:
    """The names a Service is reached by, then the extras; duplicates dropped, order kept."""
    if not service or not namespace:
        raise ValueError("a serving certificate needs a service name and a namespace")
    names = (service, f"{service}.{namespace}", f"{service}.{namespace}.svc",
             f"{service}.{namespace}.svc.cluster.local", *extra_sans)
    return tuple(dict.fromkeys(_normal_san(n) for n in names if n))


# -- files -----------------------------------------------------------------------------------------

def write_bundle(out_dir: str | os.PathLike[str], service: str, namespace: str,
                 extra_sans: Iterable[str] = ()) -> CertBundle:
    """A new CA and serving pair in out_dir as ca.crt, tls.crt, tls.key (the key 0600).

    The CA key is not written: nothing here reissues from it, and a CA key on disk is one more
    secret to guard. A new bundle means a new CA, hence a new caBundle."""
    ca_cert, ca_key = make_ca()
    cert, key = make_serving_cert(ca_cert, ca_key, service, namespace, extra_sans=extra_sans)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    # Key before certificate, each replaced atomically: a reader never sees a half-written file.
    _write_atomic(out / KEY_FILE, key, 0o600)
    _write_atomic(out / CERT_FILE, cert, 0o644)
    _write_atomic(out / CA_CERT_FILE, ca_cert, 0o644)
    return _bundle(out, ca_cert)


def ensure_self_signed(directory: str | os.PathLike[str], service: str, namespace: str,
                       extra_sans: Iterable[str] = ()) -> CertBundle:
    """The bundle in directory when it is still good (valid over 30 more days, issued by its CA, the key
    matching, the SANs exactly the wanted ones), otherwise a new one written there.

    The SANs always include localhost and 127.0.0.1: self-signed certificates serve local runs."""
    directory = Path(directory)
    extra = (*extra_sans, *LOCAL_SANS)
    reason = _not_reusable(directory, serving_sans(service, namespace, extra))
    if reason is None:
        log.info("reusing the self-signed certificate in %s", directory)
        return _bundle(directory, (directory / CA_CERT_FILE).read_bytes())
    log.info("making a self-signed certificate in %s: %s", directory, reason)
    return write_bundle(directory, service, namespace, extra)


def read_certificate(path: str | os.PathLike[str]) -> x509.Certificate:
    """The first certificate in a PEM file (a chain starts with the leaf)."""
    return _parse_cert(_read(path), str(path))


def read_private_key(path: str | os.PathLike[str]) -> PrivateKeyTypes:
    return _parse_key(_read(path), str(path))


def check_pair(cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str]) -> x509.Certificate:
    """The certificate in cert_file, once it is known to be readable PEM with key_file its matching key."""
    cert, key = read_certificate(cert_file), read_private_key(key_file)
    if not _same_public_key(cert, key):
        raise CertificateError(f"the key in {key_file} does not match the certificate in {cert_file}.")
    return cert


# -- expiry and names ------------------------------------------------------------------------------

def cert_not_after(pem: bytes | str) -> datetime:
    """When the (first) certificate in pem expires, timezone-aware UTC."""
    return _parse_cert(_as_bytes(pem), "the certificate").not_valid_after_utc


def seconds_until_expiry(pem: bytes | str, now: datetime | None = None) -> float:
    """Negative once expired."""
    return (cert_not_after(pem) - (now or _now())).total_seconds()


def subject_alt_names(pem: bytes | str) -> tuple[str, ...]:
    """DNS names, then IP addresses (as text), the certificate is valid for."""
    return _sans_of(_parse_cert(_as_bytes(pem), "the certificate"))


# -- internals -------------------------------------------------------------------------------------

def _now() -> datetime:
    return datetime.now(UTC)


def _builder(subject: x509.Name, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, not_before: datetime,
             not_after: datetime) -> x509.CertificateBuilder:
    return (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer).public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(not_before).not_valid_after(not_after)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key), critical=False))


def _key_usage(*, digital_signature: bool = False, key_cert_sign: bool = False, crl_sign: bool = False,
               ) -> x509.KeyUsage:
    return x509.KeyUsage(digital_signature=digital_signature, content_commitment=False, key_encipherment=False,
                         data_encipherment=False, key_agreement=False, key_cert_sign=key_cert_sign,
                         crl_sign=crl_sign, encipher_only=False, decipher_only=False)


def _normal_san(name: str) -> str:
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name.lower()


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _sans_of(cert: x509.Certificate) -> tuple[str, ...]:
    try:
        ext = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return ()
    return tuple([*ext.get_values_for_type(x509.DNSName), *map(str, ext.get_values_for_type(x509.IPAddress))])


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _as_bytes(pem: bytes | str) -> bytes:
    return pem.encode() if isinstance(pem, str) else pem


def _read(path: str | os.PathLike[str]) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise CertificateError(f"cannot read {path}: {exc.strerror or exc}.") from exc


def _parse_cert(data: bytes, what: str) -> x509.Certificate:
    if b"-----BEGIN CERTIFICATE-----" not in data:
        raise CertificateError(f"{what} is not a PEM certificate (no BEGIN CERTIFICATE line).")
    try:
        return x509.load_pem_x509_certificate(data)
    except ValueError as exc:
        raise CertificateError(f"{what} holds a PEM certificate that cannot be parsed: {exc}.") from exc


def _parse_key(data: bytes, what: str) -> PrivateKeyTypes:
    if b"PRIVATE KEY-----" not in data:
        raise CertificateError(f"{what} is not a PEM private key (no BEGIN ... PRIVATE KEY line).")
    try:
        return serialization.load_pem_private_key(data, password=None)
    except TypeError as exc:  # encrypted: we have no password to give
        raise CertificateError(f"{what} is an encrypted private key; give it unencrypted.") from exc
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise CertificateError(f"{what} holds a PEM private key that cannot be parsed: {exc}.") from exc


def _same_public_key(cert: x509.Certificate, key: PrivateKeyTypes) -> bool:
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    return cert.public_key().public_bytes(*spki) == key.public_key().public_bytes(*spki)


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")  # created 0600
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _bundle(directory: Path, ca_cert_pem: bytes) -> CertBundle:
    return CertBundle(directory / CA_CERT_FILE, directory / CERT_FILE, directory / KEY_FILE,
                      base64.b64encode(ca_cert_pem).decode("ascii"))


def _not_reusable(directory: Path, wanted_sans: tuple[str, ...]) -> str | None:
    """Why the bundle in directory cannot be reused, or None when it can."""
    try:
        ca = read_certificate(directory / CA_CERT_FILE)
        cert = check_pair(directory / CERT_FILE, directory / KEY_FILE)
    except CertificateError as exc:
        return str(exc)
    renew_at = _now() + RENEW_BEFORE
    if min(ca.not_valid_after_utc, cert.not_valid_after_utc) <= renew_at:
        return "it expires within 30 days"
    try:
        cert.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        return f"{directory / CERT_FILE} was not issued by {directory / CA_CERT_FILE}"
    have = {_normal_san(s) for s in _sans_of(cert)}
    if have != set(wanted_sans):
        return f"its names {sorted(have)} are not the wanted {sorted(wanted_sans)}"
    return None
