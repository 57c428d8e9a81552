"""uvicorn servers as this project runs them, and a thread to run one in (tests, the demo).

`make_server` takes an optional ready `ssl.SSLContext`; gpu_placement/web/tls.py hands it one that reloads
its certificate. `ServerThread` binds the listening socket itself, so port 0 works and the real
port is known before the first request.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import ssl
import threading
import time
from types import TracebackType
from typing import Any

import uvicorn

__all__ = ["ServerThread", "make_server", "run_servers"]

log = logging.getLogger("gpu_placement.serving")


def make_server(app: Any, host: str, port: int, ssl_context: ssl.SSLContext | None = None,
                **uvicorn_kwargs: Any) -> uvicorn.Server:
    """A uvicorn server for app: lifespan on, no access log, logging left to us. With ssl_context it
    serves TLS with exactly that context (uvicorn's `ssl_context_factory` hook, so that uvicorn does
    not build its own from file paths). uvicorn_kwargs override the defaults."""
    # Keep idle connections longer than Go's HTTP clients (the API server calling webhooks,
    # kube-scheduler calling the extender) keep them: 90 s. With uvicorn's default of 5 s a request
    # sent as the server closes the connection fails with EOF, which Go does not retry for a POST;
    # the e2e scale run lost a /mutate that way (failurePolicy Ignore: an unmutated GPU pod).
    options: dict[str, Any] = {"lifespan": "on", "access_log": False, "log_config": None,
                               "timeout_keep_alive": 120}
    if ssl_context is not None:
        options["ssl_context_factory"] = lambda _config, _default: ssl_context
    options.update(uvicorn_kwargs)
    return uvicorn.Server(uvicorn.Config(app, host=host, port=port, **options))


class ServerThread:
    """Runs a uvicorn server in a daemon thread on its own event loop.

    start() binds (port 0: a free port, no race), waits until the server accepts, and raises when it
    cannot start; stop() asks it to exit and joins. Usable as a context manager."""

    def __init__(self, server: uvicorn.Server, start_timeout: float = 10.0, stop_timeout: float = 10.0) -> None:
        self.server = server
        self.start_timeout, self.stop_timeout = start_timeout, stop_timeout
        self._sock: socket.socket | None = None
        self._port: int | None = None
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def host(self) -> str:
        return self.server.config.host

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("the server is not started")
        return self._port

    @property
    def scheme(self) -> str:
        return "https" if self.server.config.is_ssl else "http"

    def url(self, path: str = "/", host: str | None = None) -> str:
        """e.g. url("/healthz", host="localhost") for a certificate issued to localhost."""
        host = host or self.host
        return f"{self.scheme}://{f'[{host}]' if ':' in host else host}:{self.port}{path}"

    def start(self) -> ServerThread:
        if self._thread is not None:
            raise RuntimeError("a ServerThread starts once")
        self._sock = _bind(self.host, self.server.config.port)
        self._port = int(self._sock.getsockname()[1])  # kept: uvicorn closes the socket at shutdown
        self._thread = threading.Thread(target=self._run, name=f"uvicorn-{self.host}:{self.port}", daemon=True)
        self._thread.start()
        if not self._wait_started():
            self.stop()
            raise RuntimeError(f"the server on {self.host}:{self.port} did not start"
                               + (f": {self._error!r}" if self._error else "")) from self._error
        log.info("serving %s on %s:%s", self.scheme, self.host, self.port)
        return self

    def stop(self) -> None:
        thread = self._thread
        if thread is None:
            return
        self.server.should_exit = True
        thread.join(self.stop_timeout)
        if thread.is_alive():  # open connections past the timeout: cut them
            self.server.force_exit = True
            thread.join(self.stop_timeout)
        if self._sock is not None:
            self._sock.close()
        if thread.is_alive():
            raise RuntimeError(f"the server on {self.host} did not stop within {2 * self.stop_timeout:.0f} s")

    def __enter__(self) -> ServerThread:
        return self.start()

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

    def _run(self) -> None:
        try:
            # Server.run picks the configured loop (uvloop under "auto"); signals stay with the main thread.
            self.server.run(sockets=[self._sock] if self._sock else None)
        except BaseException as exc:  # uvicorn reports a failed startup with sys.exit()
            self._error = exc

    def _wait_started(self) -> bool:
        assert self._thread is not None
        deadline = time.monotonic() + self.start_timeout
        pause = 0.002
        while not self.server.started and self._thread.is_alive() and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        return self.server.started


def _bind(host: str, port: int) -> socket.socket:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    return socket.create_server((host, port), family=family, backlog=2048)


def run_servers(servers: list[uvicorn.Server]) -> None:
    """Serve until SIGTERM or SIGINT, which stops them all gracefully: every server in one event loop,
    uvloop's when it is installed (uvicorn[standard] brings it), as uvicorn's own `run` would pick."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvicorn[standard] depends on it on Linux
        asyncio.run(_serve(servers))
    else:
        uvloop.run(_serve(servers))


async def _serve(servers: list[uvicorn.Server]) -> None:
    loop = asyncio.get_running_loop()

    def stop() -> None:
        for server in servers:
            server.should_exit = True

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop)
    await asyncio.gather(*(server.serve() for server in servers))
