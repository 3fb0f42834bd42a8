# syntax=docker/dockerfile:1
# gpu-exporter container image.
#
#   docker build -t gpu-exporter .
#   # NVIDIA (NVIDIA container toolkit; "utility" = NVML only):
#   docker run -d --name gpu-exporter -p 9445:9445 --gpus all \
#     -v /sys:/host/sys:ro -v /proc:/host/proc:ro --pid=host \
#     gpu-exporter --path.sysfs=/host/sys --path.procfs=/host/proc
#   # AMD / Intel (sysfs is enough; pass /dev/dri for amdsmi or Level Zero):
#   docker run -d --name gpu-exporter -p 9445:9445 --device /dev/dri \
#     --group-add "$(getent group render | cut -d: -f3)" \
#     -v /sys:/host/sys:ro -v /proc:/host/proc:ro \
#     gpu-exporter --path.sysfs=/host/sys --path.procfs=/host/proc

ARG PYTHON_VERSION=3.11

# ---- build: a wheel of the project and its runtime dependencies in a venv ----
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/gpu-exporter
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# No extras: test tools stay out of the image.
RUN /opt/gpu-exporter/bin/pip install . \
 && find /opt/gpu-exporter -name '__pycache__' -prune -exec rm -rf {} +

# ---- runtime: the venv only, no compiler, no pip cache, no sources ----
FROM python:${PYTHON_VERSION}-slim-bookworm
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="gpu-exporter" \
      org.opencontainers.image.description="Prometheus exporter for NVIDIA, AMD and Intel GPUs, with per-process detail" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="docker.io/library/python:${PYTHON_VERSION}-slim-bookworm"

# A fixed non-root uid/gid, the one the Helm chart and manifests run as.
RUN groupadd --system --gid 10001 gpu-exporter \
 && useradd --system --uid 10001 --gid gpu-exporter --no-create-home \
      --home-dir /nonexistent --shell /usr/sbin/nologin gpu-exporter
COPY --from=build /opt/gpu-exporter /opt/gpu-exporter

# NVIDIA container toolkit: mount every GPU and only the NVML library
# ("utility"), not CUDA; override NVIDIA_VISIBLE_DEVICES to narrow it.
# Logs go to a collector, not a terminal: JSON.
ENV PATH=/opt/gpu-exporter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    GPU_EXPORTER_LOG_FORMAT=json

USER 10001:10001
EXPOSE 9445

# /-/healthy on the port of the first --web.listen-address set through the
# environment (the default :9445). The slim image has no curl, hence Python.
# Behind TLS or basic auth (--web.config.file), override or disable this check.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; port = os.environ.get('GPU_EXPORTER_WEB_LISTEN_ADDRESS', ':9445').split(',')[0].rpartition(':')[2]; urllib.request.urlopen(f'http://127.0.0.1:{port}/-/healthy', timeout=4)"]

ENTRYPOINT ["gpu-exporter"]
