"""Forward identity mode: shared state is served only to a client the apiserver authorizes now.

kubefake answers SelfSubjectAccessReviews (allowed unless ``faults.forbid`` names the resource)
and SelfSubjectReviews; its LISTs and watches themselves never refuse, so whatever 403 a client
gets here is watchproxy's, from the review. The real apiserver's verdicts, and its messages as
the oracle, are in tests/realapi/test_identity_revocation.py.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import aiohttp
import pytest

from tests.harness import running_proxy, wait_for

CMS = "/api/v1/namespaces/default/configmaps"
REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
WHOAMI = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
USER = "system:serviceaccount:default:default"
TTL = 0.3
FORWARD = {"security.identity": "forward", "security.authorization_cache_seconds": TTL}


def sample(running: Any, name: str, labels: dict[str, str] | None = None) -> float:
    value = running.proxy.metrics.registry.get_sample_value(name, labels or {})
    return float(value or 0.0)


def forbidden(verb: str) -> dict[str, Any]:
    """The Status the apiserver answers ``verb`` on default's configmaps with, for USER."""
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'configmaps is forbidden: User "{USER}" cannot {verb} resource "configmaps" '
        'in API group "" in the namespace "default"',
        "reason": "Forbidden",
        "details": {"kind": "configmaps"},
        "code": 403,
    }


async def get(
    session: aiohttp.ClientSession, url: str, headers: dict[str, str]
) -> tuple[int, bytes]:
    async with session.get(url, headers=headers) as response:
        return response.status, await response.read()


async def until_status(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    status: int,
    timeout: float = 5.0,
) -> tuple[bytes, float]:
    """Poll ``url`` until it answers ``status`` (bounded); its body and how long it took."""
    started = time.monotonic()
    while True:
        got, body = await get(session, url, headers)
        took = time.monotonic() - started
        if got == status:
            return body, took
        if took > timeout:
            raise AssertionError(f"GET {url}: {got}, wanted {status} within {timeout}s")
        await asyncio.sleep(0.05)


def reviews_sent(running: Any) -> int:
    return sum(1 for r in running.fake.stats.requests if r.path == REVIEWS)


async def test_revoked_client_gets_403_for_shared_state_within_the_ttl(tmp_path: Any) -> None:
    async with (
        running_proxy(tmp_path, FORWARD) as running,
        aiohttp.ClientSession() as session,
    ):
        fake = running.fake
        fake.store.create("configmaps", "default", {"metadata": {"name": "a"}})
        auth = {"Authorization": f"Bearer {fake.token}"}
        base = running.url + CMS
        lines: list[bytes] = []
        async with session.get(base + "?watch=1&timeoutSeconds=30", headers=auth) as watch:
            assert watch.status == 200
            lines.append(await watch.content.readline())  # ADDED a: the shared watch is synced
            status, body = await get(session, base + "?resourceVersion=0", auth)
            assert status == 200 and [i["metadata"]["name"] for i in json.loads(body)["items"]] == [
                "a"
            ]
            assert sample(running, "watchproxy_lists_from_cache_total") == 1
            asked = reviews_sent(running)
            assert asked == 2  # the watch's and the LIST's (verbs differ)
            # Within the ttl the verdict is reused: no review upstream.
            await get(session, base + "?resourceVersion=0", auth)
            assert reviews_sent(running) == asked

            fake.faults.forbid("configmaps")  # the client's access is revoked
            body, took = await until_status(session, base + "?resourceVersion=0", auth, 403)
            assert took <= TTL + 1.0
            assert json.loads(body) == forbidden("list")
            served = sample(running, "watchproxy_lists_from_cache_total")
            status, body = await get(session, base + "?watch=1&resourceVersion=0", auth)
            assert (status, json.loads(body)) == (403, forbidden("watch"))
            status, body = await get(session, base, auth)  # a consistent LIST, hub-served
            assert (status, json.loads(body)) == (403, forbidden("list"))
            # A watch asked for over WebSocket is refused before its handshake, as the
            # apiserver's authorization filter refuses it.
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await session.ws_connect(
                    base + "?watch=1&resourceVersion=0",
                    headers={**auth, "Origin": running.url},
                )
            assert refused.value.status == 403
            assert sample(running, "watchproxy_lists_from_cache_total") == served
            assert (
                sample(running, "watchproxy_authorization_verdicts_total", {"verdict": "denied"})
                >= 3
            )
            assert (
                sample(running, "watchproxy_authorization_reviews_total", {"outcome": "denied"})
                >= 1
            )

            # The watch that was running goes on, as the apiserver's own does.
            fake.store.create("configmaps", "default", {"metadata": {"name": "b"}})
            lines.append(await asyncio.wait_for(watch.content.readline(), 5))
        assert [json.loads(line)["object"]["metadata"]["name"] for line in lines] == ["a", "b"]

        fake.faults.forbid("configmaps", False)  # access granted again
        await until_status(session, base + "?resourceVersion=0", auth, 200)


async def test_an_unanswered_review_passes_the_request_through(tmp_path: Any) -> None:
    async with (
        running_proxy(tmp_path, FORWARD) as running,
        aiohttp.ClientSession() as session,
    ):
        fake = running.fake
        fake.store.create("configmaps", "default", {"metadata": {"name": "a"}})
        auth = {"Authorization": f"Bearer {fake.token}"}
        base = running.url + CMS
        async with session.get(base + "?watch=1&timeoutSeconds=30", headers=auth) as watch:
            await watch.content.readline()
            fake.stats.reset()
            fake.faults.fail_next(1, 500)  # the review of the next LIST
            status, _ = await get(session, base + "?resourceVersion=0", auth)
            assert status == 200
            # Not from shared state: the apiserver answered the LIST itself.
            assert [r.path for r in fake.stats.requests] == [REVIEWS, CMS]
            assert sample(running, "watchproxy_lists_from_cache_total") == 0
            assert (
                sample(running, "watchproxy_authorization_reviews_total", {"outcome": "unanswered"})
                == 1
            )
            # Not kept: the next LIST is reviewed again, and served from shared state.
            status, _ = await get(session, base + "?resourceVersion=0", auth)
            assert status == 200
            assert [r.path for r in fake.stats.requests][2:] == [REVIEWS]
            assert sample(running, "watchproxy_lists_from_cache_total") == 1


async def test_serviceaccount_mode_sends_no_reviews(tmp_path: Any) -> None:
    async with running_proxy(tmp_path) as running, aiohttp.ClientSession() as session:
        running.fake.store.create("configmaps", "default", {"metadata": {"name": "a"}})
        base = running.url + CMS
        async with session.get(base + "?watch=1&timeoutSeconds=30") as watch:
            await watch.content.readline()
            for _ in range(3):
                assert (await get(session, base + "?resourceVersion=0", {}))[0] == 200
        assert sample(running, "watchproxy_lists_from_cache_total") == 3
        paths = {r.path for r in running.fake.stats.requests}
        assert REVIEWS not in paths and WHOAMI not in paths
        assert running.proxy.shared_access is None


async def test_no_credential_in_logs_metrics_or_debug_while_reviewing(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    overrides = {**FORWARD, "logging.level": "debug"}
    async with (
        running_proxy(tmp_path, overrides) as running,
        aiohttp.ClientSession() as session,
    ):
        fake = running.fake
        fake.store.create("configmaps", "default", {"metadata": {"name": "a"}})
        auth = {"Authorization": f"Bearer {fake.token}"}
        stranger = {"Authorization": "Bearer stranger-credential-xyz"}
        base = running.url + CMS
        texts: list[str] = []
        async with session.get(base + "?watch=1&timeoutSeconds=30", headers=auth) as watch:
            await watch.content.readline()
            await get(session, base + "?resourceVersion=0", auth)
            # A watch the hub would serve it: the review is answered 401, so the watch passes
            # through and gets the apiserver's 401.
            stranger_watch = base + "?watch=1&timeoutSeconds=1"
            assert (await get(session, stranger_watch, stranger))[0] == 401
            reviews = "watchproxy_authorization_reviews_total"
            assert sample(running, reviews, {"outcome": "pass"}) == 1
            fake.faults.fail_next(1, 500)
            await until_status(session, base + "?resourceVersion=0", auth, 200)
            fake.faults.forbid("configmaps")
            texts.append(
                (await until_status(session, base + "?resourceVersion=0", auth, 403))[0].decode()
            )
            async with session.get(running.admin_url + "/metrics") as response:
                texts.append(await response.text())
            async with session.get(running.admin_url + "/debug/watches") as response:
                texts.append(await response.text())
        texts.append(caplog.text)
        for text in texts:
            assert fake.token not in text
            assert "stranger-credential-xyz" not in text


async def test_a_consistent_list_that_goes_upstream_anyway_is_not_reviewed_first(
    tmp_path: Any,
) -> None:
    """A consistent LIST of a quiet collection goes to the apiserver whoever asks: it is sent
    as it is, one request, without an access review before it (before: the review, then the
    LIST)."""
    overrides = {**FORWARD, "hub.consistent_list_wait_seconds": 0.05}
    async with (
        running_proxy(tmp_path, overrides) as running,
        aiohttp.ClientSession() as session,
    ):
        fake = running.fake
        fake.store.create("configmaps", "default", {"metadata": {"name": "a"}})
        auth = {"Authorization": f"Bearer {fake.token}"}
        base = running.url + CMS
        async with session.get(base + "?watch=1&timeoutSeconds=30", headers=auth) as watch:
            await watch.content.readline()  # ADDED a: the shared watch is synced
            hub = running.proxy.hub
            assert hub is not None
            (shared,) = hub.watches.values()
            loop = asyncio.get_running_loop()
            # Quiet: nothing moved for 4 waits (0.2 s); time passing is the event here.
            await wait_for(
                lambda: shared.advanced_at is not None and loop.time() - shared.advanced_at > 0.3,
                what="the collection to be quiet",
            )
            fake.stats.reset()
            status, body = await get(session, base, auth)
            assert status == 200 and json.loads(body)["items"][0]["metadata"]["name"] == "a"
            assert [r.path for r in fake.stats.requests if not r.watch] == [CMS]
        quiet = sample(running, "watchproxy_consistent_lists_total", {"outcome": "quiet"})
        assert quiet == 1
