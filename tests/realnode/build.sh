#!/usr/bin/env bash
# Build what the real-node tier (tests/realnode) needs, outside pytest (scripts/test.sh runs it):
#
# - tests/realnode/bin/kubenode-<minor>: kubelet, kube-controller-manager, kube-scheduler and
#   kube-proxy in one program (tests/realapi/kubenode), built in kubetestenv's module
#   (tests/realapi/go.mod), so that its Kubernetes packages come out of the build cache
#   kubetestenv's build filled: cold, about 4 minutes more on two cores after kube-apiserver's
#   build (kube-proxy's own packages add about 30 s to it); warm, nothing (the binary is up to
#   date) or the link only.
# - the container images, as OCI archives cached by content (python -m tests.realnode.images):
#   watchproxy's (scripts/image.sh: buildah, podman, mmdebstrap; pip installs from PyPI) and
#   the tests' app image (the same Debian base plus kubectl 1.37) and the clients image (the
#   same base plus a client-go informer built static and the Python client).
#
# Needs Go, and for the images root with buildah, podman and mmdebstrap (scripts/test.sh
# installs Debian's packages when it runs as root).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../realapi"
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
    export PATH="$PATH:/usr/local/go/bin"
fi
if ! command -v go >/dev/null 2>&1; then
    echo "tests/realnode/build.sh: go not found (Go >= 1.26 is needed)" >&2
    exit 1
fi
export GOFLAGS="${GOFLAGS:-} -mod=readonly"
version=$(go list -m -f '{{.Version}}' k8s.io/kubernetes)  # v1.37.2
minor=${version#v1.}
minor=${minor%%.*}
# The same version stamp as tests/realapi/build.sh gives kubetestenv: the kubelet reports it
# as the node's kubeletVersion.
stamp=""
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    stamp+=" -X $pkg.gitVersion=$version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    stamp+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done
mkdir -p "$here/bin"
# tests/buildcache.py restores the binary a build of the same inputs made (the link alone
# takes seconds).
PYTHONPATH="$here/../.." python3 -m tests.buildcache "kubenode-1.$minor" \
    --salt "$(go version) -trimpath -s -w$stamp" --output "$here/bin/kubenode-1.$minor" \
    --inputs kubenode/main.go go.mod go.sum -- \
    go build -trimpath -ldflags="-s -w$stamp" -o "$here/bin/kubenode-1.$minor" ./kubenode
touch "$here/bin/kubenode-1.$minor"
cd "$here/../.."
if [ "$(id -u)" != 0 ]; then
    echo "tests/realnode/build.sh: not root: the images are not built (the tier skips)" >&2
    exit 0
fi
.venv/bin/python -m tests.realnode.images >/dev/null
