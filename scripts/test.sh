#!/usr/bin/env bash
# Install watchproxy with its test dependencies into .venv, lint, type-check and run the tests.
# Extra arguments go to pytest (e.g. `scripts/test.sh tests/test_hub.py -x`).
set -euo pipefail
EXTRAS=test source "$(dirname "$0")/venv.sh"
if ! command -v kubectl >/dev/null 2>&1; then
    echo "kubectl not found: the client-go tests need it (apt-get install kubectl, or put it on PATH)" >&2
    exit 1
fi
.venv/bin/ruff check watchproxy kubefake tests bench
.venv/bin/ruff format --check watchproxy kubefake tests bench
.venv/bin/mypy
.venv/bin/lint-imports
# The kube-rs and client-node test programs (tests/clients/{rust,node}): cargo build and npm ci,
# skipped when up to date (cached in tests/clients/rust/target and tests/clients/node/node_modules).
# Built here, not inside a test: a cold cargo build takes minutes. With CI=true a missing
# cargo, node or npm fails here; elsewhere the tests that need them skip.
.venv/bin/python -m tests.clients.build_rust_node
.venv/bin/pytest "$@"
