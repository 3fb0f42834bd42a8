# syntax=docker/dockerfile:1
# gpu-exporter container image.
#
#   docker build -t gpu-exporter .
#   # NVIDIA (NVIDIA container toolkit; "utility" = NVML only):
#   docker run -d --name gpu-exporter -p 9445:9445 --gpus all \
#     -v /sys:/host/sys:ro -v /proc:/host/proc:ro --pid=host \
#     gpu-exporter --path.sysfs=/host/sys --path.procfs=/host/proc
#   # AMD / Intel (sysfs and hwmon are enough):
#   docker run -d --name gpu-exporter -p 9445:9445 \
#     -v /sys:/host/sys:ro -v /proc:/host/proc:ro \
#     gpu-exporter --path.sysfs=/host/sys --path.procfs=/host/proc
# podman keeps the HEALTHCHECK only in the docker image format: podman build --format docker.

# Declared before the first FROM so that FROM lines can use it; a stage that uses it
# in its own instructions declares it again (an ARG before FROM is out of scope there).
ARG PYTHON_VERSION=3.11

# ---- build: a wheel of the project and its runtime dependencies in a venv ----
FROM python:${PYTHON_VERSION}-slim-bookworm AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/gpu-exporter
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
# Every extra that needs no library of the host: otlp (--otlp.endpoint) and top
# (`kubectl exec -it <pod> -- gpu-exporter top`). Not amd (ROCm's libamd_smi.so), not test.
RUN /opt/gpu-exporter/bin/pip install '.[otlp,top]' \
 && find /opt/gpu-exporter -name '__pycache__' -prune -exec rm -rf {} +

# ---- runtime: the venv only, no compiler, no pip cache, no sources ----
FROM python:${PYTHON_VERSION}-slim-bookworm
ARG PYTHON_VERSION
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

# AMD marketing names: libdrm's amdgpu.ids (Debian's libdrm-common) and the PCI ids
# database (pci.ids), the fallbacks after the host's own table (docs/vendors-amd.md).
RUN apt-get update \
 && apt-get install -y --no-install-recommends libdrm-common pci.ids \
 && rm -rf /var/lib/apt/lists/*

# NVIDIA container toolkit: mount every GPU and only the NVML library
# ("utility"), not CUDA; override NVIDIA_VISIBLE_DEVICES to narrow it.
# Logs go to a collector, not a terminal: JSON. MALLOC_ARENA_MAX=2: glibc would give
# each collector thread its own malloc arena; two bound the memory they hold.
ENV PATH=/opt/gpu-exporter/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility \
    GPU_EXPORTER_LOG_FORMAT=json \
    MALLOC_ARENA_MAX=2

USER 10001:10001
EXPOSE 9445

# /-/healthy on the first listen address of the running exporter, wherever it was set
# (command line read from /proc/1/cmdline, GPU_EXPORTER_* environment, --config.file);
# HTTPS when its web config has TLS. The probe paths are exempt from basic auth.
HEALTHCHECK --interval=30s --timeout=5s --start-period=15s --retries=3 \
  CMD ["python", "-m", "exporter.app.healthcheck"]

ENTRYPOINT ["gpu-exporter"]
