"""Reads and writes of a live cluster for `survey` and `migrate`, one call each, no watch.

The survey reads, besides what every command reads (namespaces, nodes, pods, DRA), the objects that
hold workloads' templates and quotas; a kind the API server does not serve (404) or the user may not
read (403) is left out with a note, never a failure: a survey with a blind spot that says so is
worth more than none.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson
import urllib3

from gpu_placement.kube import api as kube
from gpu_placement.view.fetch import ClusterAccess, FetchError

__all__ = ["SURVEY_KINDS", "ApiAnswer", "call", "list_all", "survey_extras"]

# What the survey reads besides fetch_objects: kind, path.
SURVEY_KINDS = (("ResourceQuota", "/api/v1/resourcequotas"), ("Deployment", "/apis/apps/v1/deployments"),
                ("StatefulSet", "/apis/apps/v1/statefulsets"), ("DaemonSet", "/apis/apps/v1/daemonsets"),
                ("Job", "/apis/batch/v1/jobs"), ("CronJob", "/apis/batch/v1/cronjobs"),
                ("ClusterPolicy", "/apis/nvidia.com/v1/clusterpolicies"),
                ("MutatingWebhookConfiguration", "/apis/admissionregistration.k8s.io/v1/mutatingwebhookconfigurations"))


class ApiAnswer:
    """An answer of the API server: its status and decoded body (a Status object for errors)."""

    def __init__(self, status: int, body: Any) -> None:
        self.status = status
        self.body = body if isinstance(body, dict) else {}

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300

    @property
    def message(self) -> str:
        """The Status message, with the causes a refusal carries (an eviction names its budget there)."""
        causes = [str(c.get("message")) for c in (self.body.get("details") or {}).get("causes") or ()
                  if isinstance(c, dict) and c.get("message")]
        text = str(self.body.get("message") or f"HTTP {self.status}")
        return f"{text} ({'; '.join(causes)})" if causes else text


def call(access: ClusterAccess, method: str, path: str, *, query: Sequence[tuple[str, Any]] = (), body: Any = None,
         content_type: str = "application/json") -> ApiAnswer:
    """One request; raises FetchError only when the API server did not answer."""
    try:
        response = kube.request(access.api, method, path, query=list(query), body=body, timeout=kube.COMMAND_TIMEOUT,
                                content_type=content_type)
        try:
            raw = response.read()
        finally:
            response.release_conn()
    except urllib3.exceptions.HTTPError as exc:
        raise FetchError(f"{method} {path} (context {access.context}): the API server did not answer: "
                         f"{' '.join(str(exc).split())[:200]}") from None
    try:
        decoded = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError:
        decoded = {"message": raw[:200].decode("utf-8", "replace")}
    return ApiAnswer(response.status, decoded)


def list_all(access: ClusterAccess, path: str, kind: str, query: Sequence[tuple[str, Any]] = (),
             page_size: int = 500) -> list[dict[str, Any]]:
    """Every object at `path`, paged, each with its `kind`; FetchError (with the status) when refused."""
    objects: list[dict[str, Any]] = []
    token = ""
    while True:
        page_query = [*query, ("limit", page_size), *([("continue", token)] if token else [])]
        answer = call(access, "GET", path, query=page_query)
        if not answer.ok:
            raise FetchError(f"GET {path} (context {access.context}): {answer.message}", answer.status)
        objects.extend({**item, "kind": kind} for item in answer.body.get("items") or () if isinstance(item, dict))
        token = (answer.body.get("metadata") or {}).get("continue") or ""
        if not token:
            return objects


def survey_extras(access: ClusterAccess) -> tuple[list[dict[str, Any]], list[str]]:
    """The survey's extra kinds, and a note for each that could not be read."""
    objects: list[dict[str, Any]] = []
    notes = []
    for kind, path in SURVEY_KINDS:
        try:
            objects.extend(list_all(access, path, kind))
        except FetchError as exc:
            if exc.status not in (403, 404):
                raise
            why = "not served" if exc.status == 404 else "not allowed to list them"
            notes.append(f"{kind}s not read ({why}): the checks that read them ran without them")
    return objects, notes
