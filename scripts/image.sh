#!/usr/bin/env bash
# Build the container image without a registry or a daemon, and run it as a sidecar would.
#
#   scripts/image.sh build                  # base image (mmdebstrap, cached) + the Dockerfile
#   scripts/image.sh size                   # the image's size in bytes
#   scripts/image.sh run SA_DIR -- ARGS...  # run the image: uid 65532, read-only root,
#                                           # SA_DIR mounted as the ServiceAccount, ARGS to watchproxy
#
# Needs root and Debian's buildah, podman and mmdebstrap (apt-get install buildah podman
# mmdebstrap). Everything runs with chroot isolation: an OCI runtime cannot set rlimits on the
# shared development machines, and chroot isolation needs none.
#
# No image registry is reachable from those machines, so the base image is made here: Debian
# bookworm (Python 3.11) by mmdebstrap, from Debian's mirror, passed to the Dockerfile as
# PYTHON_IMAGE. The build itself installs watchproxy's dependencies from PyPI.
#
# Environment: IMAGE (default watchproxy:<version>), KUBERNETES_SERVICE_HOST/PORT for `run`,
# BUILD_CA_BUNDLE: a CA bundle the build's pip must trust (default: $PIP_CERT or $SSL_CERT_FILE,
# where a TLS-inspecting egress proxy sits between the build and PyPI); it is mounted only while
# the build runs and is not part of the image.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

VERSION="$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)"
IMAGE="${IMAGE:-localhost/watchproxy:${VERSION}}"
BASE_PACKAGES="python3,python3-venv,python-is-python3,ca-certificates"
BASE_IMAGE="localhost/watchproxy-base:bookworm-python3.11"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/watchproxy-image"

need() {
    for tool in "$@"; do
        if ! command -v "$tool" >/dev/null 2>&1; then
            echo "scripts/image.sh: $tool not found (apt-get install buildah podman mmdebstrap)" >&2
            exit 2
        fi
    done
}

base_image() {
    # The tarball is keyed by its package list, so changing the list makes a new one.
    local key tarball
    key="$(printf '%s' "$BASE_PACKAGES" | sha256sum | cut -c1-12)"
    tarball="$CACHE/base-bookworm-$key.tar"
    if [ ! -s "$tarball" ]; then
        mkdir -p "$CACHE"
        # Documentation, manual pages and translations are of no use in a sidecar: 40 MB less.
        mmdebstrap --variant=minbase --format=tar --include="$BASE_PACKAGES" \
            --dpkgopt='path-exclude=/usr/share/doc/*' \
            --dpkgopt='path-include=/usr/share/doc/*/copyright' \
            --dpkgopt='path-exclude=/usr/share/man/*' \
            --dpkgopt='path-exclude=/usr/share/locale/*' \
            --dpkgopt='path-exclude=/usr/share/info/*' \
            bookworm "$tarball.partial"
        mv "$tarball.partial" "$tarball"
        podman rmi --force "$BASE_IMAGE" >/dev/null 2>&1 || true
    fi
    if ! podman image exists "$BASE_IMAGE"; then
        podman import --quiet "$tarball" "$BASE_IMAGE" >/dev/null
    fi
}

build() {
    need buildah podman mmdebstrap
    base_image
    local ca="${BUILD_CA_BUNDLE:-${PIP_CERT:-${SSL_CERT_FILE:-}}}" volume=()
    if [ -n "$ca" ] && [ -f "$ca" ]; then
        volume=(--volume "$ca:/etc/ssl/certs/ca-certificates.crt:ro")
    fi
    # --layers: the builder's compiler (apt) is kept from one build to the next.
    buildah bud --quiet --layers --isolation=chroot "${volume[@]}" \
        --build-arg PYTHON_IMAGE="$BASE_IMAGE" --build-arg VERSION="$VERSION" \
        --tag "$IMAGE" . >/dev/null
    echo "$IMAGE $(size) bytes"
}

size() {
    podman image inspect --format '{{.Size}}' "$IMAGE"
}

innermost() {
    local pid="$1" next
    while next="$(ps -o pid= --ppid "$pid" | head -n 1 | tr -d ' ')" && [ -n "$next" ]; do
        pid="$next"
    done
    echo "$pid"
}

run() {
    need buildah
    local sa_dir="$1"
    shift
    [ "${1:-}" = "--" ] && shift
    local mount
    # Globals: the EXIT trap runs after this function has returned.
    container="" tmp=""
    container="$(buildah from --quiet "$IMAGE")"
    # The working container and the /tmp directory go on any way out, a failure included.
    trap 'buildah rm "$container" >/dev/null 2>&1 || true; [ -z "$tmp" ] || rm -rf "$tmp"' EXIT
    mount="$(buildah mount "$container")"
    # buildah creates its mount points (/etc/hosts, /etc/resolv.conf, ...) in the root on the
    # first run, which a read-only /etc would refuse: one run of `true` first.
    buildah run --isolation chroot --volume "$sa_dir:/run/secrets/kubernetes.io/serviceaccount:ro" \
        "$container" -- true
    # A read-only root, as readOnlyRootFilesystem gives in Kubernetes: every directory of the
    # image bound read-only over itself (buildah keeps /dev, /proc, /sys and /run for itself).
    # /tmp is a fresh writable directory, as the manifests' emptyDir.
    local binds=()
    for dir in "$mount"/*; do
        name="$(basename "$dir")"
        case "$name" in dev | proc | sys | run | tmp) continue ;; esac
        [ -L "$dir" ] || binds+=(--volume "$dir:/$name:ro")
    done
    tmp="$(mktemp -d)"
    chmod 1777 "$tmp"
    binds+=(--volume "$tmp:/tmp")
    # /var/run/secrets/... is not honoured under chroot isolation; /run/secrets is the same
    # path inside the image (/var/run links to /run).
    buildah run --isolation chroot --user 65532:65532 "${binds[@]}" \
        --volume "$sa_dir:/run/secrets/kubernetes.io/serviceaccount:ro" \
        --env "KUBERNETES_SERVICE_HOST=${KUBERNETES_SERVICE_HOST:?}" \
        --env "KUBERNETES_SERVICE_PORT=${KUBERNETES_SERVICE_PORT:?}" \
        "$container" -- watchproxy "$@" &
    local child=$!
    # SIGTERM/SIGINT go to the container's command, as the kubelet signals a container's main
    # process: buildah itself ends its chroot child without a signal it can handle. The
    # command is the end of the chain buildah -> buildah-chroot-runtime -> -exec -> watchproxy.
    trap 'kill -TERM "$(innermost "$child")" 2>/dev/null || true' TERM INT
    local status=0
    wait "$child" || status=$?
    if kill -0 "$child" 2>/dev/null; then  # the trap ran: wait for the real exit status
        status=0
        wait "$child" || status=$?
    fi
    return "$status"
}

case "${1:-}" in
    build) build ;;
    size) size ;;
    run)
        shift
        run "$@"
        ;;
    *)
        echo "usage: scripts/image.sh build | size | run SA_DIR -- WATCHPROXY_ARGS..." >&2
        exit 2
        ;;
esac
