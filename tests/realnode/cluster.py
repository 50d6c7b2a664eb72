"""kubectl against the real node's apiserver, every call bounded in time.

Waits are kubectl's own (``kubectl wait`` watches the object until its condition holds, or
until its timeout), and ``logs -f`` streams are read line by line until the awaited line.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import yaml

from tests.realnode.node import Node

HERE = Path(__file__).resolve().parent
KUBECTL = str(HERE.parent / "realapi" / "bin" / "kubectl.1.37")


class Cluster:
    """The node's cluster as its admin (system:masters), through the relay on loopback."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.kubeconfig = node.admin_kubeconfig

    def kubectl(
        self,
        *args: str,
        stdin: str | bytes | None = None,
        timeout: float = 60.0,
        check: bool = True,
        binary: str = KUBECTL,
        kubeconfig: str | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        data = stdin.encode() if isinstance(stdin, str) else stdin
        done = subprocess.run(
            [binary, "--kubeconfig", kubeconfig or self.kubeconfig, *args],
            input=data,
            stdin=None if data is not None else subprocess.DEVNULL,
            capture_output=True,
            timeout=timeout,
            env={**os.environ, **env} if env else None,
        )
        if check and done.returncode != 0:
            raise AssertionError(
                f"kubectl {' '.join(args)} exited {done.returncode}: "
                f"{done.stderr.decode(errors='replace')[-2000:]}"
            )
        return done

    def apply(
        self, manifests: Iterable[dict[str, Any]] | str, namespace: str | None = None
    ) -> None:
        text = manifests if isinstance(manifests, str) else yaml.safe_dump_all(list(manifests))
        ns = ["-n", namespace] if namespace else []
        self.kubectl("apply", *ns, "-f", "-", stdin=text)

    def create_namespace(self, name: str) -> None:
        """A namespace where Pod Security ``restricted`` is enforced, with a ServiceAccount ``app``
        that may read configmaps and pods (the apps' identity, and so their sidecar's)."""
        self.apply(
            [
                {
                    "apiVersion": "v1",
                    "kind": "Namespace",
                    "metadata": {
                        "name": name,
                        "labels": {"pod-security.kubernetes.io/enforce": "restricted"},
                    },
                },
                {
                    "apiVersion": "v1",
                    "kind": "ServiceAccount",
                    "metadata": {"name": "app", "namespace": name},
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "Role",
                    "metadata": {"name": "app", "namespace": name},
                    "rules": [
                        {
                            "apiGroups": [""],
                            "resources": ["configmaps", "pods"],
                            "verbs": ["get", "list", "watch"],
                        }
                    ],
                },
                {
                    "apiVersion": "rbac.authorization.k8s.io/v1",
                    "kind": "RoleBinding",
                    "metadata": {"name": "app", "namespace": name},
                    "roleRef": {
                        "apiGroup": "rbac.authorization.k8s.io",
                        "kind": "Role",
                        "name": "app",
                    },
                    "subjects": [{"kind": "ServiceAccount", "name": "app", "namespace": name}],
                },
            ]
        )
        # The controller manager creates the namespace's default ServiceAccount (which pods
        # without one of their own need) and publishes the cluster's CA into it (the projected
        # ServiceAccount volumes mount it).
        for what in ("serviceaccount/default", "configmap/kube-root-ca.crt"):
            self.kubectl("wait", "--for=create", "-n", name, what, "--timeout=30s", timeout=35)

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def wait_node_ready(self, timeout: float) -> None:
        self.kubectl(
            "wait",
            "--for=create",
            "node/realnode",
            f"--timeout={timeout:.0f}s",
            timeout=timeout + 5,
        )
        self.kubectl(
            "wait",
            "--for=condition=Ready",
            "node/realnode",
            f"--timeout={timeout:.0f}s",
            timeout=timeout + 5,
        )

    def wait_pod_ready(self, namespace: str, selector: str, timeout: float = 90) -> dict[str, Any]:
        """The pod that ``selector`` picks, once it exists and is Ready (kubectl wait watches)."""
        target = ["-n", namespace, "pod", "-l", selector]
        self.kubectl(
            "wait", "--for=create", *target, f"--timeout={timeout:.0f}s", timeout=timeout + 5
        )
        done = self.kubectl(
            "wait", "--for=condition=Ready", *target, f"--timeout={timeout:.0f}s",
            timeout=timeout + 5, check=False,
        )  # fmt: skip
        pods = self.get(*target)["items"]
        if done.returncode != 0:
            raise AssertionError(
                f"pod {selector} not Ready: {done.stderr.decode()[-500:]}\n"
                f"{json.dumps([p.get('status') for p in pods], indent=1)[-3000:]}"
            )
        assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
        return pods[0]  # type: ignore[no-any-return]


class LineStream:
    """A running command whose output lines are awaited one condition at a time."""

    def __init__(self, command: list[str], env: dict[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env} if env else None,
        )
        assert self.process.stdout is not None
        os.set_blocking(self.process.stdout.fileno(), False)
        self.selector = selectors.DefaultSelector()
        self.selector.register(self.process.stdout, selectors.EVENT_READ)
        self.lines: list[str] = []
        self._partial = b""

    def wait_for(
        self, predicate: Callable[[list[str]], bool], timeout: float, what: str
    ) -> list[str]:
        deadline = time.monotonic() + timeout
        assert self.process.stdout is not None
        while not predicate(self.lines):
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"timed out waiting for {what}; lines: {self.lines[-20:]}")
            if not self.selector.select(left):
                continue
            chunk = self.process.stdout.read()
            if not chunk:
                if predicate(self.lines):
                    break
                raise AssertionError(f"stream ended before {what}; lines: {self.lines[-20:]}")
            data = self._partial + chunk
            *complete, self._partial = data.split(b"\n")
            self.lines += [line.decode(errors="replace") for line in complete]
        return self.lines

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.selector.close()
        assert self.process.stdout is not None
        self.process.stdout.close()

    def __enter__(self) -> LineStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
