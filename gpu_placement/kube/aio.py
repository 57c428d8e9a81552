"""The Kubernetes API from the event loop that serves requests: the `kubernetes` client's configuration
(address, TLS, credentials that rotate), aiohttp's keep-alive connection pool.

For calls made while answering a request (the extender's `/bind`). Made through the synchronous
client instead, each call took a worker thread (Starlette's threadpool: 40) and a connection from a
urllib3 pool the `kubernetes` client sizes at 5 per CPU (10 on two cores); under kube-scheduler's
bursts of asynchronous binds every call past the tenth opened, TLS-handshook and then dropped a
connection of its own, and the threads fought the event loop for the GIL. Here a call is a
coroutine on the loop: no thread, at most `connections` connections, each handshaken once and then
kept (idle ones closed after aiohttp's 15 s, well before the API server's own idle timeout).

Errors, what to catch (see `gpu_placement.kube.api` for ApiError):

    aiohttp.ConnectionTimeoutError   no connection within the connect timeout: nothing was sent
    aiohttp.ClientConnectorError     refused, unreachable, TLS failure: nothing was sent
    aiohttp.ClientError, asyncio.TimeoutError
                                     anything later (read timeout, connection cut): the request may
                                     have reached the API server
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

import aiohttp
from kubernetes.client import ApiClient
from kubernetes.client.configuration import Configuration
from kubernetes.client.rest import is_socks_proxy_url, should_bypass_proxies

from gpu_placement.kube.api import KubeConfigError, Timeout

__all__ = ["Answer", "AsyncApi"]


@dataclass(slots=True, frozen=True)
class Answer:
    status: int
    reason: str | None
    body: bytes
    retry_after: str | None


class AsyncApi:
    """One aiohttp session, opened on first use in the running loop; `aclose()` in that loop."""

    def __init__(self, api: ApiClient, connections: int = 32) -> None:
        config: Configuration = api.configuration
        self.api = api
        self.base = config.host.rstrip("/")
        self.connections = connections
        self._ssl = _ssl_context(config) if self.base.startswith("https:") else None
        self._server_hostname = config.tls_server_name or None
        self._proxy = _proxy(config)
        self._proxy_headers = config.proxy_headers if self._proxy else None
        self._user_agent = api.user_agent
        self._session: aiohttp.ClientSession | None = None

    async def post(self, path: str, body: bytes, timeout: Timeout) -> Answer:
        """POST a JSON body; the answer read in full, whatever its status."""
        session = self._session or self._open()
        connect, read = timeout
        headers = {"Accept": "application/json", "Content-Type": "application/json", "User-Agent": self._user_agent}
        # The client's own auth step: a token read again when the in-cluster file or an exec plugin
        # rotates it; a client certificate is in the TLS context instead.
        self.api.update_params_for_auth(headers, [], ["BearerToken"], path, "POST", None)
        extra: dict[str, Any] = {}
        if self._server_hostname:
            extra["server_hostname"] = self._server_hostname
        async with session.post(self.base + path, data=body, headers=headers, proxy=self._proxy,
                                proxy_headers=self._proxy_headers,
                                timeout=aiohttp.ClientTimeout(total=None, connect=connect, sock_read=read),
                                **extra) as response:
            raw = await response.read()
            return Answer(response.status, response.reason, raw, response.headers.get("Retry-After"))

    def _open(self) -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=self.connections, ssl=self._ssl if self._ssl is not None else False)
        # The proxy is the configuration's (decided above), not the environment's; no cookies.
        self._session = aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar(), trust_env=False)
        return self._session

    async def aclose(self) -> None:
        if self._session is not None:
            session, self._session = self._session, None
            await session.close()


def _ssl_context(config: Configuration) -> ssl.SSLContext:
    """TLS as the synchronous client sets it up: the CA, an optional client certificate, and the
    same switches for verification and host name checking."""
    context = ssl.create_default_context(cafile=config.ssl_ca_cert)
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file)
    if not config.verify_ssl:
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    elif config.assert_hostname is False:
        context.check_hostname = False
    return context


def _proxy(config: Configuration) -> str | None:
    """The proxy the synchronous client would use for this host (its own rule), if any."""
    if not config.proxy or should_bypass_proxies(config.host, config.no_proxy or ""):
        return None
    if is_socks_proxy_url(config.proxy):
        raise KubeConfigError(f"a SOCKS proxy ({config.proxy}) is not supported for calls from the event loop: "
                         "reach the API server directly or through an HTTP proxy")
    return str(config.proxy)
