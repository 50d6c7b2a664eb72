#!/usr/bin/env bash
# Outage-and-recovery runs for the record: 50 clients (informer-style, tight loops, the official
# Python client, kubernetes_asyncio, kubectl get -w) through watchproxy, a fault-injecting TCP
# proxy between watchproxy and the fake apiserver, a 30 s accept-then-reset outage per run.
# One summary line per run, then a total; exit 1 if any run failed.
#   scripts/faults.sh [--runs 20] [--outage 30] [--clients 50] [--loop uvloop|asyncio]
set -euo pipefail
EXTRAS=test source "$(dirname "$0")/venv.sh"
exec .venv/bin/python -m tests.outage_scenario "$@"
