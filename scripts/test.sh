#!/usr/bin/env bash
# Install watchproxy with its test dependencies into .venv, lint, type-check and run the tests.
# Extra arguments go to pytest (e.g. `scripts/test.sh tests/test_hub.py -x`).
set -euo pipefail
EXTRAS=test source "$(dirname "$0")/venv.sh"
if ! command -v kubectl >/dev/null 2>&1; then
    echo "kubectl not found: the client-go tests need it (apt-get install kubectl, or put it on PATH)" >&2
    exit 1
fi
.venv/bin/ruff check watchproxy tests bench
.venv/bin/ruff format --check watchproxy tests bench
.venv/bin/mypy
# The real-client programs (tests/clients): built here, outside pytest's per-test timeouts, so a
# cold build (client-go from the Go module proxy) shows its own time; a no-op when up to date.
.venv/bin/python -m tests.clients.build
.venv/bin/pytest "$@"
