"""The newest kubectl (1.37, built from Go modules by tests/realapi/build.sh) through watchproxy
against the real apiserver: every command prints what it prints direct.

One session of everyday commands runs twice, in two fresh namespaces: once straight at the
apiserver, once through watchproxy. Client-side and server-side apply, diff, get (JSON, a
jsonpath, and a watch with its events), describe, label, auth can-i, api-resources (aggregated
discovery), create and replace of a 300 KB configmap, and delete; each command's exit code,
stdout and stderr must be the same, apart from the namespace's name and what differs between
any two runs (diff's temporary file names, timestamps, uids).
"""

from __future__ import annotations

import asyncio
import re
import secrets
from pathlib import Path

import pytest

from tests.clients.build_rust_node import on_ci
from tests.harness import kubectl, proxy_for_upstream, versioned_kubectl
from tests.realapi.fixture import RealApiServer
from tests.realapi.kubeapi import Api

pytestmark = pytest.mark.timeout(180, func_only=True)

NEWEST = 37

MANIFEST = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: demo
  labels: {app: demo}
data:
  colour: blue
"""
CHANGED = MANIFEST.replace("blue", "green")
SERVER_SIDE = """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: demo
data:
  size: large
"""
# A body well over the 64 KiB read without the body budget: read whole under the budget
# (policy/bodybudget.py) before it goes upstream, by POST (create) and PUT (replace).
BIG = f"""\
apiVersion: v1
kind: ConfigMap
metadata:
  name: big
data:
  blob: {"x" * 300_000}
"""
BIG_CHANGED = BIG.replace("x" * 300_000, "y" * 300_000)
WATCH_FORMAT = 'jsonpath={.type} {.object.metadata.name} {.object.data}{"\\n"}'
# What differs between any two runs of the same command.
VOLATILE = (
    (re.compile(r"/tmp/\S+"), "TMP"),  # kubectl diff's temporary directories
    (re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"), "TIME"),
    (re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ [+-]\d{4}"), "TIME"),  # diff's file times
    (re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"), "UID"),
    (re.compile(r'"resourceVersion": "\d+"'), '"resourceVersion": "RV"'),
    (re.compile(r"\b\d+s\b"), "AGE"),
)


def newest_kubectl() -> str:
    found = versioned_kubectl(NEWEST)
    if found is None:
        message = f"kubectl.1.{NEWEST} was not built (bash tests/realapi/build.sh builds it)"
        if on_ci():
            pytest.fail(f"{message}; CI=true: a missing client is a failure")
        pytest.skip(message)
    return found


def normalised(text: str, namespace: str) -> str:
    text = text.replace(namespace, "NAMESPACE")
    for pattern, replacement in VOLATILE:
        text = pattern.sub(replacement, text)
    return text


async def watch_session(binary: str, kubeconfig: str, namespace: str, direct: Api) -> str:
    """``kubectl get configmaps -w --output-watch-events`` while one configmap is made,
    changed and deleted straight at the apiserver: the lines it printed."""
    configmaps = f"/api/v1/namespaces/{namespace}/configmaps"
    await direct.ok("POST", configmaps, body={"metadata": {"name": "listed"}, "data": {"n": "0"}})
    process = await asyncio.create_subprocess_exec(
        binary, "--kubeconfig", kubeconfig, "-n", namespace, "get", "configmaps", "-w",
        "--output-watch-events", "-o", WATCH_FORMAT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    lines: list[str] = []
    try:
        async with asyncio.timeout(30):
            # The ADDED of the configmap made before says the watch has listed.
            lines.append((await process.stdout.readline()).decode())
            made = {"metadata": {"name": "w"}, "data": {"n": "1"}}
            await direct.ok("POST", configmaps, body=made)
            await direct.ok(
                "PATCH", f"{configmaps}/w", body={"data": {"n": "2"}},
                content_type="application/merge-patch+json",
            )  # fmt: skip
            await direct.ok("DELETE", f"{configmaps}/w")
            while not lines[-1].startswith("DELETED w"):
                line = await process.stdout.readline()
                assert line, f"kubectl's watch ended early: {lines}"
                lines.append(line.decode())
    finally:
        process.terminate()
        await process.wait()
    return "".join(lines)


async def session(binary: str, kubeconfig: str, namespace: str, direct: Api) -> list[str]:
    """The commands, in order; each as '$ args / exit code / stdout / stderr', normalised."""
    commands: list[tuple[tuple[str, ...], str | None]] = [
        (("apply", "-f", "-"), MANIFEST),
        (("apply", "-f", "-"), MANIFEST),  # unchanged
        (("diff", "-f", "-"), CHANGED),  # exit 1: a difference
        (("apply", "-f", "-"), CHANGED),
        (("apply", "--server-side", "--field-manager=t", "-f", "-"), SERVER_SIDE),
        (("get", "configmap", "demo", "-o", "jsonpath={.data}"), None),
        (("get", "configmaps", "-l", "app=demo", "-o", "json"), None),
        (("label", "configmap", "demo", "tier=web"), None),
        (("describe", "configmap", "demo"), None),
        (("auth", "can-i", "create", "pods"), None),
        (("api-resources", "--sort-by=name"), None),
        (("get", "configmap", "missing"), None),  # exit 1: NotFound, as the apiserver says
        (("delete", "configmap", "demo"), None),
        (("create", "-f", "-"), BIG),
        (("replace", "-f", "-"), BIG_CHANGED),
        (("get", "configmap", "big", "-o", "jsonpath={.data.blob}"), None),
        (("delete", "configmap", "big"), None),
    ]
    out: list[str] = []
    for args, stdin in commands:
        code, stdout, stderr = await kubectl(
            kubeconfig,
            "-n",
            namespace,
            *args,
            binary=binary,
            stdin=stdin.encode() if stdin is not None else None,
        )
        out.append(normalised(f"$ {' '.join(args)}\n{code}\n{stdout}\n{stderr}", namespace))
    out.append(normalised(await watch_session(binary, kubeconfig, namespace, direct), namespace))
    return out


async def test_the_newest_kubectl_prints_through_watchproxy_what_it_prints_direct(
    tmp_path: Path, real_apiserver: RealApiServer, direct: Api
) -> None:
    binary = newest_kubectl()
    upstream = real_apiserver.write_kubeconfig(
        tmp_path / "upstream.kubeconfig", token=real_apiserver.token
    )
    namespaces = [f"k-{secrets.token_hex(4)}" for _ in range(2)]
    for namespace in namespaces:
        await direct.ok("POST", "/api/v1/namespaces", body={"metadata": {"name": namespace}})
    async with proxy_for_upstream(tmp_path, upstream) as running:
        straight = await session(binary, upstream, namespaces[0], direct)
        proxied = await session(binary, running.kubeconfig, namespaces[1], direct)
    assert "0\nconfigmap/demo created" in straight[0], straight[0]
    assert straight[2].split("\n")[1] == "1", straight[2]  # diff found the change
    for want, got in zip(straight, proxied, strict=True):
        assert got == want, f"through watchproxy:\n{got}\ndirect:\n{want}"
