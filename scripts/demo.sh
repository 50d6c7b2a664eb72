#!/usr/bin/env bash
# Install watchproxy into .venv and run it in front of an embedded fake apiserver.
set -euo pipefail
EXTRAS=demo source "$(dirname "$0")/venv.sh"
exec .venv/bin/watchproxy-demo "$@"
