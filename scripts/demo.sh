#!/usr/bin/env bash
# Install watchproxy into .venv and run it in front of an embedded fake apiserver.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet -e '.[demo]'
exec .venv/bin/watchproxy demo "$@"
