#!/usr/bin/env bash
# Build tests/realapi/bin/kubetestenv-<minor> (e.g. kubetestenv-1.37): a real kube-apiserver and
# etcd in one program, for the realapi test tier, one binary per Kubernetes version.
#
#   bash tests/realapi/build.sh            # the versions the default test run uses (the newest)
#   bash tests/realapi/build.sh 1.34 1.37  # these versions
#   bash tests/realapi/build.sh all        # every version there is a module file for
#
# One source (kubetestenv/main.go), one module file per version: go.mod is the newest, and
# go-<minor>.mod/.sum pin an older release (`go build -modfile`). Modules come from the Go module
# proxy into Go's module cache, objects go to Go's build cache, so only the first build of a
# version is slow (about 15 minutes on two cores); a warm one takes seconds.
# KUBETESTENV_VERSIONS (space-separated), else KUBETESTENV_VERSION (the version the tests will
# start), names the default set instead of the newest only.
set -euo pipefail
cd "$(dirname "$0")"
# The machines install Go in /usr/local/go; a non-login shell may not have it on PATH.
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
    export PATH="$PATH:/usr/local/go/bin"
fi
if ! command -v go >/dev/null 2>&1; then
    echo "tests/realapi/build.sh: go not found (Go >= 1.26 is needed)" >&2
    exit 1
fi
# go.mod and the go-*.mod/.sum files are committed: the build uses them as they are.
export GOFLAGS="${GOFLAGS:-} -mod=readonly"
mkdir -p bin

modfile_of() {
    # The module file that pins Kubernetes $1 (a minor version such as 1.34).
    if [ -f "go-$1.mod" ]; then
        echo "go-$1.mod"
        return
    fi
    local newest
    newest=$(go list -modfile=go.mod -m -f '{{.Version}}' k8s.io/kubernetes)
    newest=${newest#v}
    if [ "${newest%.*}" = "$1" ]; then
        echo "go.mod"
        return
    fi
    echo "tests/realapi/build.sh: no module file for Kubernetes $1" >&2
    return 1
}

version_stamp() {
    # The -ldflags that stamp Kubernetes version $1 (v1.37.2) into a binary. Kubernetes stamps
    # its version with -X at release time; without it /version says "v0.0.0-master+$Format:%H$",
    # which kubectl and client libraries refuse to parse.
    local minor pkg
    minor=${1#v1.}
    minor=${minor%%.*}
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        printf ' -X %s.gitVersion=%s -X %s.gitMajor=1 -X %s.gitMinor=%s' "$pkg" "$1" "$pkg" "$pkg" "$minor"
        printf ' -X %s.gitTreeState=clean -X %s.buildDate=1970-01-01T00:00:00Z' "$pkg" "$pkg"
    done
}

cached() {
    # cached NAME FLAGS OUTPUT INPUT... -- COMMAND...: OUTPUT from tests/buildcache.py's store
    # when INPUTs, FLAGS and the Go version are those of a stored build; else COMMAND, stored.
    local name=$1 flags=$2 output=$3
    shift 3
    local inputs=()
    while [ "$1" != "--" ]; do
        inputs+=("$1")
        shift
    done
    shift
    PYTHONPATH="$(cd ../.. && pwd)" python3 -m tests.buildcache "$name" \
        --salt "$(go version) $flags" --output "$output" --inputs "${inputs[@]}" -- "$@"
}

build_one() {
    local minor=$1 modfile version stamp
    modfile=$(modfile_of "$minor")
    version=$(go list -modfile="$modfile" -m -f '{{.Version}}' k8s.io/kubernetes)
    stamp=$(version_stamp "$version")
    # go build writes the output only when the build succeeds, and leaves an up-to-date one
    # alone; the touch marks it newer than its sources, which is how the tests recognise a
    # stale binary.
    # tests/buildcache.py restores the binary a build of the same inputs made (a fresh
    # clone's link takes seconds even with Go's cache warm).
    cached "kubetestenv-$minor" "-modfile=$modfile -trimpath -s -w$stamp" \
        "bin/kubetestenv-$minor" kubetestenv/main.go "$modfile" "${modfile%.mod}.sum" -- \
        go build -modfile="$modfile" -trimpath -ldflags="-s -w$stamp" \
        -o "bin/kubetestenv-$minor" ./kubetestenv
    touch "bin/kubetestenv-$minor"
}

all_versions() {
    local newest f
    newest=$(go list -modfile=go.mod -m -f '{{.Version}}' k8s.io/kubernetes)
    newest=${newest#v}
    for f in go-*.mod; do
        f=${f#go-}
        echo "${f%.mod}"
    done
    echo "${newest%.*}"
}

if [ $# -eq 0 ]; then
    if [ -n "${KUBETESTENV_VERSIONS:-}" ]; then
        read -r -a versions <<<"$KUBETESTENV_VERSIONS"
    elif [ -n "${KUBETESTENV_VERSION:-}" ]; then
        versions=("$KUBETESTENV_VERSION")
    else
        versions=("$(all_versions | tail -n 1)")
    fi
elif [ "$1" = "all" ]; then
    mapfile -t versions < <(all_versions)
else
    versions=("$@")
fi
for minor in "${versions[@]}"; do
    build_one "$minor"
done

# bin/kubectl.1.<minor>: the kubectl of kubectl/go.mod's release (the newest; no package on the
# machine ships it), beside kubetestenv. Its own module: kubectl's dependencies (kustomize and
# the rest) stay out of the apiserver's. Most of its packages are client-go and apimachinery,
# which the apiserver's build has compiled already: about a minute more on a cold machine.
build_kubectl() {
    local version minor stamp
    version=$(cd kubectl && go list -m -f '{{.Version}}' k8s.io/kubectl)  # v0.37.2
    version="v1.${version#v0.}"
    minor=${version#v1.}
    minor=${minor%%.*}
    stamp=$(version_stamp "$version")
    cached "kubectl.1.$minor" "-trimpath -s -w$stamp" "bin/kubectl.1.$minor" \
        kubectl/main.go kubectl/go.mod kubectl/go.sum -- \
        sh -c "cd kubectl && go build -trimpath -ldflags='-s -w$stamp' -o ../bin/kubectl.1.$minor ."
    touch "bin/kubectl.1.$minor"
}
build_kubectl
