"""The sidecar's memory limit for real: loads that would take watchproxy past the 256Mi limit
``watchproxy inject`` sets, if what it holds grew with the answers it serves, on a kubelet 1.37
that enforces the limit (cgroup v1 here). Either the sidecar stays under the limit and every
client gets its whole answer, or the kubelet's OOM kill is what the test reports.

The collection: ConfigMaps of 0.9 MiB each (they hold at most 1 MiB), 64 MiB of JSON. The app
container (``tests/realnode/listload.py``, run with ``kubectl exec``) reads it through the
sidecar from several clients at the same moment, most of them slowly through small socket
buffers:

- LISTs: identical ones (one batch, one upstream LIST) and distinct ones (one upstream LIST
  each), eight in all: held whole per client they would be twice the limit;
- watches: four of the whole collection, which share one upstream watch and the hub's cache of
  the collection (64 MiB of JSON is 77 MiB by the memory model, under the 96 MiB
  ``hub.cache_max_bytes`` the injection sets: the hub admits it).

Memory is read on the host from the container's cgroup as the kubelet made it:
``memory.max_usage_in_bytes`` (the peak since the container started: what the limit is judged
on), the OOM killer's count, and for the record the sidecar process's ``VmHWM`` and
``memory.usage_in_bytes`` sampled meanwhile; the pod's status tells a restart or an
``OOMKilled``. ``WPRN_MEMORY_SERIES=FILE`` writes the samples (seconds into the load, cgroup
usage, VmRSS) of the last load to FILE, for a closer look at when the memory went up.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.realnode.cluster import Cluster
from tests.realnode.conftest import MEASURED
from tests.realnode.node import CGROUP_ROOT, Node
from tests.realnode.test_sidecar import app_deployment, inject

HERE = Path(__file__).resolve().parent
MIB = 1024 * 1024
LIMIT = 256 * MIB  # what `watchproxy inject` sets (checked below)
OBJECT_BYTES = 900 * 1024
COLLECTION_BYTES = 64 * MIB
SLOW = 16 * MIB  # bytes/s
# rate (bytes/s, 0: as fast as it reads):query. Four identical LISTs share one upstream LIST
# (a batch), four distinct ones are one upstream LIST each.
LISTS = [f"{SLOW}:"] * 3 + ["0:"] + [
    f"{SLOW}:labelSelector=load%3Dbig",
    f"{SLOW}:labelSelector=load%21%3Dsmall",
    f"{SLOW}:fieldSelector=metadata.namespace%21%3Dnone",
    "0:limit=1000",
]  # fmt: skip
WATCHES = [f"{SLOW}:watch=1"] * 3 + ["0:watch=1"]


class OverLimit(AssertionError):
    """The sidecar was OOM-killed, or its memory reached the limit."""


@dataclass
class Loaded:
    namespace: str
    pod: str
    objects: int
    cgroup: Path  # the sidecar container's memory cgroup on the host


def container_cgroup(node: Node, pod: dict[str, Any], container: str) -> Path:
    """The container's memory cgroup (v1), found by its id under the node's cgroup root."""
    status = next(
        s for s in pod["status"]["initContainerStatuses"] + pod["status"]["containerStatuses"]
        if s["name"] == container
    )  # fmt: skip
    container_id = status["containerID"].partition("://")[2]
    found = list((CGROUP_ROOT / "memory" / node.name).rglob(container_id))
    assert len(found) == 1, found
    return found[0]


def read_int(path: Path) -> int | None:
    """An integer cgroup file; None once the container (and so its cgroup) is gone."""
    try:
        return int(path.read_text())
    except (OSError, ValueError):
        return None


def sidecar_status(cgroup: Path) -> dict[str, int]:
    """VmRSS and VmHWM (bytes) of the sidecar's process, the one process in its cgroup; empty
    once it is gone."""
    try:
        pids = (cgroup / "cgroup.procs").read_text().split()
        status = Path(f"/proc/{pids[0]}/status").read_text() if len(pids) == 1 else ""
    except OSError:
        return {}
    found = {}
    for key in ("VmRSS", "VmHWM"):
        if match := re.search(rf"^{key}:\s+(\d+) kB", status, re.M):
            found[key] = int(match.group(1)) * 1024
    return found


def create_collection(cluster: Cluster, namespace: str) -> int:
    count = -(-COLLECTION_BYTES // OBJECT_BYTES)
    items = [
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"big-{i:03}", "labels": {"load": "big"}},
            # Random: compression upstream cannot make it small.
            "data": {"blob": os.urandom(OBJECT_BYTES // 2).hex()},
        }
        for i in range(count)
    ]

    def create(part: list[dict[str, Any]]) -> None:
        document = json.dumps({"apiVersion": "v1", "kind": "List", "items": part})
        cluster.kubectl("create", "-n", namespace, "-f", "-", "-o", "name", stdin=document)

    # kubectl creates one object at a time: several of them at once.
    with ThreadPoolExecutor(6) as pool:
        list(pool.map(create, [items[i::6] for i in range(6)]))
    return count


@pytest.fixture(scope="module")
def loaded(node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Loaded]:
    """The app's pod with the sidecar, and the collection in its namespace. The tests of this
    module run in file order: the watches' test, which may cost the sidecar its life, last."""
    cluster = Cluster(node)
    namespace = f"mem-{secrets.token_hex(3)}"
    cluster.create_namespace(namespace)
    manifest = app_deployment(namespace)
    # The app only runs the load (kubectl exec): the image's default command, sleep.
    del manifest["spec"]["template"]["spec"]["containers"][0]["command"]
    injected = inject(manifest, tmp_path_factory.mktemp("memory"))
    try:
        cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=injected)
        started = time.monotonic()
        objects = create_collection(cluster, namespace)
        MEASURED["memory: create the collection (s)"] = round(time.monotonic() - started, 1)
        pod = cluster.wait_pod_ready(namespace, "app=app", timeout=90)
        cgroup = container_cgroup(node, pod, "watchproxy")
        yield Loaded(namespace, pod["metadata"]["name"], objects, cgroup)
    finally:
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


class Sampler(threading.Thread):
    """The cgroup's memory.usage_in_bytes and the process's VmRSS, every 100 ms until stopped."""

    def __init__(self, cgroup: Path) -> None:
        super().__init__(daemon=True)
        self.cgroup = cgroup
        self.usage: list[int] = []
        self.rss: list[int] = []
        self.series: list[tuple[float, int | None, int | None]] = []
        self.stopped = threading.Event()

    def run(self) -> None:
        while not self.stopped.wait(0.1):
            usage = read_int(self.cgroup / "memory.usage_in_bytes")
            rss = sidecar_status(self.cgroup).get("VmRSS")
            self.series.append((time.monotonic(), usage, rss))
            self.usage += [usage] if usage is not None else []
            self.rss += [rss] if rss is not None else []


def mib(value: int | None) -> float | None:
    return None if value is None else round(value / MIB, 1)


def run_load(loaded: Loaded, cluster: Cluster, clients: list[str], what: str) -> list[Any]:
    """Run the clients in the app container; record what the sidecar's memory did meanwhile;
    fail if the sidecar was OOM-killed or went past its limit. Returns the clients' results."""
    ns = ["-n", loaded.namespace]
    before = read_int(loaded.cgroup / "memory.usage_in_bytes")
    script = (HERE / "listload.py").read_text()
    path = f"/api/v1/namespaces/{loaded.namespace}/configmaps"
    sampler = Sampler(loaded.cgroup)
    sampler.start()
    began = time.monotonic()
    try:
        done = cluster.kubectl(
            "exec", *ns, loaded.pod, "-c", "app", "--",
            "python3", "-c", script, path, str(loaded.objects), *clients,
            timeout=150, check=False,
        )  # fmt: skip
    finally:
        sampler.stopped.set()
        sampler.join(5)
    took = time.monotonic() - began
    if os.environ.get("WPRN_MEMORY_SERIES"):
        Path(os.environ["WPRN_MEMORY_SERIES"]).write_text(
            json.dumps([(round(t - began, 2), u, r) for t, u, r in sampler.series])
        )
    results = [json.loads(line) for line in done.stdout.decode().splitlines()]
    peak = read_int(loaded.cgroup / "memory.max_usage_in_bytes")
    process = sidecar_status(loaded.cgroup)
    try:
        oom_control = (loaded.cgroup / "memory.oom_control").read_text()
    except OSError:
        oom_control = ""
    oom = dict(line.split() for line in oom_control.splitlines())
    MEASURED.update(
        {
            f"memory, {what}: clients": len(clients),
            f"memory, {what}: load duration (s)": round(took, 1),
            f"memory, {what}: client seconds": sorted(r["seconds"] for r in results),
            f"memory, {what}: cgroup usage before (MiB)": mib(before),
            f"memory, {what}: cgroup usage sampled peak (MiB)": mib(max(sampler.usage, default=0)),
            f"memory, {what}: cgroup max_usage_in_bytes (MiB)": mib(peak),
            f"memory, {what}: sidecar VmRSS sampled peak (MiB)": mib(max(sampler.rss, default=0)),
            f"memory, {what}: sidecar VmHWM (MiB)": mib(process.get("VmHWM")),
            f"memory, {what}: cgroup failcnt": read_int(loaded.cgroup / "memory.failcnt"),
            f"memory, {what}: oom_kill": oom.get("oom_kill"),
        }
    )
    # The kubelet's verdict first: an OOM kill (or any restart) is what the test reports.
    if peak is None:
        # The container's cgroup is gone: it ended. Its status follows when the kubelet sees it.
        cluster.kubectl(
            "wait", *ns, f"pod/{loaded.pod}", "--timeout=30s",
            "--for=jsonpath={.status.initContainerStatuses[0].restartCount}=1",
            timeout=35, check=False,
        )  # fmt: skip
    pod = cluster.get("pod", *ns, loaded.pod)
    sidecar = next(s for s in pod["status"]["initContainerStatuses"] if s["name"] == "watchproxy")
    ended = sidecar.get("lastState", {}).get("terminated", {})
    MEASURED[f"memory, {what}: sidecar restarts"] = sidecar["restartCount"]
    if ended.get("reason") == "OOMKilled" or oom.get("oom_kill", "0") != "0":
        raise OverLimit(
            f"the sidecar was OOM-killed: {json.dumps(ended)}; sampled usage up to "
            f"{mib(max(sampler.usage, default=0))} MiB; clients: {results}"
        )
    assert sidecar["restartCount"] == 0 and not ended, json.dumps(sidecar)
    # Not even at the limit: the cgroup's peak since the container started (what the limit is
    # enforced on) is under it. (VmHWM is reported, not judged: it also counts pages of the
    # image's files that another cgroup read first and pays for.)
    assert peak is not None
    if peak >= LIMIT:
        raise OverLimit(f"the sidecar reached its limit: {peak} bytes, {process}")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert len(results) == len(clients)
    # Every client got the whole collection, once.
    for result in results:
        assert result["error"] is None and result["status"] == 200, result
        assert result["names"] == loaded.objects, result
    return results


def test_sidecar_serves_concurrent_slow_lists_of_a_big_collection_within_its_memory_limit(
    loaded: Loaded, cluster: Cluster
) -> None:
    # The limit the kubelet set, and the one watchproxy read and fitted its budgets to.
    assert read_int(loaded.cgroup / "memory.limit_in_bytes") == LIMIT
    logs = cluster.kubectl("logs", "-n", loaded.namespace, loaded.pod, "-c", "watchproxy")
    started = [line for line in logs.stdout.decode().splitlines() if "memory: " in line]
    assert len(started) == 1 and "memory: container limit 256 MiB; budgets " in started[0], started
    MEASURED["memory: the sidecar's start-up line"] = json.loads(started[0])["message"]
    results = run_load(loaded, cluster, LISTS, "8 LISTs")
    answer = min(r["bytes"] for r in results)
    MEASURED["memory: LIST answer (MiB)"] = mib(answer)
    # The load is what the test says: held whole per client, the answers would not fit twice.
    assert answer * len(LISTS) >= 2 * LIMIT, answer


# The sidecar peaked at 235-256 MiB here and was OOM-killed in 3 of 7 runs (2026-12-07, before
# the cold key's watch-list and the LIST pages parsed as they arrive): the hub's first LIST of
# the collection was one page of 500 objects, its body, text and lines held at once. Now
# 116.7-118.9 MiB of cgroup usage at the peak in 6 runs of 6 (2026-12-07; the sidecar takes
# the watch-list path here: tests/component/test_hub_sync_memory.py covers the paged path and
# the relist).
def test_sidecar_serves_watches_of_a_big_collection_its_cache_budget_admits_within_its_limit(
    loaded: Loaded, cluster: Cluster
) -> None:
    run_load(loaded, cluster, WATCHES, "4 watches")
