#!/usr/bin/env bash
# Install watchproxy with its test dependencies into .venv, lint, type-check and run the tests.
# Extra arguments go to pytest (e.g. `scripts/test.sh -m slow` for the soak and benchmarks).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[test]'
if ! command -v kubectl >/dev/null 2>&1; then
    echo "kubectl not found: the client-go tests need it (apt-get install kubectl, or put it on PATH)" >&2
    exit 1
fi
.venv/bin/ruff check watchproxy tests bench
.venv/bin/ruff format --check watchproxy tests bench
.venv/bin/mypy
.venv/bin/pytest "$@"
