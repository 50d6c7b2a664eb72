#!/usr/bin/env bash
# Install watchproxy with its test dependencies into .venv, lint, type-check and run the tests.
# Extra arguments go to pytest (e.g. `scripts/test.sh tests/component/test_hub.py -x -n 0`).
set -euo pipefail
# Each phase's wall time goes to stderr: a cold run (every build from scratch) shows where its
# minutes went.
took() { echo "test.sh: $1 took $((SECONDS - phase_started)) s" >&2; phase_started=$SECONDS; }
phase_started=$SECONDS
EXTRAS=test source "$(dirname "$0")/venv.sh"
took "the venv"
if ! command -v kubectl >/dev/null 2>&1; then
    echo "kubectl not found: the client-go tests need it (apt-get install kubectl, or put it on PATH)" >&2
    exit 1
fi
# helm and promtool for the deploy tests (tests/deploy/tools.py fails when these are set but broken).
source scripts/tools.sh
took "helm and promtool"
.venv/bin/ruff check watchproxy kubefake tests bench setup.py buildsupport
.venv/bin/ruff format --check watchproxy kubefake tests bench setup.py buildsupport
.venv/bin/mypy
.venv/bin/lint-imports
took "lint and type checks"
# The realapi tier runs watchproxy against a real kube-apiserver + etcd built from Go modules:
# the newest supported version (1.37) by default; KUBETESTENV_VERSIONS="1.37 1.34" also builds
# the older one and runs the tier once more on it after the suite (docs/development.md says
# why that is not the default). The first build of a version takes 12-15 minutes on two cores
# (Go's module and build caches keep it); a warm one takes seconds. In CI (CI=true) a failed
# build fails the run; elsewhere the tier is skipped and says why.
if ! bash tests/realapi/build.sh; then
    if [ "${CI:-}" = "true" ]; then
        echo "tests/realapi/build.sh failed and CI=true: the realapi tier cannot run" >&2
        exit 1
    fi
    echo "warning: tests/realapi/build.sh failed: the realapi tier will be skipped" >&2
fi
took "the real apiserver (kubetestenv)"
# The real-node tier (tests/realnode): a single-node Kubernetes 1.37 inside a network namespace
# of its own, where watchproxy runs in pods as users deploy it. As root, Debian's containerd,
# runc, CNI plugins and iptables (kube-proxy's; and buildah, podman and mmdebstrap for the
# images) are installed when missing; tests/realnode/build.sh builds the kubelet, controllers
# and kube-proxy (kubenode, in kubetestenv's module: about 4 minutes cold after kube-apiserver's
# build) and the images (about 4 minutes cold, cached by content). In CI (CI=true) a failure
# here fails the run; elsewhere the tier is skipped and says why.
realnode_packages="containerd runc containernetworking-plugins iptables buildah podman mmdebstrap"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
    && ! { command -v containerd && command -v runc && [ -x /usr/lib/cni/bridge ] \
        && command -v iptables-restore \
        && command -v buildah && command -v podman && command -v mmdebstrap; } >/dev/null 2>&1; then
    echo "installing Debian's $realnode_packages (the real-node tier runs on them)" >&2
    # shellcheck disable=SC2086
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install --yes -qq \
        --no-install-recommends $realnode_packages; } >&2 \
        || echo "warning: could not install $realnode_packages" >&2
fi
if ! bash tests/realnode/build.sh; then
    if [ "${CI:-}" = "true" ]; then
        echo "tests/realnode/build.sh failed and CI=true: the real-node tier cannot run" >&2
        exit 1
    fi
    echo "warning: tests/realnode/build.sh failed: the real-node tier will be skipped" >&2
fi
took "the real node (kubenode, containerd, images)"
# The kube-rs and client-node test programs (tests/clients/{rust,node}): cargo build and npm ci,
# skipped when up to date (cargo's target dir in ~/.cache/watchproxy, node_modules in tests/clients/node).
# Built here, not inside a test: a cold cargo build takes minutes. With CI=true a missing
# cargo, node or npm fails here; elsewhere the tests that need them skip.
.venv/bin/python -m tests.clients.build_rust_node
took "the kube-rs and client-node programs"
# The real-client programs (tests/clients): built here, outside pytest's per-test timeouts, so a
# cold build (client-go from the Go module proxy) shows its own time; a no-op when up to date.
.venv/bin/python -m tests.clients.build
took "the Go client programs"
# The JVM client programs (tests/clients/java: fabric8 kubernetes-client and client-java
# informers): mvn package into one jar each, skipped when up to date (Maven's own repository in
# ~/.m2, its build output in ~/.cache/watchproxy/java-target). With CI=true a missing java or
# mvn fails here; elsewhere the tests that need them skip.
if ! command -v mvn >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "mvn not found: installing Debian's maven (the JVM client tests build with it)" >&2
    apt-get update -qq >&2 && apt-get install --yes -qq --no-install-recommends maven >&2 \
        || echo "warning: could not install maven" >&2
fi
.venv/bin/python -m tests.clients.build_java
took "the JVM client programs"
# Kubernetes' own API e2e specs (k8s.io/kubernetes v1.37.2's test/e2e/apimachinery, auth,
# instrumentation) in a ginkgo program of ours, for the conformance tier
# (tests/realapi/test_conformance.py; CONFORMANCE=full runs all of them). Built with
# kubetestenv's flags, so the packages they share come from Go's build cache; a no-op when up
# to date. Skipped without Go, except with CI=true.
.venv/bin/python -m tests.conformance.build
took "the conformance specs"
# Three workers: most tests wait on loopback sockets and child processes, not on the CPU, so three
# share two cores well (the whole suite: about 7 minutes, 2,844 tests).
# Each worker starts its own session fixtures (the real apiserver among them). A later `-n 0` in
# the arguments runs everything in one process, e.g. to debug one test.
# The delivery-time parity test (tests/realapi/test_delivery_parity.py) times each event through
# watchproxy against the same client direct, to 100 ms at p99: beside the suite's other workers
# the machine's two cores are what it measures (watchproxy's loop waited seconds for a CPU), so
# on a full run it runs alone, after the suite. Arguments that select tests select it as usual.
# The real-node tier runs after it, alone and in one process (-n 0): it starts one node for
# the whole tier, and a second worker would start a second one. To run it by itself:
# `scripts/test.sh tests/realnode -n 0`.
parity=tests/realapi/test_delivery_parity.py
if [ "$#" -eq 0 ]; then
    .venv/bin/pytest -n "${WATCHPROXY_TEST_WORKERS:-3}" --durations=25 --ignore="$parity" --ignore=tests/realnode
    took "the suite"
    .venv/bin/pytest -n 0 -p no:cacheprovider "$parity"
    took "the delivery-time parity test"
    .venv/bin/pytest -n 0 -p no:cacheprovider tests/realnode
    took "the real-node tier"
else
    .venv/bin/pytest -n "${WATCHPROXY_TEST_WORKERS:-3}" "$@"
    took "the suite"
fi
# The compiled tier: the container image runs the modules setup.py compiles with mypyc, and
# compiled code can behave differently from its source (mypyc checks types at run time, and
# compiles some statements its own way), so the tests of the request path run once more
# against a compiled copy of this tree (tests.compiledtree; cached, about 100 s to build when a
# module changed), with the unit tests of the compiled selector and list-option parsers (their
# apiserver parity: mypyc once turned a 422 into a 400 there); the property tests and the
# benchmarks' smoke tests are left out. Only on a full run: arguments that select tests select
# them above only.
# Needs the C compiler Python was built with: without it the tier is skipped and says why
# (with CI=true the build fails instead).
compiler="$(.venv/bin/python -c 'import sysconfig; print((sysconfig.get_config_var("CC") or "cc").split()[0])')"
if [ "$#" -eq 0 ] && ! command -v "$compiler" >/dev/null 2>&1 && [ "${CI:-}" != "true" ]; then
    echo "warning: no C compiler ($compiler): the compiled tier is skipped" >&2
elif [ "$#" -eq 0 ]; then
    tree="$(.venv/bin/python -m tests.compiledtree)"
    took "the compiled build"
    (cd "$tree" && TEST_COMPILED=1 PYTHONPATH="$tree" "$OLDPWD/.venv/bin/pytest" \
        -n "${WATCHPROXY_TEST_WORKERS:-3}" -p no:cacheprovider \
        tests/unit/test_compiled.py tests/unit/test_selectors.py tests/unit/test_watchquery.py \
        tests/e2e tests/component \
        --ignore=tests/component/test_properties.py --ignore=tests/component/test_bench_smoke.py)
    took "the compiled tier"
fi
# The realapi tier again on each other version KUBETESTENV_VERSIONS names (its own arguments:
# the ones above may select other tiers).
newest=$(.venv/bin/python -c "from tests.realapi.fixture import NEWEST; print(NEWEST)")
for version in ${KUBETESTENV_VERSIONS:-}; do
    if [ "$version" != "$newest" ]; then
        echo "realapi tier on kube-apiserver $version"
        KUBETESTENV_VERSION="$version" .venv/bin/pytest -n "${WATCHPROXY_TEST_WORKERS:-3}" \
            -m realapi tests/realapi
    fi
done
