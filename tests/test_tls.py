"""gpu_placement/web/tls.py and gpu_placement/web/serving.py over real sockets: real handshakes, clients that trust
only the generated CA, and certificates replaced on disk under a running server."""

from __future__ import annotations

import http.client
import logging
import os
import socket
import ssl
import threading
import warnings
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from gpu_placement.web.certs import CertBundle, CertificateError, cert_not_after, write_bundle
from gpu_placement.web.serving import ServerThread
from gpu_placement.web.tls import ReloadingTLS, make_server
from tests.support.waiting import wait_for

pytestmark = pytest.mark.timeout(30)

NAMES = ("localhost", "127.0.0.1")
SERVICE_NAMES = ["hook", "hook.gpu", "hook.gpu.svc", "hook.gpu.svc.cluster.local", "localhost"]


async def healthz(_request: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


APP = Starlette(routes=[Route("/healthz", healthz)])


# -- helpers ---------------------------------------------------------------------------------------

def trusting(bundle: CertBundle) -> ssl.SSLContext:
    """A client context that trusts the bundle's CA and nothing else (no system roots)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_verify_locations(cafile=str(bundle.ca_cert))
    assert len(context.get_ca_certs()) == 1
    return context


def handshake(port: int, context: ssl.SSLContext, host: str = "localhost") -> ssl.SSLSocket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    try:
        return context.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


def served_der(port: int) -> bytes:
    """The certificate the server presents now, trusted or not."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with handshake(port, context) as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


def der_of(bundle: CertBundle) -> bytes:
    return ssl.PEM_cert_to_DER_cert(bundle.cert.read_text())


def replace_pair(live: CertBundle, new: CertBundle) -> None:
    """As a Secret update or cert-manager would: each file replaced whole, the key first."""
    os.replace(new.key, live.key)
    os.replace(new.cert, live.cert)


def old_client(max_version: ssl.TLSVersion) -> ssl.SSLContext:
    """A client that offers nothing newer than max_version (SECLEVEL=0: OpenSSL 3 would not even try)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        context.minimum_version = ssl.TLSVersion.TLSv1
        context.maximum_version = max_version
    context.set_ciphers("DEFAULT:@SECLEVEL=0")
    return context


def in_memory_handshake(client: ssl.SSLContext, server: ssl.SSLContext) -> str | None:
    """A handshake through memory BIOs: proves what the client can do, without our server."""
    c_in, c_out, s_in, s_out = (ssl.MemoryBIO() for _ in range(4))
    c = client.wrap_bio(c_in, c_out, server_hostname="localhost")
    s = server.wrap_bio(s_in, s_out, server_side=True)
    for _ in range(10):
        done = 0
        for side in (c, s):
            try:
                side.do_handshake()
                done += 1
            except ssl.SSLWantReadError:
                pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if done == 2:
            return c.version()
    return None


@pytest.fixture(autouse=True)
def no_threads_left() -> Iterator[None]:
    before = set(threading.enumerate())
    yield
    left = [t for t in threading.enumerate() if t not in before and t.is_alive()]
    assert left == []


@pytest.fixture
def live(tmp_path: Path) -> CertBundle:
    return write_bundle(tmp_path / "live", "hook", "gpu", NAMES)


@contextmanager
def tls_server(bundle: CertBundle, loop: str = "auto", interval: float = 0.02) -> Iterator[tuple[ServerThread,
                                                                                               ReloadingTLS]]:
    tls = ReloadingTLS(bundle.cert, bundle.key, check_interval=interval)
    with tls, ServerThread(make_server(APP, "127.0.0.1", 0, tls=tls, loop=loop)) as server:
        yield server, tls


@pytest.fixture
def served(live: CertBundle) -> Iterator[tuple[ServerThread, ReloadingTLS]]:
    with tls_server(live) as pair:
        yield pair


# -- serving ---------------------------------------------------------------------------------------

def test_https_trusting_only_the_generated_ca(live: CertBundle, served: tuple[ServerThread, ReloadingTLS]) -> None:
    server, _ = served
    with httpx.Client(verify=trusting(live), timeout=5) as client:
        response = client.get(server.url("/healthz", host="localhost"))
    assert (response.status_code, response.text) == (200, "ok")
    with handshake(server.port, trusting(live), host="127.0.0.1") as tls:  # IP SAN, and no SNI sent
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
    with pytest.raises(ssl.SSLCertVerificationError, match="Hostname mismatch"):
        handshake(server.port, trusting(live), host="elsewhere.example")
    system_roots = ssl.create_default_context()
    with pytest.raises(ssl.SSLCertVerificationError):
        handshake(server.port, system_roots)


def test_served_certificate_names(live: CertBundle, served: tuple[ServerThread, ReloadingTLS]) -> None:
    server, tls = served
    with handshake(server.port, trusting(live)) as conn:
        peer = conn.getpeercert()
    assert peer["subjectAltName"] == (*(("DNS", n) for n in SERVICE_NAMES), ("IP Address", "127.0.0.1"))
    assert tls.not_after == cert_not_after(live.cert.read_bytes())


@pytest.mark.parametrize("version", ["TLSv1", "TLSv1_1"])
def test_tls_older_than_1_2_refused(live: CertBundle, served: tuple[ServerThread, ReloadingTLS],
                                    version: str) -> None:
    server, _ = served
    client = old_client(ssl.TLSVersion[version])
    permissive = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    permissive.load_cert_chain(live.cert, live.key)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        permissive.minimum_version = ssl.TLSVersion.TLSv1
    permissive.set_ciphers("DEFAULT:@SECLEVEL=0")
    assert in_memory_handshake(client, permissive) == version.replace("_", ".")  # the client can speak it
    with pytest.raises(ssl.SSLError):
        handshake(server.port, client).close()
    with handshake(server.port, old_client(ssl.TLSVersion.TLSv1_2)) as tls:
        assert tls.version() == "TLSv1.2"


# -- reloading -------------------------------------------------------------------------------------

@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_replaced_certificate_served_without_restart(tmp_path: Path, live: CertBundle, loop: str) -> None:
    if loop == "uvloop":
        pytest.importorskip("uvloop")
    old_trust = trusting(live)
    with tls_server(live, loop=loop) as (server, tls):
        kept = http.client.HTTPSConnection("localhost", server.port, context=old_trust, timeout=5)
        kept.request("GET", "/healthz")
        assert kept.getresponse().read() == b"ok"
        new = write_bundle(tmp_path / "next", "hook", "gpu", NAMES)
        new_trust, new_der = trusting(new), der_of(new)
        replace_pair(live, new)

        wait_for(lambda: served_der(server.port) == new_der)
        for host in NAMES:  # with SNI (a name) and without (an IP address)
            with handshake(server.port, new_trust, host=host) as conn:
                assert conn.getpeercert(binary_form=True) == new_der
            with pytest.raises(ssl.SSLCertVerificationError):
                handshake(server.port, old_trust, host=host)
        kept.request("GET", "/healthz")  # the connection made before the swap lives on
        assert kept.getresponse().read() == b"ok"
        kept.close()
        assert tls.not_after == cert_not_after(live.cert.read_bytes())
        assert tls.reloads >= 1 and tls.last_error is None  # 2 if a check fell between the two replaces


def test_bad_replacement_keeps_the_old_certificate(tmp_path: Path, live: CertBundle,
                                                   served: tuple[ServerThread, ReloadingTLS],
                                                   caplog: pytest.LogCaptureFixture) -> None:
    server, tls = served
    caplog.set_level(logging.ERROR, logger="gpu_placement.tls")
    old_der, old_not_after = der_of(live), tls.not_after

    live.cert.write_bytes(b"-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n")
    wait_for(lambda: tls.last_error is not None)
    assert str(live.cert) in (tls.last_error or "")
    assert served_der(server.port) == old_der
    with handshake(server.port, trusting(live)):
        pass
    assert tls.not_after == old_not_after and tls.reloads == 0
    assert any(str(live.cert) in r.getMessage() and r.name == "gpu_placement.tls" for r in caplog.records)

    other = write_bundle(tmp_path / "other", "hook", "gpu", NAMES)
    os.replace(other.key, live.key)  # a key that belongs to a certificate we do not have
    live.cert.write_text(ssl.DER_cert_to_PEM_cert(old_der))
    wait_for(lambda: "does not match" in (tls.last_error or ""))
    assert served_der(server.port) == old_der

    os.replace(other.cert, live.cert)  # the pair is whole again
    wait_for(lambda: tls.last_error is None)
    assert served_der(server.port) == der_of(live) != old_der
    assert tls.reloads == 1


def test_reload_checks_at_most_once_per_interval(tmp_path: Path, live: CertBundle) -> None:
    tls = ReloadingTLS(live.cert, live.key, check_interval=3600)
    assert tls.current_context is tls.context
    replace_pair(live, write_bundle(tmp_path / "next", "hook", "gpu", NAMES))
    assert tls.maybe_reload() is False  # within the interval: not even a stat
    assert tls.maybe_reload(force=True) is True
    assert tls.current_context is not tls.context  # the listener's context stays; handshakes are pointed on
    assert tls.context.minimum_version == tls.current_context.minimum_version == ssl.TLSVersion.TLSv1_2
    assert tls.maybe_reload(force=True) is False  # nothing changed since


def test_construction_errors_name_the_files(tmp_path: Path, live: CertBundle) -> None:
    with pytest.raises(CertificateError, match=r"cannot read .*absent\.crt"):
        ReloadingTLS(tmp_path / "absent.crt", live.key)
    other = write_bundle(tmp_path / "other", "hook", "gpu")
    with pytest.raises(CertificateError, match=rf"the key in {other.key} does not match the certificate in"):
        ReloadingTLS(live.cert, other.key)


def test_watcher_starts_once_and_stops(live: CertBundle) -> None:
    tls = ReloadingTLS(live.cert, live.key, check_interval=0.01)
    tls.start()
    thread = tls._thread
    assert tls.start()._thread is thread and thread is not None and thread.daemon
    tls.stop()
    assert not thread.is_alive()


# -- plain servers and the thread helper -----------------------------------------------------------

def test_plain_server_on_a_free_port() -> None:
    server = ServerThread(make_server(APP, "127.0.0.1", 0))
    with server:
        assert server.port > 0 and server.url("/healthz").startswith("http://127.0.0.1:")
        assert httpx.get(server.url("/healthz"), timeout=5).text == "ok"
        thread = server._thread
    assert thread is not None and not thread.is_alive()
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.url("/healthz"), timeout=1)


def test_failed_start_is_reported() -> None:
    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        raise RuntimeError("no database")
        yield

    with pytest.raises(RuntimeError, match="did not start"):
        ServerThread(make_server(Starlette(lifespan=lifespan), "127.0.0.1", 0), start_timeout=5).start()
