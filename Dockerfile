# syntax=docker/dockerfile:1
#
# watchproxy container image.
#   docker build -t watchproxy:0.2.0 --build-arg VERSION=0.2.0 .
#   scripts/image.sh build     # without a daemon or a registry: buildah, a base made by mmdebstrap
#
# Builder and runtime use the same base image so the virtualenv copied from one to the other
# finds its interpreter at the same path (the base image's python3.11).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1

# The per-request modules setup.py names (the API port's protocol and handler, the upstream
# client, the limiter, the list-option and selector parsers, the LIST services, the metrics) are
# compiled with mypyc (WATCHPROXY_COMPILE=1 below): less CPU per request (bench/README.md,
# "mypyc re-scoped after the rewrites").
# That needs a C compiler and Python's headers here, in the builder only: the runtime stage gets
# the compiled modules, not the compiler. (The official python images carry the headers of
# their own Python; Debian's python3 needs python3-dev for them.) Not pinned (DL3008): Debian's
# security updates replace these versions in the mirror, which would break a pinned build, and
# nothing of the compiler ships; its output is checked below.
# hadolint ignore=DL3008
RUN include="$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')" \
    && headers="$([ -e "$include/Python.h" ] || echo python3-dev)" \
    && apt-get update \
    && apt-get install --yes --no-install-recommends gcc libc6-dev ${headers:+"$headers"} \
    && rm -rf /var/lib/apt/lists/*

# Every dependency (aiohttp, uvloop, prometheus-client, pyyaml) and every build requirement
# (setuptools, mypy) ships manylinux wheels for CPython 3.11; --only-binary=:all: makes that a
# guarantee instead of a silent source build (the local project itself is still built, by
# setuptools, with mypyc). The build fails unless the modules came out compiled and the whole
# application imports.
# pip and setuptools leave the venv afterwards: nothing at run time installs packages.
RUN python -m venv /opt/venv

WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE constraints.txt ./
COPY buildsupport/ ./buildsupport/
COPY watchproxy/ ./watchproxy/
# constraints.txt: the runtime stack known to own its sockets (watchproxy/upstream/pool.py).
# PIP_CONSTRAINT, not -c: the build environment (where mypyc reads the dependencies' types)
# gets the same versions as the venv that runs them.
RUN WATCHPROXY_COMPILE=1 PIP_CONSTRAINT=constraints.txt \
        /opt/venv/bin/pip install --no-cache-dir --only-binary=:all: . \
    && /opt/venv/bin/python -I -c 'import watchproxy.app, watchproxy.server.protocol as m; assert m.__file__.endswith(".so"), m.__file__' \
    && /opt/venv/bin/pip uninstall --yes pip setuptools \
    && /opt/venv/bin/watchproxy --help > /dev/null

FROM ${PYTHON_IMAGE}

ARG PYTHON_IMAGE
ARG VERSION=0.2.0
LABEL org.opencontainers.image.title="watchproxy" \
      org.opencontainers.image.description="Sidecar proxy for the Kubernetes API that shares identical watches, rate-limits and backs off upstream" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"

# PYTHONDONTWRITEBYTECODE: the root filesystem is read-only in Kubernetes; pip already compiled
# the .pyc files at build time. PYTHONUNBUFFERED: log lines reach `kubectl logs` at once.
# WATCHPROXY_CONFIG points at the default config shipped below, so the image starts as is;
# mounting a ConfigMap over /etc/watchproxy (or setting WATCHPROXY_CONFIG) replaces it.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    WATCHPROXY_CONFIG=/etc/watchproxy/config.yaml

COPY --from=builder /opt/venv /opt/venv
# config.example.yaml spells out every default, so this file changes nothing but makes the
# default path exist.
COPY config.example.yaml /etc/watchproxy/config.yaml

# Numeric, so that Kubernetes' runAsNonRoot can verify it; 65532 is the "nonroot" uid of
# distroless images and matches runAsUser in deploy/.
USER 65532:65532

# 8001: Kubernetes API for programs in the same pod, bound to 127.0.0.1 by default.
# 8081: /healthz, /readyz, /metrics, /debug/watches on all addresses.
EXPOSE 8001 8081

# No HEALTHCHECK: Kubernetes ignores it (the kubelet runs the probes in deploy/), the OCI image
# format has no such field, and the image has no curl. Under plain Docker, probe
# http://<container>:8081/healthz from outside.
#
# watchproxy is PID 1 and handles SIGTERM itself (graceful shutdown); it starts no child
# processes, so no init process is needed to reap zombies.
ENTRYPOINT ["watchproxy"]
CMD ["run"]
