#!/usr/bin/env bash
# Run watchproxy in front of an embedded fake apiserver (installs .venv on first use only).
set -euo pipefail
EXTRAS=demo source "$(dirname "$0")/venv.sh"
exec .venv/bin/python -m kubefake.demo "$@"
