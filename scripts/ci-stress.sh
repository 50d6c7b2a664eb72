#!/usr/bin/env bash
# A fresh machine's first CI run, N times: each run clones REF afresh, runs its .ci/run with
# every build and download cache empty (Go's build and module caches, cargo's home and target
# dir, pip's and npm's caches, the helm/promtool tool cache), while CPU hogs keep every core
# busy. Prints each run's wall time and result, and a summary line.
#
#   scripts/ci-stress.sh [-n RUNS] [-j HOGS] [-r REF] [-k]
#
#   -n RUNS  runs, one after another (default 5)
#   -j HOGS  busy-loop processes beside each run (default: one per core, `nproc`)
#   -r REF   what to clone from this repository (default main)
#   -k       keep each run's clone and caches (gigabytes) instead of deleting them
#
# Each run's log is kept in LOGS (default: a new directory beside the temporary one, printed at
# the start), whatever the outcome.
# The caches live in the run's own temporary directory, so the machine's shared caches
# (~/.cache/go-build, ~/go/pkg/mod, ~/.cargo, pip, npm) are neither used nor touched. A cold
# run downloads every Go module, crate and package again (from their ordinary registries) and
# builds the real kube-apiserver from scratch: expect tens of minutes per run on two cores.
# Exit status: 0 when every run passed, 1 otherwise.
set -euo pipefail

runs=5
hogs=$(nproc)
ref=main
keep=false
while getopts "n:j:r:kh" opt; do
    case "$opt" in
        n) runs=$OPTARG ;;
        j) hogs=$OPTARG ;;
        r) ref=$OPTARG ;;
        k) keep=true ;;
        *) sed -n '2,18p' "$0"; exit 2 ;;
    esac
done
for value in "$runs" "$hogs"; do
    if ! [[ "$value" =~ ^[0-9]+$ ]]; then
        echo "ci-stress.sh: -n and -j take a whole number, not '$value'" >&2
        exit 2
    fi
done
repo=$(git -C "$(dirname "$0")/.." rev-parse --show-toplevel)
if ! git -C "$repo" rev-parse --verify --quiet "$ref^{commit}" >/dev/null; then
    echo "ci-stress.sh: -r: no such ref '$ref' in $repo" >&2
    exit 2
fi
base=$(mktemp -d "${TMPDIR:-/tmp}/ci-stress.XXXXXX")
logs=${LOGS:-$base.logs}
mkdir -p "$logs"
hog_pids=()

stop_hogs() {
    for pid in "${hog_pids[@]}"; do
        kill "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    hog_pids=()
}

remove() {
    # Go's module cache is read-only by design: make it writable to delete it.
    chmod -R u+w "$1" 2>/dev/null || true
    rm -rf "$1"
}

cleanup() {
    stop_hogs
    if [ "$keep" = false ]; then
        remove "$base"
    fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

passed=0
echo "ci-stress: $runs run(s) of $ref ($(git -C "$repo" rev-parse --short "$ref")), $hogs CPU hog(s), in $base, logs in $logs"
for run in $(seq 1 "$runs"); do
    dir="$base/run-$run"
    cache="$dir/cache"
    mkdir -p "$cache"
    # --no-local: a real copy, as a CI runner's clone is (no hard links into this repository).
    git clone --quiet --no-local --branch "$ref" "$repo" "$dir/clone" 2>/dev/null \
        || git clone --quiet --no-local "$repo" "$dir/clone"
    git -C "$dir/clone" checkout --quiet "$(git -C "$repo" rev-parse "$ref")"
    for _ in $(seq 1 "$hogs"); do
        bash -c 'while :; do :; done' &
        hog_pids+=("$!")
    done
    started=$(date +%s)
    set +e
    (
        cd "$dir/clone"
        env \
            GOCACHE="$cache/go-build" \
            GOMODCACHE="$cache/go-mod" \
            GOPATH="$cache/go" \
            CARGO_HOME="$cache/cargo" \
            CARGO_TARGET_DIR="$cache/cargo-target" \
            PIP_CACHE_DIR="$cache/pip" \
            npm_config_cache="$cache/npm" \
            XDG_CACHE_HOME="$cache/xdg" \
            bash .ci/run
    ) >"$logs/run-$run.log" 2>&1
    status=$?
    set -e
    took=$(($(date +%s) - started))
    stop_hogs
    summary=$(grep -E '[0-9]+ (passed|failed)' "$logs/run-$run.log" | tail -1)
    if [ "$status" -eq 0 ]; then
        passed=$((passed + 1))
        result="PASS"
    else
        result="FAIL (exit $status)"
    fi
    printf 'run %d/%d: %s in %dm%02ds: %s\n' "$run" "$runs" "$result" $((took / 60)) $((took % 60)) \
        "${summary:-no pytest summary}"
    if [ "$keep" = false ]; then
        remove "$dir"
    fi
done
echo "ci-stress: $passed of $runs run(s) passed"
[ "$passed" -eq "$runs" ]
