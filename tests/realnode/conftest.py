"""The ``node`` fixture (one real single-node cluster for the session; tests/realnode/node.py)
and per-test namespaces with Pod Security ``restricted`` enforced.

The tier runs in one pytest process (scripts/test.sh runs it with ``-n 0`` after the suite): a
second worker would start a second node. Outside CI it skips, and says why, when this machine
cannot run a node (not root, containerd/runc/CNI plugins missing, a binary or an image archive
not built); with CI=true that fails the run instead.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.realapi.fixture import ci_requires_tier
from tests.realnode import images
from tests.realnode.cluster import Cluster
from tests.realnode.node import Node, environment_problem, running_node

TEARDOWN_TEST = "test_teardown_leaves_nothing_on_the_machine"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # The teardown test ends the session's node: it runs after every other test of the tier.
    last = [i for i in items if i.name == TEARDOWN_TEST]
    if last:
        items[:] = [i for i in items if i.name != TEARDOWN_TEST] + last


def host_links() -> set[str]:
    """The machine's own interfaces and addresses (name, kind, address), to compare."""
    out = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout
    names = {line.split(":")[1].strip().split("@")[0] for line in links.splitlines()}
    addresses = {" ".join(line.split()[1:4]) for line in out.splitlines()}
    return names | addresses


def _unavailable(why: str) -> None:
    if ci_requires_tier():
        pytest.fail(f"CI=true and the real-node tier cannot run: {why}")
    pytest.skip(why)


@pytest.fixture(scope="session")
def node_baseline() -> set[str]:
    return host_links()


@pytest.fixture(scope="session")
def node(tmp_path_factory: pytest.TempPathFactory, node_baseline: set[str]) -> Iterator[Node]:
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
        _unavailable("the real-node tier starts one node per process: run it with -n 0")
    problem = environment_problem()
    if problem is None and images.missing():
        names = ", ".join(p.name for p in images.missing())
        problem = f"image archives missing ({names}): run python -m tests.realnode.images"
    if problem is not None:
        _unavailable(problem)
    began = time.monotonic()
    with running_node(tmp_path_factory.mktemp("realnode"), images.archives()) as started:
        Cluster(started).wait_node_ready(timeout=90)
        # Pods reach the apiserver by the `kubernetes` Service, through kube-proxy's rules.
        started.wait_service_routing(timeout=60)
        started.check_alive()
        MEASURED.update({f"node start: {k} (s)": v for k, v in started.timings.items()})
        MEASURED["node start: node Ready (s)"] = round(time.monotonic() - began, 1)
        yield started


@pytest.fixture
def cluster(node: Node) -> Cluster:
    return Cluster(node)


@pytest.fixture
def namespace(cluster: Cluster) -> Iterator[str]:
    """A fresh namespace of :meth:`Cluster.create_namespace`, deleted afterwards."""
    name = f"rn-{secrets.token_hex(3)}"
    cluster.create_namespace(name)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


MEASURED: dict[str, Any] = {}
"""Figures the tests measured (docs/cluster.md quotes them), printed after the run."""


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if MEASURED:
        terminalreporter.section("real-node measurements")
        for what, value in MEASURED.items():
            terminalreporter.write_line(f"{what}: {value}")


def dump(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path
