"""The debug view answers loopback clients only; the probes and /metrics answer everyone.

``/debug/watches`` shows every shared watch's path, namespace and selectors (which can name
objects) and identity digests. With the shipped configuration (the admin port on 0.0.0.0, where
the kubelet and Prometheus reach it with the pod IP), a client connecting from any other address
than loopback is refused, while the probes and the metrics still answer it. The non-loopback
client here is real: it connects to this machine's own non-loopback address, so its peer address
is that address, as a pod's would be.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.harness import running_proxy
from watchproxy.server.admin import debug_view_allowed

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "deploy" / "components" / "sidecar" / "config.yaml"


def _non_loopback_address() -> str:
    """An IPv4 address of this machine that is not loopback (no packet is sent)."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only picks the outgoing interface
        address: str = probe.getsockname()[0]
    except OSError:
        pytest.skip("no non-loopback IPv4 address on this machine")
    finally:
        probe.close()
    if address.startswith("127."):
        pytest.skip("no non-loopback IPv4 address on this machine")
    return address


def _shipped_admin() -> dict[str, Any]:
    admin: dict[str, Any] = yaml.safe_load(SHIPPED.read_text())["admin"]
    return admin


async def _get(session: aiohttp.ClientSession, url: str) -> int:
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=10)) as response:
        await response.read()
        return response.status


async def test_the_shipped_debug_view_refuses_a_client_from_a_non_loopback_address(
    tmp_path: Any,
) -> None:
    shipped = _shipped_admin()
    assert shipped["host"] == "0.0.0.0"
    outside = _non_loopback_address()
    overrides = {f"admin.{key}": value for key, value in shipped.items() if key != "port"}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        port = running.proxy.admin_port
        from_pod_ip = f"http://{outside}:{port}"
        # Where the kubelet and Prometheus come from: probes and metrics answer.
        for path in ("/healthz", "/livez", "/readyz", "/metrics"):
            assert await _get(session, from_pod_ip + path) == 200, path
        async with session.get(from_pod_ip + "/debug/watches") as refused:
            assert refused.status == 403
            text = await refused.text()
            assert "loopback" in text and "watches" not in text
        # A program in the pod, or kubectl port-forward (which connects inside the pod to
        # 127.0.0.1), reads it.
        async with session.get(running.admin_url + "/debug/watches") as debug:
            assert debug.status == 200
            assert "watches" in await debug.json()


async def test_the_debug_view_can_be_opened_to_anyone_or_turned_off(tmp_path: Any) -> None:
    outside = _non_loopback_address()
    for setting, from_outside, from_loopback in (("anywhere", 200, 200), ("off", 404, 404)):
        overrides = {"admin.host": "0.0.0.0", "admin.debug_view": setting}
        async with (
            running_proxy(tmp_path, overrides) as running,
            aiohttp.ClientSession() as session,
        ):
            port = running.proxy.admin_port
            assert await _get(session, f"http://{outside}:{port}/debug/watches") == from_outside
            assert await _get(session, running.admin_url + "/debug/watches") == from_loopback
            assert await _get(session, f"http://{outside}:{port}/metrics") == 200


@pytest.mark.parametrize(
    ("remote", "allowed"),
    [
        ("127.0.0.1", True),
        ("127.8.9.10", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("10.0.0.7", False),
        ("192.0.2.2", False),
        ("::ffff:10.0.0.7", False),
        ("fe80::1%eth0", False),
        ("", False),
        (None, False),
        ("localhost", False),  # never a peer address; a name is not trusted
    ],
)
def test_loopback_is_judged_by_the_peer_address(remote: str | None, allowed: bool) -> None:
    assert debug_view_allowed("loopback", remote) is allowed
    assert debug_view_allowed("anywhere", remote) is True
    assert debug_view_allowed("off", remote) is False
