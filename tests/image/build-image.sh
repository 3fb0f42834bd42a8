#!/usr/bin/env bash
# Build the project's Dockerfile on a machine with no Docker engine and no registry, and run
# the image. The team's tool, kept here so that CI has it, with four additions: the docker
# image format (OCI drops HEALTHCHECK), the image's size, the image's own HEALTHCHECK command
# run against the exporter started inside it, and a podman storage of its own.
#   STORE=DIR bash tests/image/build-image.sh [TAG]      (from the project root, as root)
# STORE=DIR: podman keeps everything it makes (images, layers, containers, its state) under
# DIR, never in the machine's default storage (/var/lib/containers); the tests give it a
# temporary directory and delete it afterwards. Without STORE: the default storage.
# IIDFILE=path: write the built image's id there, and run that image (not whatever the tag
# names by then: another build may have moved it).
# Needs podman and mmdebstrap (.ci/run installs them); installs nothing itself.
# podman builds with chroot isolation; the python:<ver>-slim-bookworm base the Dockerfile
# names is given by a local stand-in bootstrapped from Debian bookworm (python3 3.11 + venv),
# localhost/gpu-exporter-test/python:3.11-slim-bookworm, passed as a build context: the
# Dockerfile builds unchanged and no name outside localhost/gpu-exporter-test/ is tagged. The
# image cannot be started by crun here (rlimits), so it is run by chroot into its mounted
# root filesystem, as the image's USER, against a sysfs tree of your choice.
set -euo pipefail
TAG=${1:-localhost/gpu-exporter-test/gpu-exporter:local}
SYSFS=${SYSFS:-}   # a fixture machine's sys/ to serve from inside the image (optional)
IIDFILE=${IIDFILE:-}
STORE=${STORE:-}
for tool in podman mmdebstrap; do
  command -v "$tool" >/dev/null || { echo "build-image.sh: $tool is not installed (.ci/run installs it)" >&2; exit 3; }
done
store=()
if [ -n "$STORE" ]; then
  mkdir -p "$STORE/tmp"
  store=(--root "$STORE/storage" --runroot "$STORE/run" --tmpdir "$STORE/libpod" --events-backend none)
  export TMPDIR="$STORE/tmp"  # podman build's scratch space (else /var/tmp)
fi
podman() { command podman "${store[@]}" "$@"; }
FROM_NAME=python:3.11-slim-bookworm  # what the Dockerfile's FROM lines name
STANDIN=localhost/gpu-exporter-test/$FROM_NAME
if ! podman image exists "$STANDIN"; then
  tmp=$(mktemp -d)
  mmdebstrap --mode=root --variant=minbase --include=python3,python3-venv,ca-certificates \
    --customize-hook='ln -s /usr/bin/python3 "$1/usr/local/bin/python"' bookworm "$tmp/base.tar" >/dev/null
  podman import --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    "$tmp/base.tar" "$STANDIN" >/dev/null
  rm -rf "$tmp"
fi
# the host's CA bundle and pip configuration, so pip inside the build reaches the package index
vols=(-v /etc/ssl/certs:/etc/ssl/certs:ro)
[ -f /etc/pip.conf ] && vols+=(-v /etc/pip.conf:/etc/pip.conf:ro)
[ -d /etc/xdg/pip ] && vols+=(-v /etc/xdg/pip:/etc/xdg/pip:ro)
podman build --format docker --isolation=chroot --network=host --pull=never "${vols[@]}" \
  --build-context "$FROM_NAME=container-image://$STANDIN" \
  ${IIDFILE:+--iidfile "$IIDFILE"} -t "$TAG" .
ref=$TAG; [ -n "$IIDFILE" ] && ref=$(cat "$IIDFILE")
cid=$(podman create "$ref"); mnt=$(podman mount "$cid")
user=$(podman image inspect "$ref" --format '{{.Config.User}}')
entry=$(podman image inspect "$ref" --format '{{index .Config.Entrypoint 0}}')
pid=""
# The daemon keeps sysfs attributes open: wait for it to exit before unmounting /host.
trap '[ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; umount "$mnt/proc" "$mnt/host" 2>/dev/null; podman umount "$cid" >/dev/null; podman rm "$cid" >/dev/null 2>&1' EXIT
echo "image $TAG: user $user, entrypoint $entry, size $(podman image inspect "$ref" --format '{{.Size}}') bytes"
echo "healthcheck: $(podman image inspect "$ref" --format '{{json .Config.Healthcheck.Test}}')"
echo "base: $(podman image inspect "$ref" --format '{{index .Config.Labels "org.opencontainers.image.base.name"}}')"
in_image=(chroot --userspec="$user" "$mnt" env PATH=/opt/gpu-exporter/bin:/usr/bin MALLOC_ARENA_MAX=2)
"${in_image[@]}" "$entry" --version
if [ -n "$SYSFS" ]; then
  mkdir -p "$mnt/host" "$mnt/proc"; mount --bind -o ro "$SYSFS" "$mnt/host"; mount -t proc proc "$mnt/proc"
  "${in_image[@]}" "$entry" snapshot --path.sysfs /host --path.procfs /proc --log.level warning
  # The daemon as the image starts it, then the image's HEALTHCHECK command, given the
  # daemon's command line (in a container it reads pid 1's).
  port=${PORT:-19445}
  "${in_image[@]}" "$entry" --path.sysfs /host --path.procfs /proc --web.listen-address "127.0.0.1:$port" >/dev/null 2>&1 &
  pid=$!
  for _ in $(seq 50); do
    "${in_image[@]}" python -m exporter.app.healthcheck "/proc/$pid/cmdline" 2>/dev/null && break
    sleep 0.2
  done
  if "${in_image[@]}" python -m exporter.app.healthcheck "/proc/$pid/cmdline"; then
    echo "healthcheck passed"
  else
    echo "healthcheck failed"
  fi
fi
