"""The do-nothing admission webhook: the floor the gpu-placement webhook is measured against.

The same stack as the real webhook, and nothing else: uvicorn (the same `make_server` options, TLS
through the same `ReloadingTLS` context), Starlette routing, the same bounded body reader, orjson
to parse the AdmissionReview and to encode the answer. Every review is allowed, with no patch and
no warning. What gpu-placement spends above this is its own work (parsing the pod, deciding,
patching, its view of the cluster); what both spend is the price of any Python webhook.

Used by `benchmarks/webhook_bench.py` (in-process, pinned to the same CPU as the real one) and by
the e2e side-by-side admission run (`tests/e2e/overhead.py`, as its own process behind a Service):

    python -m tests.floor_webhook --cert-dir DIR --listen 127.0.0.1:PORT
"""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from gpu_placement.web.http import ORJSONResponse, read_body

__all__ = ["create_app", "main"]

MAX_BODY = 3 * 2**20  # as webhook/app.py


def create_app() -> Starlette:
    """POST /mutate and /validate allow everything; GET /count says how many reviews were answered (so
    a run can show the API server really called this webhook)."""
    answered = [0]

    async def allow(request: Request) -> ORJSONResponse:
        review = orjson.loads(await read_body(request, MAX_BODY))
        answered[0] += 1
        return ORJSONResponse({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                               "response": {"uid": review["request"]["uid"], "allowed": True}})

    async def count(_: Request) -> ORJSONResponse:
        return ORJSONResponse({"answered": answered[0]})

    return Starlette(routes=[Route("/mutate", allow, methods=["POST"]), Route("/validate", allow, methods=["POST"]),
                             Route("/count", count)])


def main(argv: list[str] | None = None) -> int:
    from gpu_placement.web.serving import run_servers
    from gpu_placement.web.tls import ReloadingTLS, make_server

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cert-dir", required=True, type=Path, help="holds tls.crt and tls.key")
    parser.add_argument("--listen", required=True, help="HOST:PORT")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    tls = ReloadingTLS(args.cert_dir / "tls.crt", args.cert_dir / "tls.key")
    run_servers([make_server(create_app(), host, int(port), tls=tls)])  # as `gpu-placement serve` runs its own
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
