#!/usr/bin/env bash
# Coverage-guided fuzzing (atheris/libFuzzer) of the parsers, 1,000,000 inputs per target by
# default. Not part of scripts/test.sh: the default suite runs the same targets briefly
# (tests/unit/test_fuzz.py). Usage:
#   scripts/fuzz.sh                      # every target, 1,000,000 inputs each
#   FUZZ_RUNS=50000 scripts/fuzz.sh path query
# A finding stops that target with libFuzzer's report; its input is saved in .fuzz/<target>/.
# Exit status: the number of targets with a finding.
set -uo pipefail
EXTRAS=test,fuzz source "$(dirname "$0")/venv.sh"
RUNS="${FUZZ_RUNS:-1000000}"
TIMEOUT="${FUZZ_TIMEOUT:-10}"   # seconds per input before libFuzzer calls it a hang
TARGETS=("$@")
if [ ${#TARGETS[@]} -eq 0 ]; then
    TARGETS=(path label_selector field_selector query request watch_event kubeconfig config)
fi
failed=0
for target in "${TARGETS[@]}"; do
    mkdir -p ".fuzz/$target"
    log=".fuzz/$target/log"
    started=$SECONDS
    if .venv/bin/python -m tests.fuzz.run "$target" -runs="$RUNS" -timeout="$TIMEOUT" \
        -rss_limit_mb=2048 -artifact_prefix=".fuzz/$target/" -print_final_stats=1 >"$log" 2>&1
    then
        done_line=$(grep -E '^Done [0-9]+ runs' "$log" | tail -1)
        echo "$target: ok, ${done_line:-no summary} (${RUNS} requested, $((SECONDS - started)) s)"
    else
        failed=$((failed + 1))
        echo "$target: FINDING (see $log and .fuzz/$target/):"
        grep -E 'Uncaught|Error|ERROR|Traceback' "$log" | head -5 | sed 's/^/    /'
    fi
done
exit "$failed"
