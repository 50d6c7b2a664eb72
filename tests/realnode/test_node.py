"""The rig itself: a real node whose addresses all live in its own network namespace, and a
teardown that leaves the machine as it found it."""

from __future__ import annotations

import ipaddress
import os
from typing import Any

from tests.realnode.cluster import Cluster
from tests.realnode.conftest import MEASURED, host_links
from tests.realnode.node import (
    NODE_IP,
    NODE_NAME,
    POD_SUBNET,
    Node,
    kill_stray_daemons,
    leftovers,
    list_netns,
    pid_alive,
    run,
)


def restricted_pod(name: str, command: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 2,
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 65532,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": name,
                    "image": "wprn-app:1",
                    "imagePullPolicy": "Never",
                    "command": command,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                }
            ],
        },
    }


def test_node_registers_with_its_node_identity_and_address(cluster: Cluster) -> None:
    node = cluster.get("node", NODE_NAME)
    addresses = {a["type"]: a["address"] for a in node["status"]["addresses"]}
    assert addresses["InternalIP"] == NODE_IP
    assert node["status"]["nodeInfo"]["kubeletVersion"] == "v1.37.2"
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://1.")


def test_pods_get_addresses_inside_the_namespace_and_the_machine_gets_none(
    cluster: Cluster, namespace: str, node: Node, node_baseline: set[str]
) -> None:
    cluster.apply([restricted_pod("idle", ["sleep", "infinity"])], namespace=namespace)
    pod = cluster.wait_pod_ready(namespace, "app=idle", timeout=60)
    assert ipaddress.ip_address(pod["status"]["podIP"]) in ipaddress.ip_network(POD_SUBNET)
    # The pod's veth is in the node's namespace, beside the bridge; the machine's own
    # interfaces and addresses are what they were before the node started.
    inside = run(["ip", "-n", node.name, "-o", "link"])
    assert "veth" in inside and "wprn0" in inside
    assert host_links() == node_baseline
    # The logs come from the kubelet, through the apiserver, as kubectl fetches them.
    cluster.apply(
        [restricted_pod("hello", ["sh", "-c", "echo hello from $(hostname); sleep infinity"])],
        namespace=namespace,
    )
    cluster.wait_pod_ready(namespace, "app=hello", timeout=60)
    logs = cluster.kubectl("logs", "-n", namespace, "hello").stdout.decode()
    assert logs == "hello from hello\n"


def test_teardown_leaves_nothing_on_the_machine(
    node: Node, node_baseline: set[str], cluster: Cluster
) -> None:
    """Runs last (conftest moves it): it ends the session's node itself."""
    # First, once the node has run a while: the Node authorizer and NodeRestriction let the
    # kubelet write its own Lease only as system:node:realnode; it holds and renews it.
    lease = cluster.get("lease", "-n", "kube-node-lease", NODE_NAME)
    assert lease["spec"]["holderIdentity"] == NODE_NAME
    pids = [d.process.pid for d in node.daemons.values()]
    assert node.holder is not None
    pids.append(node.holder.pid)
    assert all(pid_alive(p) for p in pids)
    problems = node.close()
    MEASURED.update({f"{k} (s)": v for k, v in node.timings.items() if k.startswith("teardown")})
    assert problems == []
    assert leftovers(node.name, node.run_dir) == []
    assert node.name not in list_netns()
    assert not any(pid_alive(p) for p in pids)
    assert host_links() == node_baseline
    assert not os.path.exists(node.run_dir / "containerd")
    # No daemon of any earlier node either (a teardown cut short leaves them behind).
    assert kill_stray_daemons() == []
