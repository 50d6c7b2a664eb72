"""The app's own clients watching through the sidecar for real: a client-go v0.37 informer and the
official Python client, each an app container of one Deployment passed through ``watchproxy
inject`` and applied unchanged, with their default configuration (``KUBECONFIG`` from the
injection, no credentials of their own: the injection mounts no token into app containers, so
everything they see came through the sidecar).

- ``client-go``: tests/clients/go137's informer on configmaps, from a SharedInformerFactory with
  client-go's defaults (protobuf, gzip, and from v0.35 watch-list: one watch with
  ``sendInitialEvents=true`` that must end its initial events with a bookmark, which hung on
  quiet collections behind a proxy that held that bookmark back);
- ``python``: tests/clients/pywatch.py, ``watch.Watch().stream(list_namespaced_config_map, ns)``.

The test changes configmaps through the apiserver directly and compares what each client
reported (its stdout, read with ``kubectl logs -f``) with a watch of its own on the apiserver.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import yaml

from tests.realnode.cluster import KUBECTL, Cluster, LineStream
from tests.realnode.conftest import MEASURED
from tests.realnode.node import Node
from tests.realnode.test_sidecar import inject

CLIENTS = ("client-go", "python")
# Seconds without any change before the last one: an informer whose watch stalls on a quiet
# collection (a bookmark or an event held in a buffer) shows it here.
QUIET_SECONDS = 6
Event = tuple[str, str, str]  # type, name, resourceVersion
INFORMER = ["informer", "--resource", "configmaps", "--content-type", "default"]
PYWATCH = [
    "python3", "-u", "/usr/local/bin/pywatch.py",
    "--library", "official", "--resource", "configmaps", "--namespace", "$(POD_NAMESPACE)",
]  # fmt: skip


def clients_deployment(namespace: str) -> dict[str, Any]:
    """What a user writes: two app containers, each a client with its defaults."""
    secure = {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}
    own_namespace = {
        "name": "POD_NAMESPACE",
        "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}},
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "clients", "namespace": namespace},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "clients"}},
            "template": {
                "metadata": {"labels": {"app": "clients"}},
                "spec": {
                    "serviceAccountName": "app",
                    "terminationGracePeriodSeconds": 5,
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": 1000,
                        "seccompProfile": {"type": "RuntimeDefault"},
                    },
                    "containers": [
                        {
                            "name": "client-go",
                            "image": "wprn-clients:1",
                            "imagePullPolicy": "Never",
                            # The namespace of the kubeconfig's context (the injection's);
                            # client-go's own choice of content type (protobuf).
                            "command": INFORMER,
                            "securityContext": secure,
                        },
                        {
                            "name": "python",
                            "image": "wprn-clients:1",
                            "imagePullPolicy": "Never",
                            "command": PYWATCH,
                            "env": [own_namespace],
                            "securityContext": secure,
                        },
                    ],
                },
            },
        },
    }


@dataclass
class ClientsPod:
    namespace: str
    name: str
    logs: dict[str, LineStream]

    def events(self, client: str) -> list[Event]:
        """The client's events so far (the informer's handler calls), in its order."""
        found = []
        for line in self.logs[client].lines:
            if line.startswith("{"):
                event = json.loads(line)
                if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                    found.append((event["type"], event["name"], event["resourceVersion"]))
        return found

    def others(self, client: str) -> list[str]:
        """What the client reported besides events and READY (errors, a restart)."""
        return [
            line
            for line in self.logs[client].lines
            if not line.startswith("{")
            or json.loads(line)["type"] not in ("ADDED", "MODIFIED", "DELETED", "READY")
        ]

    def wait_for_event(self, client: str, event: Event, timeout: float) -> None:
        self.logs[client].wait_for(
            lambda _: event in self.events(client), timeout, f"{event} in {client}'s stream"
        )


@pytest.fixture(scope="module")
def clients_pod(node: Node, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClientsPod]:
    cluster = Cluster(node)
    namespace = f"pc-{secrets.token_hex(3)}"
    cluster.create_namespace(namespace)
    injected = inject(clients_deployment(namespace), tmp_path_factory.mktemp("clients"))
    started = time.monotonic()
    cluster.kubectl("apply", "-n", namespace, "-f", "-", stdin=injected)
    pod = cluster.wait_pod_ready(namespace, "app=clients", timeout=90)
    MEASURED["clients pod: apply to Ready (s)"] = round(time.monotonic() - started, 1)
    name = pod["metadata"]["name"]
    kc = ["--kubeconfig", cluster.kubeconfig, "-n", namespace]
    logs = {c: LineStream([KUBECTL, *kc, "logs", "-f", name, "-c", c]) for c in CLIENTS}
    try:
        # The namespace is quiet (the injection's two configmaps and kube-root-ca.crt, no
        # change): the informer's watch-list must still end its initial events.
        logs["client-go"].wait_for(
            lambda ls: any(line.startswith('{"type":"READY"') for line in ls),
            timeout=30,
            what="the informer's sync on a quiet collection",
        )
        MEASURED["clients pod: apply to client-go informer synced (s)"] = round(
            time.monotonic() - started, 1
        )
        yield ClientsPod(namespace, name, logs)
    finally:
        for stream in logs.values():
            stream.close()
        cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def direct_watch(cluster: Cluster, namespace: str, resource_version: str) -> LineStream:
    """The apiserver's record: its own watch of the namespace's configmaps after a revision."""
    path = f"/api/v1/namespaces/{namespace}/configmaps?watch=1&resourceVersion={resource_version}"
    return LineStream([KUBECTL, "--kubeconfig", cluster.kubeconfig, "get", "--raw", path])


def recorded(stream: LineStream) -> list[Event]:
    events = [json.loads(line) for line in stream.lines if line.strip()]
    return [
        (e["type"], e["object"]["metadata"]["name"], e["object"]["metadata"]["resourceVersion"])
        for e in events
    ]


def create(cluster: Cluster, namespace: str, *names: str) -> None:
    items = [
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": n}, "data": {"n": n}}
        for n in names
    ]
    cluster.kubectl(
        "create", "-n", namespace, "-f", "-",
        stdin=yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": items}),
    )  # fmt: skip


def rv_of(cluster: Cluster, namespace: str, name: str) -> str:
    return str(cluster.get("configmap", "-n", namespace, name)["metadata"]["resourceVersion"])


def per_object(events: list[Event]) -> dict[str, list[Event]]:
    found: dict[str, list[Event]] = {}
    for event in events:
        found.setdefault(event[1], []).append(event)
    return found


def test_clients_in_the_pod_sync_through_the_sidecar_on_a_quiet_collection(
    clients_pod: ClientsPod, cluster: Cluster
) -> None:
    # Each client listed the namespace's configmaps as they are (once each) and nothing else.
    record = cluster.get("configmaps", "-n", clients_pod.namespace)["items"]
    now = {(c["metadata"]["name"], c["metadata"]["resourceVersion"]) for c in record}
    for client in CLIENTS:
        clients_pod.logs[client].wait_for(
            lambda _, c=client: now <= {(n, rv) for _, n, rv in clients_pod.events(c)},  # type: ignore[misc]
            timeout=15,
            what=f"{client}'s initial state",
        )
        initial = clients_pod.events(client)
        assert all(kind == "ADDED" for kind, _, _ in initial), (client, initial)
        assert {(n, rv) for _, n, rv in initial} == now, client
        assert len(initial) == len(now), (client, initial)
        assert clients_pod.others(client) == [], client
    # No credentials in the app containers: the sidecar made every request for them.
    pod = cluster.get("pod", "-n", clients_pod.namespace, clients_pod.name)
    assert pod["spec"]["automountServiceAccountToken"] is False
    mounts = {
        c["name"]: [m["mountPath"] for m in c.get("volumeMounts", [])]
        for c in pod["spec"]["containers"]
    }
    assert mounts == {c: ["/var/run/watchproxy"] for c in CLIENTS}


def test_clients_in_the_pod_see_every_change_the_apiserver_recorded_in_order_without_loss_or_repeat(
    clients_pod: ClientsPod, cluster: Cluster
) -> None:
    ns = clients_pod.namespace
    # A start mark both clients have seen: what follows it in their streams is compared.
    create(cluster, ns, "mark-start")
    start = ("ADDED", "mark-start", rv_of(cluster, ns, "mark-start"))
    for client in CLIENTS:
        clients_pod.wait_for_event(client, start, timeout=15)
    before = {c: len(clients_pod.events(c)) for c in CLIENTS}
    with direct_watch(cluster, ns, start[2]) as record:
        # A burst: creations, updates of several objects in one request, deletions.
        names = [f"cm-{i:02}" for i in range(12)]
        create(cluster, ns, *names)
        for round_ in range(2):
            label = f"round={round_}"
            cluster.kubectl("label", "configmap", "-n", ns, *names[:8], label, "--overwrite")
        cluster.kubectl("patch", "configmap", "-n", ns, "cm-00", "-p", '{"data":{"n":"x"}}')
        cluster.kubectl("delete", "configmap", "-n", ns, *names[8:])
        # Then nothing for a while, then one more change: it must arrive promptly.
        time.sleep(QUIET_SECONDS)
        quiet_ended = time.monotonic()
        create(cluster, ns, "mark-end")
        end = ("ADDED", "mark-end", rv_of(cluster, ns, "mark-end"))
        record.wait_for(
            lambda ls: any('"mark-end"' in line for line in ls), 15, "the direct watch's end mark"
        )
        for client in CLIENTS:
            clients_pod.wait_for_event(client, end, timeout=10)
            MEASURED[f"clients pod: {client} change after {QUIET_SECONDS} s quiet (s)"] = round(
                time.monotonic() - quiet_ended, 2
            )
    expected = recorded(record)
    assert len(expected) == 12 + 16 + 1 + 4 + 1, expected
    assert expected[-1] == end
    for client in CLIENTS:
        seen = clients_pod.events(client)[before[client] :]
        seen = seen[: seen.index(end) + 1]
        if client == "python":
            # A watch stream, as the apiserver sent it.
            assert seen == expected, client
        else:
            # The informer calls its handlers for one object in the watch's order; across
            # objects its queue (DeltaFIFO) may hand over a later object's changes together
            # with an earlier one's. Every event, once, and each object's in order.
            assert sorted(seen) == sorted(expected), client
            assert per_object(seen) == per_object(expected), client
        assert clients_pod.others(client) == [], client
    pod = cluster.get("pod", "-n", ns, clients_pod.name)
    assert all(s["restartCount"] == 0 for s in pod["status"]["containerStatuses"])
    # The sidecar served both clients' watches: its hub has their subscriptions.
    metrics = cluster.kubectl(
        "get", "--raw", f"/api/v1/namespaces/{ns}/pods/{clients_pod.name}:8081/proxy/metrics"
    ).stdout.decode()
    MEASURED["clients pod: sidecar configmaps watch metrics"] = [
        line
        for line in metrics.splitlines()
        if "v1/configmaps" in line
        and line.startswith(("watchproxy_watch_subscribers", "watchproxy_watch_passthrough"))
    ]
