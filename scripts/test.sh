#!/usr/bin/env bash
# Install watchproxy with its test dependencies into .venv, lint, type-check and run the tests.
# Extra arguments go to pytest (e.g. `scripts/test.sh tests/test_hub.py -x`).
set -euo pipefail
EXTRAS=test source "$(dirname "$0")/venv.sh"
if ! command -v kubectl >/dev/null 2>&1; then
    echo "kubectl not found: the client-go tests need it (apt-get install kubectl, or put it on PATH)" >&2
    exit 1
fi
# helm and promtool for the deploy tests (tests/deploy/tools.py fails when these are set but broken).
source scripts/tools.sh
.venv/bin/ruff check watchproxy kubefake tests bench
.venv/bin/ruff format --check watchproxy kubefake tests bench
.venv/bin/mypy
.venv/bin/lint-imports
.venv/bin/pytest "$@"
