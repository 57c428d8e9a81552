# gpu-placement: the image the Helm chart deploys (charts/gpu-placement).
#
#   make image                              # docker, else podman; a Debian base made here when no registry answers
#   docker build -t gpu-placement:0.1.0 .   # where a registry is reachable
#
# Two stages: the builder installs the project and its dependencies into a venv and slims it
# (image/slim.py: byte-code only for what the service imports, the asyncio twin of the kubernetes
# client and its aiohttp stack removed); the final image gets that venv and nothing else (no pip, no
# pip cache, no build tools, no sources). BASE must have python3 with venv and CA certificates; both
# stages use it, so the venv's interpreter is the one it was built with.
ARG BASE=python:3.12-slim-bookworm

FROM ${BASE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

# pip lives in its own venv: the service's venv gets none (pip is not needed at run time).
RUN python3 -m venv /opt/pip && python3 -m venv --without-pip /opt/venv

WORKDIR /src
# Metadata first, then the three packages pyproject.toml ships (gpu_placement, extender, webhook).
COPY pyproject.toml README.md ./
COPY gpu_placement ./gpu_placement
COPY extender ./extender
COPY webhook ./webhook
# Behind a TLS-inspecting proxy, `make image` passes the host's CA bundle and pip configuration as
# build secrets: mounted for this step only, never stored in a layer (and optional: plain
# `docker build` goes without). pip trusts the system bundle, which the secret replaces when given.
RUN --mount=type=secret,id=ca-certificates,target=/etc/ssl/certs/ca-certificates.crt \
    --mount=type=secret,id=pip.conf,target=/etc/pip.conf \
    PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    /opt/pip/bin/pip --python /opt/venv/bin/python install --no-cache-dir --no-compile /src

COPY image/slim.py /tmp/slim.py
RUN /opt/pip/bin/python /tmp/slim.py /opt/venv

FROM ${BASE}

ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpu-placement" \
      org.opencontainers.image.description="GPU placement for Kubernetes with the NVIDIA GPU Operator: scheduler extender and admission webhook" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# The root filesystem is read-only in the chart: never write bytecode, never buffer logs.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1

COPY --from=builder /opt/venv /opt/venv

# Not root: the chart's securityContext asks for 65532 too (runAsNonRoot needs a numeric USER).
USER 65532:65532

# 8443: webhook (HTTPS); 8888: extender (HTTP, loopback in the chart).
EXPOSE 8443 8888

ENTRYPOINT ["gpu-placement"]
CMD ["serve"]
