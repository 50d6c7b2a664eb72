"""The projected ServiceAccount token rotated by the kubelet while the app's watch through the
sidecar stays open (marked ``slow``: about 11 minutes).

The apiserver's shortest ``expirationSeconds`` is 600 and the kubelet renews a projected token
once 80 % of its lifetime has passed, so the first rotation comes after 8 minutes; the old
token stops working at 10. The test shortens the injected volume's 3607 s (which the apiserver
extends to a year) to 600 s, waits for the kubelet to write a new token, waits until the old
one has expired, and then checks that the app's watch, opened before the rotation, still
delivers a new configmap and that new requests through the sidecar still succeed: watchproxy
re-read the token file.

    scripts/test.sh tests/realnode/test_token_rotation.py -m slow -n 0
"""

from __future__ import annotations

import base64
import json
import secrets
import time
from typing import Any

import pytest
import yaml

from tests.realnode.cluster import KUBECTL, Cluster, LineStream
from tests.realnode.node import Node
from tests.realnode.test_sidecar import app_deployment, inject

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1000)]
TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"


def expiry(token: str) -> float:
    payload = token.split(".")[1]
    claims: dict[str, Any] = json.loads(
        base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4))
    )
    return float(claims["exp"])


def test_app_watch_survives_the_kubelets_token_rotation_and_the_old_tokens_expiry(
    node: Node, tmp_path: Any
) -> None:
    cluster = Cluster(node)
    namespace = f"tr-{secrets.token_hex(3)}"
    cluster.create_namespace(namespace)
    documents = list(yaml.safe_load_all(inject(app_deployment(namespace), tmp_path)))
    for document in documents:
        if document["kind"] == "Deployment":
            for volume in document["spec"]["template"]["spec"]["volumes"]:
                for source in volume.get("projected", {}).get("sources", []):
                    if "serviceAccountToken" in source:
                        source["serviceAccountToken"]["expirationSeconds"] = 600
    cluster.apply(documents, namespace=namespace)
    pod = cluster.wait_pod_ready(namespace, "app=app", timeout=90)
    name = pod["metadata"]["name"]
    sidecar = ["exec", "-n", namespace, name, "-c", "watchproxy", "--"]
    first = cluster.kubectl(*sidecar, "cat", TOKEN).stdout.decode()
    kc = ["--kubeconfig", cluster.kubeconfig, "-n", namespace]
    with LineStream([KUBECTL, *kc, "logs", "-f", name, "-c", "app"]) as logs:
        logs.wait_for(
            lambda ls: any(line.startswith("kube-root-ca.crt") for line in ls), 30, "the watch"
        )
        # The kubelet's rotation: a bounded poll of the file, every 15 s for at most 9 minutes.
        deadline = time.monotonic() + 540
        while (current := cluster.kubectl(*sidecar, "cat", TOKEN).stdout.decode()) == first:
            assert time.monotonic() < deadline, "the kubelet did not rotate the token"
            time.sleep(15)
        assert expiry(current) > expiry(first)
        # Until the old token has expired: the apiserver accepts a token up to a minute past
        # its exp (go-jose's default leeway) and caches a verdict for seconds more. A deadline,
        # not a condition anyone announces.
        time.sleep(max(0.0, expiry(first) - time.time() + 75))
        old = cluster.kubectl("--token", first, "get", "--raw", "/api", check=False)
        assert old.returncode != 0 and b"Unauthorized" in old.stderr, old.stderr
        cluster.kubectl("create", "configmap", "after-rotation", "-n", namespace)
        logs.wait_for(
            lambda ls: any(line.startswith("after-rotation ") for line in ls),
            30,
            "the configmap made after the rotation, in the watch opened before it",
        )
        assert sum(line == "app: started" for line in logs.lines) == 1
    # A new request through the sidecar, with the new token.
    done = cluster.kubectl(
        "exec", "-n", namespace, name, "-c", "app", "--",
        "kubectl", "get", "configmap", "after-rotation", "-o", "name",
    )  # fmt: skip
    assert done.stdout == b"configmap/after-rotation\n"
    status = cluster.get("pod", "-n", namespace, name)["status"]
    assert all(s["restartCount"] == 0 for s in status["containerStatuses"])
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)
