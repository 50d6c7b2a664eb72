#!/usr/bin/env bash
# Build tests/realapi/bin/kubetestenv: a real kube-apiserver and etcd in one program, for the
# realapi test tier. Modules come from the Go module proxy into Go's module cache, objects go to
# Go's build cache, so only the first build is slow (tens of minutes on two cores); a warm one
# takes seconds.
set -euo pipefail
cd "$(dirname "$0")"
# The machines install Go in /usr/local/go; a non-login shell may not have it on PATH.
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
    export PATH="$PATH:/usr/local/go/bin"
fi
if ! command -v go >/dev/null 2>&1; then
    echo "tests/realapi/build.sh: go not found (Go >= 1.25 is needed)" >&2
    exit 1
fi
# go.mod and go.sum are committed: the build uses them as they are.
export GOFLAGS="${GOFLAGS:-} -mod=readonly"
mkdir -p bin
# Kubernetes stamps its version with -X at release time; without it /version says
# "v0.0.0-master+$Format:%H$", which kubectl and client libraries refuse to parse.
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)
minor=${version#v1.}
minor=${minor%%.*}
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    stamp+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
# go build writes the output only when the build succeeds, and leaves an up-to-date one alone;
# the touch marks it newer than its sources, which is how the tests recognise a stale binary.
go build -trimpath -ldflags="-s -w$stamp" -o bin/kubetestenv ./kubetestenv
touch bin/kubetestenv
