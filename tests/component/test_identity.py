"""Identity modes: by default everyone is the proxy; in forward mode, each client is itself."""

from __future__ import annotations

from typing import Any

import aiohttp
import pytest

from tests.harness import running_proxy

PODS = "/api/v1/namespaces/default/pods"


async def test_forward_mode_sends_the_clients_credential_and_never_the_proxys(
    tmp_path: Any,
) -> None:
    overrides = {"security.identity": "forward"}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        good = {"Authorization": f"Bearer {running.fake.token}"}
        async with session.get(running.url + PODS, headers=good) as response:
            assert response.status == 200
        for headers in ({"Authorization": "Bearer someone-else"}, {}):
            async with session.get(running.url + PODS, headers=headers) as response:
                assert response.status == 401  # the apiserver's answer, passed through
                assert (await response.json())["reason"] == "Unauthorized"
        sent = [
            r.headers.get("Authorization") for r in running.fake.stats.requests if r.path == PODS
        ]
        assert sent == [f"Bearer {running.fake.token}", "Bearer someone-else", None]


async def test_forward_mode_keeps_each_clients_credential_when_header_blocks_repeat(
    tmp_path: Any,
) -> None:
    """What goes upstream for a header block the API port has seen before is worked out once
    (``Forwarder.send(shared_headers=True)``); clients taking turns still each send their own
    credential, and one that sends none sends none."""
    overrides = {"security.identity": "forward"}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        running.fake.store.create(
            "pods", "default", {"metadata": {"name": "p"}, "spec": {"containers": []}}
        )
        pod = PODS + "/p"  # a GET of one object: a plain pass-through (a LIST may be batched)
        tokens = [f"Bearer {running.fake.token}", "Bearer someone-else", None] * 3
        served_before = running.proxy.api.served
        for token in tokens:
            headers = {"Authorization": token} if token else {}
            async with session.get(running.url + pod, headers=headers) as response:
                assert response.status == (200 if token == tokens[0] else 401)
        assert running.proxy.api.served - served_before == len(tokens)
        sent = [
            r.headers.get("Authorization") for r in running.fake.stats.requests if r.path == pod
        ]
        assert sent == tokens


async def test_forward_mode_keeps_each_clients_credential_on_batched_lists(
    tmp_path: Any,
) -> None:
    """The same for a LIST (batched): what goes upstream for a repeated header block is
    worked out once by the batcher too, and each client's credential still goes with it."""
    overrides = {"security.identity": "forward"}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        tokens = [f"Bearer {running.fake.token}", "Bearer someone-else", None] * 3
        registry = running.proxy.metrics.registry
        batched_before = registry.get_sample_value("watchproxy_lists_batched_total") or 0
        for token in tokens:
            headers = {"Authorization": token} if token else {}
            async with session.get(running.url + PODS, headers=headers) as response:
                assert response.status == (200 if token == tokens[0] else 401)
        batched = registry.get_sample_value("watchproxy_lists_batched_total") or 0
        assert batched - batched_before == len(tokens)
        sent = [
            r.headers.get("Authorization") for r in running.fake.stats.requests if r.path == PODS
        ]
        assert sent == tokens


async def test_forward_mode_shares_watches_only_between_equal_credentials(
    tmp_path: Any,
) -> None:
    overrides = {"security.identity": "forward"}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        running.fake.store.create(
            "pods", "default", {"metadata": {"name": "p"}, "spec": {"containers": []}}
        )
        good = {"Authorization": f"Bearer {running.fake.token}"}
        url = running.url + PODS + "?watch=1&timeoutSeconds=1"
        for _ in range(2):
            async with session.get(url, headers=good) as response:
                assert response.status == 200
                assert len((await response.read()).splitlines()) == 1
        async with session.get(url, headers={"Authorization": "Bearer intruder"}) as response:
            # Not served from the good client's shared state: the upstream refuses it.
            assert response.status == 401
        hub = running.proxy.hub
        assert hub is not None
        identities = {w["key"]["identity"] for w in hub.debug()}
        assert "proxy" not in identities
        assert all(running.fake.token not in str(w) for w in hub.debug())  # digests only


async def test_forwarded_impersonation_reaches_the_apiserver_and_bypasses_the_hub(
    tmp_path: Any,
) -> None:
    """With ``security.impersonation: forward`` the apiserver decides; the hub's shared state
    (the proxy's view) never answers a request made as someone else."""
    overrides = {"security.impersonation": "forward"}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        running.fake.store.create(
            "pods", "default", {"metadata": {"name": "p"}, "spec": {"containers": []}}
        )
        watch = running.url + PODS + "?watch=1&timeoutSeconds=1"
        async with session.get(watch) as response:  # a shared watch exists for the key now
            assert response.status == 200
            await response.read()
        running.fake.stats.reset()
        alice = {"Impersonate-User": "alice", "Impersonate-Group": "devs"}
        for url in (watch, running.url + PODS + "?resourceVersion=0", running.url + PODS):
            async with session.get(url, headers=alice) as response:
                assert response.status == 200
                await response.read()
        sent = [r for r in running.fake.stats.requests if r.path == PODS]
        assert len(sent) == 3  # none served from the hub
        for record in sent:
            headers = {k.lower(): v for k, v in record.headers.items()}
            assert headers["impersonate-user"] == "alice"
            assert headers["impersonate-group"] == "devs"
            assert headers["authorization"] == f"Bearer {running.fake.token}"
        passthrough = running.proxy.metrics.passthrough_watches.labels("impersonation")
        assert passthrough._value.get() == 1  # type: ignore[attr-defined]


@pytest.mark.parametrize("identity", ["serviceaccount", "forward"])
async def test_a_batched_list_carries_upstream_what_a_passed_through_get_carries(
    tmp_path: Any, identity: str
) -> None:
    """One outgoing header set for a client's header block, whichever path sends it: the
    batcher takes it from the pass-through (``Forwarder.outgoing_of_shared``), so the two
    cannot drift apart. Requests with the same lines but for the credential never share a
    batch's answer."""
    overrides = {"security.identity": identity}
    async with running_proxy(tmp_path, overrides) as running, aiohttp.ClientSession() as session:
        running.fake.store.create(
            "pods", "default", {"metadata": {"name": "p"}, "spec": {"containers": []}}
        )
        registry = running.proxy.metrics.registry
        batched_before = registry.get_sample_value("watchproxy_lists_batched_total") or 0
        client = {
            "Authorization": f"Bearer {running.fake.token}",
            "User-Agent": "identity-test/1.0",
            "X-Custom": "kept",
            "Accept": "application/json",
        }
        for _ in range(2):  # the second time, each path's block is one it has seen
            for path in (PODS, PODS + "/p"):
                async with session.get(running.url + path, headers=client) as response:
                    assert response.status == 200
                    await response.read()
        assert (registry.get_sample_value("watchproxy_lists_batched_total") or 0) - (
            batched_before
        ) == 2
        sent = {
            path: [
                {k.lower(): v for k, v in r.headers.items() if k.lower() != "content-length"}
                for r in running.fake.stats.requests
                if r.path == path
            ]
            for path in (PODS, PODS + "/p")
        }
        assert len(sent[PODS]) == 2 and len(sent[PODS + "/p"]) == 2
        assert sent[PODS][0] == sent[PODS][1] == sent[PODS + "/p"][0] == sent[PODS + "/p"][1]
        assert sent[PODS][0]["x-custom"] == "kept"
        assert sent[PODS][0]["authorization"] == f"Bearer {running.fake.token}"
