"""Scenario 7: `serve --manage-certs` with lifetimes of seconds, through a full CA rotation (stage,
promote, retire), while GPU pods are created without a pause against the real API server: not one
admission fails, and every pod was mutated (the mutating webhook is failurePolicy Ignore, so a TLS
failure there would pass silently; the admitted annotation shows each /mutate was answered)."""

from __future__ import annotations

import base64
import ssl
import threading
import time
from typing import Any

from cryptography import x509

from tests.e2e.cluster import wait_for
from tests.e2e.conftest import E2E, admitted
from tests.e2e.deploy import NAMESPACE, webhook_port

SECRET = f"/api/v1/namespaces/{NAMESPACE}/secrets/gpu-placement-webhook-tls"
LOCK = f"/apis/coordination.k8s.io/v1/namespaces/{NAMESPACE}/leases/gpu-placement-webhook-tls-lock"
# CA of 60 s rotated 40 s before its end (stage at ~20 s), 8 s between steps: stage, promote and
# retire within ~40 s of the first CA; checks every second.
SHORT = ("--ca-lifetime", "60s", "--renew-ca-before", "40s", "--serving-cert-lifetime", "60s",
         "--renew-serving-before", "10s", "--ca-overlap", "8s", "--cert-check-interval", "1s")


def _fingerprints(pem_blob: bytes) -> list[bytes]:
    return [c.fingerprint(c.signature_hash_algorithm) for c in x509.load_pem_x509_certificates(pem_blob)]  # type: ignore[arg-type]


def _bundle(e2e: E2E, kind: str) -> list[bytes]:
    hooks = e2e.api.get(f"/apis/admissionregistration.k8s.io/v1/{kind}/gpu-placement")["webhooks"]
    bundles = {h["clientConfig"]["caBundle"] for h in hooks}
    assert len(bundles) == 1, "the webhooks of one configuration disagree on the caBundle"
    return _fingerprints(base64.b64decode(bundles.pop()))


def _secret(e2e: E2E) -> dict[str, bytes]:
    return {k: base64.b64decode(v) for k, v in e2e.api.get(SECRET)["data"].items()}


def test_7_full_ca_rotation_under_continuous_creates_loses_no_admission(e2e: E2E) -> None:
    for pod in e2e.webhooks:
        pod.stop()
    e2e.webhooks.clear()
    # A fresh, short-lived CA from the replica started next (the stopped one's Lease would hold it off 60 s).
    _forget_certificates(e2e)
    started = time.monotonic()
    webhook = e2e.start_webhook(0, SHORT)
    try:
        first_ca = _fingerprints(_secret(e2e)["ca.crt"])
        wait_for("caBundle trusting the first CA",
                 lambda: all(_bundle(e2e, k) == first_ca for k in ("mutatingwebhookconfigurations",
                                                                   "validatingwebhookconfigurations")), timeout=15)
        ns = e2e.namespace("rotation")
        failures: list[str] = []
        created: list[str] = []
        stop = threading.Event()

        def create(thread: int) -> None:
            i = 0
            while not stop.is_set():
                name = f"p{thread}-{i}"
                i += 1
                try:
                    r = e2e.gpu_pod(ns, name, "rotation-none")  # no such nodes: created, never scheduled
                except Exception as exc:  # every failure counts, whatever it is
                    failures.append(f"{name}: {exc!r}")
                    continue
                if r.status_code != 201:
                    failures.append(f"{name}: {r.status_code} {r.text[:300]}")
                else:
                    created.append(name)

        creators = [threading.Thread(target=create, args=(n,), daemon=True) for n in range(2)]
        for t in creators:
            t.start()
        steps: dict[str, float] = {}
        served: set[bytes] = set()
        port = webhook_port(webhook, e2e.docs)
        try:
            def trusted() -> list[bytes]:
                kinds = ("mutatingwebhookconfigurations", "validatingwebhookconfigurations")
                mutating, validating = (_bundle(e2e, k) for k in kinds)
                if mutating != validating:  # read between the writer's two patches (one, then the other)
                    return []
                pem = ssl.get_server_certificate(("127.0.0.1", port)).encode()
                served.add(_fingerprints(pem)[0])
                return mutating

            staged = wait_for("a new CA staged (caBundle trusts two)", lambda: len(trusted()) == 2 and trusted(),
                              timeout=45, interval=0.2)
            steps["stage"] = time.monotonic() - started
            assert staged[0] == first_ca[0], "the old CA stays first while staged"
            new_ca = staged[1]

            def promoted() -> bool:
                secret = _secret(e2e)
                issuer = x509.load_pem_x509_certificate(secret["tls.crt"]).issuer
                return _fingerprints(secret["ca.crt"]) == [new_ca] and issuer == x509.load_pem_x509_certificate(
                    secret["ca.crt"]).subject and len(trusted()) == 2

            wait_for("the serving certificate issued by the new CA", promoted, timeout=30, interval=0.2)
            steps["promote"] = time.monotonic() - started
            new_cert = _fingerprints(_secret(e2e)["tls.crt"])[0]
            wait_for("the webhook serving the new certificate", lambda: trusted() and new_cert in served,
                     timeout=10, interval=0.2)
            wait_for("the old CA retired (caBundle trusts the new CA alone)",
                     lambda: trusted() == [new_ca], timeout=30, interval=0.2)
            steps["retire"] = time.monotonic() - started
            time.sleep(3)  # creates keep going against the new CA alone
        finally:
            stop.set()
            for t in creators:
                t.join(timeout=30)
        print(f"\nscenario 7: stage {steps.get('stage', 0):.1f} s, promote {steps.get('promote', 0):.1f} s, "
              f"retire {steps.get('retire', 0):.1f} s after start; {len(created)} pods created, "
              f"{len(failures)} failures; {len(served)} serving certificates seen")
        assert failures == []
        assert len(created) >= 50, "too few creates to say admission held through the rotation"
        assert len(served) >= 2, "the webhook never served a reissued certificate"
        unmutated = [p["metadata"]["name"] for p in e2e.api.get(f"/api/v1/namespaces/{ns}/pods")["items"]
                     if not _is_admitted(p)]
        assert unmutated == [], "pods created without /mutate (its failure is ignored by policy)"
        e2e.api.http.delete(f"/api/v1/namespaces/{ns}")
    finally:
        # Back to the chart's lifetimes for the tests that follow: a fresh CA from a webhook with defaults.
        webhook.stop()
        e2e.webhooks.clear()
        _forget_certificates(e2e)
        e2e.start_webhook(0)
        wait_for("caBundle back on a long-lived CA", lambda: _bundle(e2e, "validatingwebhookconfigurations")
                 == _fingerprints(_secret(e2e)["ca.crt"]), timeout=30)


def _forget_certificates(e2e: E2E) -> None:
    for path in (SECRET, LOCK):
        assert e2e.api.http.delete(path).status_code in (200, 404), path


def _is_admitted(pod: dict[str, Any]) -> bool:
    try:
        return bool(admitted(pod))
    except (KeyError, ValueError):
        return False
