"""The Kubernetes API, raw: client configuration, every timing knob of list+watch, and one HTTP call.

The official client does configuration, authentication (kubeconfig, exec plugins, in-cluster
service-account tokens that rotate) and connection pooling; its generated models and `Watch`
helper are not used (docs/live.md). Callers get the urllib3 response unread and parse
the bytes themselves with orjson.

Errors, what to catch:

    KubeConfigError     the kubeconfig or in-cluster config cannot be loaded (at start)
    ApiError            the API server answered with a non-2xx status; `.status`, `.reason`,
     |                  `.message` and `.causes` (each cause's reason) from its `Status` body,
     |                  `.retry_after` seconds or None
     +-- ApiForbidden   403: RBAC, or an admission plugin's refusal (NamespaceTerminating)
     +-- ApiNotFound    404: no such object, or a resource the server does not serve
     +-- ApiConflict    409: AlreadyExists to a create, Conflict to a stale update
     +-- ApiGone        410: a resourceVersion or continue token too old to resume from
    urllib3.exceptions.HTTPError
                        no answer: connection refused, connect or read timeout, stream cut

A status with a class is one some caller settles by catching it (kopf's `APINotFoundError`, ...);
the others (401, 422, 429, 5xx) stay a plain ApiError, read by `.status` where a set of them counts
alike (the watch's backoff, the leader loops' server-wide failures).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple, TypedDict, cast

import orjson
import urllib3
from kubernetes import config as kube_config
from kubernetes.client import ApiClient, Configuration
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

__all__ = ["BIND_TIMEOUT", "COMMAND_TIMEOUT", "LIST_TIMEOUT", "OBJECT_TIMEOUT", "REVIEW_TIMEOUT", "ApiConflict",
           "ApiError", "ApiForbidden", "ApiGone", "ApiNotFound", "KubeConfigError", "Status", "Timeout",
           "WatchSettings", "api_error", "drain", "error_from", "get", "get_or_none", "load_api_client", "request",
           "write"]

log = logging.getLogger("gpu_placement.kube")

Query = Sequence[tuple[str, str | int | bool]]


class Timeout(NamedTuple):
    """How long one API call may wait, in seconds (httpx's `Timeout`): `connect` for the TCP and TLS
    handshake, `read` for each silence while the answer comes. A (connect, read) pair, as urllib3 takes it."""

    connect: float
    read: float


# Every API call outside list+watch (whose timing is WatchSettings') waits by one of these, named for the
# kind of wait, so that each budget and its reason is written once.

# One object read or written off the request path (controllers, Leases, discovery, certificates): the API
# server answers in milliseconds; 15 s of silence is an API server in trouble, and the loop tries again.
OBJECT_TIMEOUT = Timeout(connect=5.0, read=15.0)
# A page of a list in a background loop (a namespace's pods for the quota holds) or a report's list: a
# page of many objects takes the API server longer to produce than one object.
LIST_TIMEOUT = Timeout(connect=5.0, read=30.0)
# A command's reads (explain, nodes, survey, migrate): whole kinds of a large cluster, a person waiting;
# as long as a list page of the watch (WatchSettings.read_timeout).
COMMAND_TIMEOUT = Timeout(connect=5.0, read=60.0)
# A GET on the admission path (a namespace or claim the view lacks yet): the API server's call to the
# webhook waits meanwhile, at most its timeoutSeconds (5 s in the chart), so the answer must come first.
REVIEW_TIMEOUT = Timeout(connect=1.0, read=2.0)
# The extender's Binding POST: inside kube-scheduler's 5 s extender httpTimeout, so that the scheduler
# gets our sentence rather than its own timeout.
BIND_TIMEOUT = Timeout(connect=2.0, read=2.5)


class Status(TypedDict, total=False):
    """`meta/v1` Status: what the API server sends with an error and in watch ERROR events, and what the
    webhook answers a request it cannot read with (webhook/review.py `status_body`)."""

    kind: str
    apiVersion: str
    metadata: dict[str, Any]
    status: Literal["Success", "Failure"]
    message: str
    reason: str  # NotFound, AlreadyExists, Conflict, Forbidden, Expired, Gone, TooManyRequests, ...
    details: dict[str, Any]
    code: int


class KubeConfigError(Exception):
    """The API server's address or credentials cannot be loaded; the message names the file or problem."""


class ApiError(Exception):
    """A non-2xx answer, with the API server's own `Status` message."""

    def __init__(self, status: int, reason: str, message: str, retry_after: float | None = None,
                 causes: tuple[str, ...] = ()) -> None:
        super().__init__(f"HTTP {status} {reason}: {message}" if reason else f"HTTP {status}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.retry_after = retry_after
        self.causes = causes  # details.causes[].reason: NamespaceTerminating, FieldValueInvalid, ...

    def __repr__(self) -> str:
        return f"{type(self).__name__}(status={self.status}, reason={self.reason!r}, message={self.message!r})"

    @staticmethod
    def of(status: int, reason: str, message: str, retry_after: float | None = None,
           causes: tuple[str, ...] = ()) -> ApiError:
        """The error of this status: its own class where it has one (ApiNotFound for 404, ...)."""
        return _BY_STATUS.get(status, ApiError)(status, reason, message, retry_after, causes)


class ApiForbidden(ApiError):
    """403 Forbidden: RBAC refused the call, or an admission plugin did (NamespaceTerminating)."""


class ApiNotFound(ApiError):
    """404 Not Found: no such object (or namespace), or a resource the API server does not serve."""


class ApiConflict(ApiError):
    """409 Conflict: AlreadyExists to a create, or an update or delete whose precondition is stale."""


class ApiGone(ApiError):
    """410 Gone: a resourceVersion or continue token the API server no longer keeps (list again)."""


_BY_STATUS: dict[int, type[ApiError]] = {403: ApiForbidden, 404: ApiNotFound, 409: ApiConflict, 410: ApiGone}


@dataclass(slots=True, frozen=True)
class WatchSettings:
    """Every timing knob of list+watch, in seconds unless named otherwise (kopf's `WatchingSettings`).

    A list request reads with `read_timeout`; a watch asks the server to end the stream after
    `server_timeout` (`timeoutSeconds`) and gives up on a stream silent for `client_timeout`. The
    watch asks for bookmarks, which the API server's watch cache sends about every
    `bookmark_interval` (a minute) even when nothing changes, so a healthy stream is never silent
    longer than that: `client_timeout` of two intervals notices a half-open connection (a node or
    load balancer that dropped it without a reset) within two minutes, not after the whole
    `server_timeout`. Where no bookmarks come (a watch cache turned off), a quiet stream is simply
    resumed from its last resourceVersion each `client_timeout`. Between failed attempts the wait
    grows from `backoff_initial` by `backoff_factor` up to `backoff_max`, each wait varied by +/-
    `backoff_jitter` (a fraction) so that replicas restarted together do not hit the API server in
    step; a `Retry-After` from the server (429, 503) is honoured up to `backoff_max`.
    """

    connect_timeout: float = 5.0  # TCP + TLS handshake with the API server
    read_timeout: float = 60.0  # silence allowed while a list page is being produced
    server_timeout: int = 300  # watch `timeoutSeconds`: the server ends the stream cleanly after this
    bookmark_interval: float = 60.0  # kube-apiserver's watch cache: a BOOKMARK about every minute
    client_timeout: float = 120.0  # silence allowed on a watch stream: two bookmark intervals
    backoff_initial: float = 0.5  # first wait after a failed attempt
    backoff_max: float = 30.0  # the wait never grows past this
    backoff_factor: float = 2.0  # each consecutive failure multiplies the wait by this
    backoff_jitter: float = 0.2  # the wait is varied by up to this fraction either way
    page_size: int = 500  # `limit` of each list page (client-go's reflector uses 500)

    def __post_init__(self) -> None:
        quiet = min(self.bookmark_interval, self.server_timeout)  # the longest silence of a healthy stream
        if self.client_timeout <= quiet:
            raise ValueError(f"client_timeout ({self.client_timeout}) must exceed the bookmark interval "
                             f"({self.bookmark_interval}) or server_timeout ({self.server_timeout}), or every "
                             "quiet watch ends as a timeout")
        if self.page_size < 1 or self.backoff_initial <= 0 or self.backoff_max < self.backoff_initial:
            raise ValueError("page_size >= 1 and 0 < backoff_initial <= backoff_max are required")

    @property
    def list_timeout(self) -> Timeout:
        return Timeout(self.connect_timeout, self.read_timeout)

    @property
    def watch_timeout(self) -> Timeout:
        return Timeout(self.connect_timeout, self.client_timeout)

    def backoff(self, failures: int, rand: float) -> float:
        """The wait before attempt `failures + 1`; `rand` in [0, 1) gives the jitter."""
        base = min(self.backoff_max, self.backoff_initial * self.backoff_factor ** max(0, failures - 1))
        return max(0.0, base * (1 + self.backoff_jitter * (2 * rand - 1)))


def load_api_client(kubeconfig: str | None, context: str | None = None) -> ApiClient:
    """A client for the kubeconfig file when given (its current context, or `context`), else for the
    service account of the pod this runs in. Raises KubeConfigError with a one-line message."""
    configuration = Configuration()
    path = Path(kubeconfig).expanduser() if kubeconfig else None
    where = f"kubeconfig {path}" if path else "in-cluster config"
    if path is not None and not path.is_file():
        raise KubeConfigError(f"{where} does not exist or is not a file: pass --kubeconfig PATH to a readable "
                              "kubeconfig, or leave it out to use the pod's service account")
    try:
        if path is not None:
            kube_config.load_kube_config(config_file=str(path), context=context, client_configuration=configuration,
                                         persist_config=False)  # never rewrite the user's file with refreshed tokens
        else:
            kube_config.load_incluster_config(client_configuration=configuration)
    except ConfigException as exc:
        hint = "" if path else " (not running in a pod? pass --kubeconfig PATH)"
        raise KubeConfigError(f"cannot load {where}: {_one_line(exc)}{hint}") from None
    except Exception as exc:  # PyYAML's errors, unreadable files, exec plugins: no common base class
        raise KubeConfigError(f"cannot load {where}: {type(exc).__name__}: {_one_line(exc)}") from None
    # The callers own retrying: the watch loop backs off, kube-scheduler retries a failed bind. urllib3's
    # own retries would turn one connect timeout into four and hide outages from the metrics.
    configuration.retries = False
    return ApiClient(configuration)


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


def request(api: ApiClient, method: str, path: str, *, query: Query = (), body: Any = None,
            timeout: Timeout, accept: str = "application/json",
            content_type: str = "application/json") -> urllib3.BaseHTTPResponse:
    """One call through the client's auth and connection pool; the response comes back unread,
    whatever its status (see `api_error`). The caller closes it, or reads it to the end.
    `content_type` for PATCH: application/json-patch+json or application/merge-patch+json."""
    headers = {"Accept": accept}
    if body is not None:
        headers["Content-Type"] = content_type
    method_, url, header_params, body_, post_params = api.param_serialize(
        method=method, resource_path=path, query_params=list(query), header_params=headers, body=body,
        auth_settings=["BearerToken"])
    try:
        response = api.call_api(method_, url, header_params=header_params, body=body_, post_params=post_params,
                                _request_timeout=timeout)
    except ApiException as exc:  # the client turns TLS failures into status 0
        raise urllib3.exceptions.SSLError(_one_line(exc)) from None
    raw: urllib3.BaseHTTPResponse = response.response  # the client's RESTResponse wraps urllib3's, unread
    return raw


def drain(response: Any) -> None:
    """Read what is left of a response before its connection goes back to the pool: a connection
    with an unread body breaks the next request made on it."""
    response.read()
    response.release_conn()


def get(api: ApiClient, path: str, *, query: Query = (), timeout: Timeout) -> Any:
    """One GET, its JSON body parsed; a non-2xx answer raises its ApiError (see `api_error`)."""
    response = request(api, "GET", path, query=query, timeout=timeout)
    if response.status >= 300:
        raise api_error(response)
    try:
        return orjson.loads(response.read())
    finally:
        response.release_conn()


def get_or_none(api: ApiClient, path: str, *, timeout: Timeout) -> dict[str, Any] | None:
    """One object, or None when the API server has no such object (404)."""
    try:
        found: dict[str, Any] = get(api, path, timeout=timeout)
    except ApiNotFound:
        return None
    return found


def write(api: ApiClient, method: str, path: str, *, body: Any, timeout: Timeout,
          settled: type[ApiError] | None = None, content_type: str = "application/json") -> bool:
    """One write whose answer is only its status: True when it was made; False when the API server
    answered `settled`, which says what was wanted is there already (ApiConflict to a POST: it exists;
    ApiNotFound to a DELETE: it is gone). Any other error raises. `content_type` as for `request`."""
    response = request(api, method, path, body=body, timeout=timeout, content_type=content_type)
    if response.status < 300:
        drain(response)
        return True
    error = api_error(response)
    if settled is not None and isinstance(error, settled):
        return False
    raise error


def api_error(response: urllib3.BaseHTTPResponse) -> ApiError:
    """The error a non-2xx response stands for; reads and releases the response."""
    try:
        raw = response.read()
    finally:
        response.release_conn()
    return error_from(response.status, response.reason, raw, response.headers.get("Retry-After"))


def error_from(status_code: int, http_reason: str | None, raw: bytes, retry_after: str | None) -> ApiError:
    """The error a non-2xx answer stands for, from its status line, body and `Retry-After` header
    (whichever HTTP client read them)."""
    status: Status = {}
    try:
        parsed = orjson.loads(raw) if raw else {}
        if isinstance(parsed, dict):
            status = cast(Status, parsed)  # the API server's error body: a meta/v1 Status, read with .get
    except orjson.JSONDecodeError:
        pass
    message = status.get("message") or raw[:200].decode("utf-8", "replace").strip() or (http_reason or "")
    details = status.get("details")
    causes = details.get("causes") if isinstance(details, dict) else None
    return ApiError.of(status_code, str(status.get("reason") or http_reason or ""), str(message),
                       _retry_after(retry_after),
                       tuple(str(c.get("reason") or "") for c in causes if isinstance(c, dict))
                       if isinstance(causes, list) else ())


def _retry_after(value: str | None) -> float | None:
    """Seconds from a `Retry-After` header (the API server sends whole seconds; HTTP dates are ignored)."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None
