"""A TLS server context whose certificate follows its files, and uvicorn servers that use it.

How the swap works, and why this way: uvicorn's listener keeps the one `SSLContext` it was given.
That context carries an `sni_callback`, which OpenSSL calls early in every handshake (also when
the client sends no server name, e.g. when it dials an IP address). The callback points the
connection at the newest context (`ssl_object.context = newest`), which carries the newest
certificate. A reload builds a whole new context off to the side and swaps one reference, so a
handshake sees the old pair or the new one, never half of each, and a pair that fails to load
never reaches the listener.

The alternative, `load_cert_chain` again on the live context, does reach new handshakes, but it
changes the live context in two steps (certificate, then key) with the GIL released, and when the
key does not match it has already dropped the old key: every later handshake fails. Checked with
OpenSSL 3.0 under asyncio and uvloop; tests/test_tls.py holds the callback to the same standard.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
import time
from datetime import datetime
from types import TracebackType
from typing import Any

import uvicorn

from gpu_placement.web.certs import CertificateError, check_pair
from gpu_placement.web.serving import make_server as _make_server

__all__ = ["ReloadingTLS", "make_server", "new_server_context"]

log = logging.getLogger("gpu_placement.tls")

_Signature = tuple[tuple[int, int, int, int] | None, ...]


def new_server_context() -> ssl.SSLContext:
    """Every context a listener uses comes from here, so every setting is on each of them."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class ReloadingTLS:
    """The serving pair in cert_file/key_file, reloaded for new handshakes when the files change.

    Construction loads the pair and raises CertificateError when it cannot. After that a bad pair
    on disk keeps the current certificate serving; `last_error` says what is wrong until a good
    pair loads. `start()` runs the file check every check_interval seconds in a daemon thread."""

    def __init__(self, cert_file: str | os.PathLike[str], key_file: str | os.PathLike[str],
                 check_interval: float = 1.0) -> None:
        self.cert_file, self.key_file = os.fspath(cert_file), os.fspath(key_file)
        self.check_interval = check_interval
        self.last_error: str | None = None
        self.reloads = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seen = self._signature()  # of the pair last tried, loaded or not
        self._current, self._not_after = self._load()
        self._listener = self._current
        self._listener.sni_callback = self._select
        self._last_check = time.monotonic()

    @property
    def context(self) -> ssl.SSLContext:
        """The context to give the listener, once; it always hands handshakes the newest pair."""
        return self._listener

    @property
    def current_context(self) -> ssl.SSLContext:
        return self._current

    @property
    def not_after(self) -> datetime:
        """When the certificate now served expires (UTC), for the expiry gauge."""
        return self._not_after

    def maybe_reload(self, force: bool = False) -> bool:
        """Stat both files (at most once per check_interval unless force); when they changed, load the
        pair and serve it. True when a new pair is now served."""
        with self._lock:
            now = time.monotonic()
            if not force and now - self._last_check < self.check_interval:
                return False
            self._last_check = now
            signature = self._signature()
            if signature == self._seen:
                return False
            # Remembered before loading: a failed pair is not retried until the files change again,
            # and a change during the load shows as a new signature next time.
            self._seen = signature
            try:
                context, not_after = self._load()
            except CertificateError as exc:
                self.last_error = str(exc)
                log.error("keeping the current TLS certificate (valid until %s): %s", self._not_after, exc)
                return False
            # One reference each; _select reads _current without the lock.
            self._current, self._not_after = context, not_after
            self.last_error = None
            self.reloads += 1
        log.info("TLS certificate reloaded from %s (valid until %s)", self.cert_file, not_after)
        return True

    def start(self) -> ReloadingTLS:
        """Check the files in a daemon thread until stop(). Starting twice is harmless."""
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._watch, name=f"tls-reload-{self.cert_file}", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def __enter__(self) -> ReloadingTLS:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _watch(self) -> None:
        while not self._stop.wait(self.check_interval):
            try:
                self.maybe_reload(force=True)
            except Exception:  # never let the watcher die: the next change must still be seen
                log.exception("TLS certificate check failed")

    def _select(self, ssl_object: ssl.SSLObject | ssl.SSLSocket, _server_name: str | None,
                listener: ssl.SSLContext) -> None:
        current = self._current
        if current is not listener:
            ssl_object.context = current

    def _load(self) -> tuple[ssl.SSLContext, datetime]:
        # cryptography first, for an error that names the file and the problem; OpenSSL's own check in
        # load_cert_chain still guards the pair should the files change in between.
        cert = check_pair(self.cert_file, self.key_file)
        context = new_server_context()
        try:
            context.load_cert_chain(self.cert_file, self.key_file)
        except (ssl.SSLError, OSError) as exc:
            raise CertificateError(f"OpenSSL cannot load {self.cert_file} with {self.key_file}: {exc}.") from exc
        return context, cert.not_valid_after_utc

    def _signature(self) -> _Signature:
        # Device and inode too: Kubernetes updates a mounted Secret by swapping a symlink, and a
        # replaced file can keep its size and (coarse) mtime.
        return tuple(_stat(path) for path in (self.cert_file, self.key_file))


def make_server(app: Any, host: str, port: int, tls: ReloadingTLS | None = None,
                **uvicorn_kwargs: Any) -> uvicorn.Server:
    """A uvicorn server (see gpu_placement.web.serving.make_server), serving TLS through tls when given.
    Reloading needs tls.start() (or maybe_reload calls); the server itself never restarts."""
    return _make_server(app, host, port, ssl_context=tls.context if tls else None, **uvicorn_kwargs)


def _stat(path: str) -> tuple[int, int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns, st.st_size
