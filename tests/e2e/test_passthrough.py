"""Pass-through: kubectl through the proxy behaves as it does directly against the apiserver."""

from __future__ import annotations

import json
from typing import Any

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import Running, kubectl, running_proxy, wait_for

CONFIGMAP = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "settings", "namespace": "default", "labels": {"team": "a"}},
    "data": {"colour": "blue"},
}


def _metric(text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


async def _metrics(running: Running) -> str:
    async with (
        aiohttp.ClientSession() as session,
        session.get(running.admin_url + "/metrics") as response,
    ):
        assert response.status == 200
        return await response.text()


async def test_kubectl_crud_through_the_proxy_matches_direct(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running:
        manifest = json.dumps(CONFIGMAP).encode()
        code, out, err = await kubectl(running.kubeconfig, "create", "-f", "-", stdin=manifest)
        assert code == 0, err
        assert "configmap/settings created" in out

        code, out, err = await kubectl(
            running.kubeconfig,
            "patch",
            "configmap",
            "settings",
            "--type=merge",
            "-p",
            '{"data":{"colour":"green"}}',
        )
        assert code == 0, err
        assert running.fake.store.get("configmaps", "default", "settings")["data"] == {
            "colour": "green"
        }

        via_proxy = await kubectl(running.kubeconfig, "get", "configmap", "settings", "-o", "json")
        direct = await kubectl(
            running.upstream_kubeconfig, "get", "configmap", "settings", "-o", "json"
        )
        assert via_proxy[0] == direct[0] == 0
        assert json.loads(via_proxy[1]) == json.loads(direct[1])

        via_proxy_table = await kubectl(running.kubeconfig, "get", "configmaps")
        direct_table = await kubectl(running.upstream_kubeconfig, "get", "configmaps")
        assert via_proxy_table[1].split()[:3] == direct_table[1].split()[:3]

        code, out, err = await kubectl(running.kubeconfig, "delete", "configmap", "settings")
        assert code == 0, err
        assert 'configmap "settings" deleted' in out


async def test_errors_keep_their_status_and_body(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        path = "/api/v1/namespaces/default/configmaps/missing"
        async with session.get(running.url + path) as response:
            assert response.status == 404
            status = await response.json()
        assert status["kind"] == "Status"
        assert status["reason"] == "NotFound"
        assert status["code"] == 404

        code, _, err = await kubectl(running.kubeconfig, "get", "configmap", "missing")
        direct = await kubectl(running.upstream_kubeconfig, "get", "configmap", "missing")
        assert code == direct[0] == 1
        assert err == direct[2]


async def test_client_credentials_never_reach_the_upstream(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        running.fake.stats.reset()
        headers = {
            "Authorization": "Bearer client-secret",
            "X-Remote-User": "root",
        }
        async with session.get(
            running.url + "/api/v1/namespaces/default/pods", headers=headers
        ) as response:
            assert response.status == 200
        [record] = [r for r in running.fake.stats.requests if r.path.endswith("/pods")]
        sent = {k.lower(): v for k, v in record.headers.items()}
        assert sent["authorization"] == f"Bearer {running.fake.token}"
        assert not any(k.startswith(("impersonate-", "x-remote-")) for k in sent)


async def test_metrics_parse_and_move_with_traffic(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        before = _metric(await _metrics(running), "watchproxy_requests_total", verb="list")
        for _ in range(3):
            async with session.get(running.url + "/api/v1/namespaces/default/pods") as response:
                assert response.status == 200
        text = await _metrics(running)
        assert _metric(text, "watchproxy_requests_total", verb="list", code="200") == before + 3
        assert _metric(text, "watchproxy_upstream_requests_total", verb="list", code="200") >= 3
        assert _metric(text, "watchproxy_request_duration_seconds_count", verb="list") >= 3
        assert _metric(text, "watchproxy_upstream_up") == 1


async def test_health_endpoints(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        async with session.get(running.admin_url + "/healthz") as response:
            assert response.status == 200
        async with session.get(running.admin_url + "/readyz") as response:
            assert response.status == 200
        await running.fake.faults.outage("refuse")
        # The next upstream exchange fails; the probe it triggers confirms and flips readiness.
        async with session.get(running.url + "/api/v1/namespaces/default/pods") as response:
            assert response.status == 503
            assert (await response.json())["reason"] == "ServiceUnavailable"
            assert response.headers.get("Retry-After") == "1"
        await wait_for(lambda: running.proxy.connectivity.down, what="the probe to confirm")
        async with session.get(running.admin_url + "/readyz") as response:
            assert response.status == 503
        await running.fake.faults.recover()


async def test_log_follow_streams_without_buffering(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running:
        running.fake.store.create(
            "pods",
            "default",
            {"metadata": {"name": "web-0"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
        )
        async with aiohttp.ClientSession() as session:
            url = running.url + "/api/v1/namespaces/default/pods/web-0/log?follow=true"
            async with session.get(url) as response:
                assert response.status == 200
                first = await response.content.readline()
                second = await response.content.readline()
        assert first and second and first != second


async def test_non_canonical_paths_are_refused(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running:
        reader, writer = await _raw(running)
        for path in (
            "/api/v1/namespaces/default/../kube-system/secrets",
            "/api/v1//pods",
            "/api/v1/namespaces/default%2Fsecrets",
        ):
            writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
            await writer.drain()
            status_line = await reader.readline()
            assert b" 400 " in status_line, (path, status_line)
            headers = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            await reader.readexactly(int(headers["content-length"]))
        writer.close()
        assert not [r for r in running.fake.stats.requests if "secrets" in r.path]


async def _raw(running: Running) -> tuple[Any, Any]:
    import asyncio

    return await asyncio.open_connection("127.0.0.1", running.proxy.api_port)


async def test_foreign_host_header_is_refused(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        url = running.url + "/api/v1/namespaces/default/pods"
        response = await session.get(url, headers={"Host": "evil.example"})
        assert response.status == 403
        assert (await response.json())["kind"] == "Status"
        response.release()


async def test_the_suite_runs_on_uvloop_like_production() -> None:
    import asyncio

    assert type(asyncio.get_running_loop()).__module__.startswith("uvloop")


async def test_printed_kubeconfig_works_with_kubectl_against_the_proxy(tmp_path: Any) -> None:
    import asyncio
    import sys

    async with running_proxy(tmp_path) as running:
        running.fake.store.create(
            "pods",
            "default",
            {"metadata": {"name": "web-0"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
        )
        printer = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "watchproxy", "kubeconfig",
            "--listen-port", str(running.proxy.api_port), "--namespace", "default",
            stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        printed, _ = await asyncio.wait_for(printer.communicate(), 30)
        assert printer.returncode == 0
        path = f"{tmp_path}/printed.kubeconfig"
        with open(path, "wb") as handle:
            handle.write(printed)
        code, out, err = await kubectl(path, "get", "pods", "-o", "name")
        assert code == 0, err
        assert out.strip() == "pod/web-0"


async def test_kubectl_exec_is_relayed_over_websocket(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running:
        running.fake.store.create(
            "pods",
            "default",
            {"metadata": {"name": "shell"}, "spec": {"containers": [{"name": "c", "image": "x"}]}},
        )
        code, out, err = await kubectl(running.kubeconfig, "exec", "shell", "--", "echo", "hi")
        assert code == 0, err
        assert out == "hi\n"
        code, out, err = await kubectl(
            running.kubeconfig, "exec", "-i", "shell", "--", "cat", stdin=b"line one\nline two\n"
        )
        assert code == 0, err
        assert out == "line one\nline two\n"
        code, out, err = await kubectl(running.kubeconfig, "exec", "shell", "--", "false")
        assert code != 0
        code, _, err = await kubectl(running.kubeconfig, "exec", "missing", "--", "echo")
        assert code != 0 and "not found" in err
        upgrades = [r for r in running.fake.stats.requests if r.path.endswith("/exec")]
        assert upgrades and all(
            r.headers.get("Authorization") == f"Bearer {running.fake.token}" for r in upgrades
        )
