# Sourced by scripts/test.sh: the command-line tools the deploy tests run, built once from the
# Go module proxy into a cache (no other download site is needed), then exported as HELM and
# PROMTOOL. A cold build takes several minutes per tool on two cores; later runs find the
# binaries in the cache. Set HELM / PROMTOOL yourself to use binaries you already have.
TOOLS_DIR="${WATCHPROXY_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/watchproxy-tools}"
HELM_MODULE=helm.sh/helm/v3/cmd/helm
HELM_VERSION=v3.21.4
# Prometheus' Go module versions are v0.<major><minor>.<patch>: v0.316.0 is Prometheus 3.16.0.
PROMTOOL_MODULE=github.com/prometheus/prometheus/cmd/promtool
PROMTOOL_VERSION=v0.316.0

go_tool() {  # go_tool NAME MODULE VERSION [BUILD TAGS] -> prints the binary's path
    local dir="$TOOLS_DIR/$1-$3"
    if [ ! -x "$dir/$1" ]; then
        if ! command -v go >/dev/null 2>&1; then
            echo "go not found: the deploy tests build $1 with it (install Go, or set ${1^^})" >&2
            return 1
        fi
        echo "building $1 $3 from the Go module proxy into $dir (once)" >&2
        # Stripped: a smaller binary in the cache.
        GOBIN="$dir" go install -tags="${4:-}" -ldflags="-s -w" "$2@$3" >&2
    fi
    echo "$dir/$1"
}

HELM="${HELM:-$(go_tool helm "$HELM_MODULE" "$HELM_VERSION")}"
# remove_all_sd: without Prometheus' service discovery plugins (every cloud's SDK), which
# `promtool check rules` and `test rules` never use: a cold build in 3m46s instead of 9m08s
# (2 cores, busy), 54 MB instead of 88 MB.
PROMTOOL="${PROMTOOL:-$(go_tool promtool "$PROMTOOL_MODULE" "$PROMTOOL_VERSION" remove_all_sd)}"
export HELM PROMTOOL
