# gpu-placement: the image the Helm chart deploys (charts/gpu-placement).
#
#   docker build -t gpu-placement:0.1.0 .
#
# Two stages: the builder installs the project and its dependencies into a venv; the final image
# gets that venv and nothing else (no pip cache, no build tools, no sources).

FROM python:3.12-slim-bookworm AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1

RUN python -m venv /opt/venv

WORKDIR /src
# Metadata first, then the three packages pyproject.toml ships (gpu_placement, extender, webhook).
COPY pyproject.toml README.md ./
COPY gpu_placement ./gpu_placement
COPY extender ./extender
COPY webhook ./webhook
# A wheel of the project, then an install of it (with its dependencies, all binary wheels) into the venv.
RUN /opt/venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
    && /opt/venv/bin/pip install --no-cache-dir /wheels/*.whl \
    && /opt/venv/bin/python -m compileall -q /opt/venv

FROM python:3.12-slim-bookworm

LABEL org.opencontainers.image.title="gpu-placement" \
      org.opencontainers.image.description="GPU placement for Kubernetes with the NVIDIA GPU Operator: scheduler extender and admission webhook" \
      org.opencontainers.image.version="0.1.0" \
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
