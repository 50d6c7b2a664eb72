"""The verdict cache of forward identity mode (policy.authorization) and its pure helpers."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from watchproxy.kube.apipath import parse_api_path
from watchproxy.kube.watchquery import parse_watch_query
from watchproxy.lists.sharedaccess import _reads_json, attributes_of
from watchproxy.policy.authorization import (
    ALLOWED,
    UNANSWERED,
    Attributes,
    Authorizer,
    Decision,
    Verdict,
    forbidden_status,
    review_body,
    username_of,
    verdict_of,
)

CONFIGMAPS = Attributes("list", "", "v1", "configmaps", namespace="ns")
WATCH_DEPLOYMENTS = Attributes("watch", "apps", "v1", "deployments")
DENIED = Verdict(Decision.DENIED, username="system:serviceaccount:ns:reader")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Reviews:
    """The review an Authorizer is given: answers ``verdict``, records what it was asked;
    while ``gate`` is set, each review waits for it."""

    def __init__(self, verdict: Verdict = ALLOWED) -> None:
        self.verdict = verdict
        self.asked: list[tuple[Attributes, str]] = []
        self.gate: asyncio.Event | None = None
        self.started = asyncio.Event()

    async def __call__(self, attributes: Attributes, credential: str) -> Verdict:
        self.asked.append((attributes, credential))
        self.started.set()
        if self.gate is not None:
            await self.gate.wait()
        return self.verdict


async def test_verdict_is_reused_for_ttl_then_asked_again() -> None:
    clock, reviews = Clock(), Reviews()
    authorizer = Authorizer(reviews, ttl=5.0, clock=clock)
    assert await authorizer.check("sha256:a", CONFIGMAPS, "Bearer a") is ALLOWED
    clock.now += 4.999
    assert await authorizer.check("sha256:a", CONFIGMAPS, "Bearer a") is ALLOWED
    assert len(reviews.asked) == 1
    reviews.verdict = DENIED  # revoked meanwhile
    clock.now += 0.001  # ttl seconds since the review answered
    assert await authorizer.check("sha256:a", CONFIGMAPS, "Bearer a") is DENIED
    assert len(reviews.asked) == 2


async def test_ttl_counts_from_when_the_review_answered() -> None:
    clock, reviews = Clock(), Reviews()
    reviews.gate = asyncio.Event()
    authorizer = Authorizer(reviews, ttl=5.0, clock=clock)
    check = asyncio.ensure_future(authorizer.check("sha256:a", CONFIGMAPS, "Bearer a"))
    await asyncio.wait_for(reviews.started.wait(), 1)
    await asyncio.sleep(0)  # the other checks have joined it
    clock.now += 3.0  # a slow review
    reviews.gate.set()
    await check
    clock.now += 4.9
    await authorizer.check("sha256:a", CONFIGMAPS, "Bearer a")
    assert len(reviews.asked) == 1


async def test_concurrent_checks_of_one_key_share_one_review() -> None:
    reviews = Reviews(DENIED)
    reviews.gate = asyncio.Event()
    authorizer = Authorizer(reviews, ttl=5.0, clock=Clock())
    checks = [
        asyncio.ensure_future(authorizer.check("sha256:a", CONFIGMAPS, "Bearer a"))
        for _ in range(50)
    ]
    await asyncio.wait_for(reviews.started.wait(), 1)
    await asyncio.sleep(0)  # the other checks have joined it
    assert len(reviews.asked) == 1
    reviews.gate.set()
    assert set(await asyncio.gather(*checks)) == {DENIED}
    assert len(reviews.asked) == 1 and authorizer.reviews == 1


async def test_each_identity_and_each_request_gets_its_own_verdict() -> None:
    reviews = Reviews()
    authorizer = Authorizer(reviews, ttl=5.0, clock=Clock())
    await authorizer.check("sha256:a", CONFIGMAPS, "Bearer a")
    await authorizer.check("sha256:b", CONFIGMAPS, "Bearer b")
    await authorizer.check("sha256:a", CONFIGMAPS._replace(verb="watch"), "Bearer a")
    await authorizer.check("sha256:a", CONFIGMAPS._replace(name="x"), "Bearer a")
    await authorizer.check("sha256:a", CONFIGMAPS, "Bearer a")
    assert [credential for _, credential in reviews.asked] == ["Bearer a", "Bearer b"] + [
        "Bearer a"
    ] * 2


async def test_the_cache_keeps_digests_never_credentials() -> None:
    authorizer = Authorizer(Reviews(), ttl=5.0, clock=Clock())
    await authorizer.check("sha256:0123", CONFIGMAPS, "Bearer s3cr3t-token")
    assert "s3cr3t" not in repr(vars(authorizer))
    assert "s3cr3t" not in repr(list(authorizer._verdicts))


async def test_the_cache_is_bounded_and_drops_the_oldest_first() -> None:
    clock, reviews = Clock(), Reviews()
    authorizer = Authorizer(reviews, ttl=60.0, max_entries=3, clock=clock)
    for n in range(5):
        clock.now += 1
        await authorizer.check(f"sha256:{n}", CONFIGMAPS, f"Bearer {n}")
        assert len(authorizer) <= 3
    assert len(reviews.asked) == 5
    for n in (2, 3, 4):  # the newest three are kept
        await authorizer.check(f"sha256:{n}", CONFIGMAPS, f"Bearer {n}")
    assert len(reviews.asked) == 5
    await authorizer.check("sha256:0", CONFIGMAPS, "Bearer 0")
    assert len(reviews.asked) == 6


async def test_expired_verdicts_make_room_before_live_ones_go() -> None:
    clock, reviews = Clock(), Reviews()
    authorizer = Authorizer(reviews, ttl=10.0, max_entries=2, clock=clock)
    await authorizer.check("sha256:old", CONFIGMAPS, "Bearer old")
    clock.now += 9
    await authorizer.check("sha256:live", CONFIGMAPS, "Bearer live")
    clock.now += 2  # "old" has expired, "live" has not
    await authorizer.check("sha256:new", CONFIGMAPS, "Bearer new")
    await authorizer.check("sha256:live", CONFIGMAPS, "Bearer live")
    assert len(reviews.asked) == 3


async def test_a_verdict_without_an_answer_is_not_kept() -> None:
    reviews = Reviews(UNANSWERED)
    authorizer = Authorizer(reviews, ttl=5.0, clock=Clock())
    assert (await authorizer.check("sha256:a", CONFIGMAPS, "Bearer a")).decision is Decision.PASS
    reviews.verdict = ALLOWED  # the apiserver answers again
    assert await authorizer.check("sha256:a", CONFIGMAPS, "Bearer a") is ALLOWED
    assert len(reviews.asked) == 2


async def test_ttl_zero_asks_for_every_request() -> None:
    reviews = Reviews()
    authorizer = Authorizer(reviews, ttl=0.0, clock=Clock())
    for _ in range(3):
        await authorizer.check("sha256:a", CONFIGMAPS, "Bearer a")
    assert len(reviews.asked) == 3 and len(authorizer) == 0


async def test_a_waiter_that_leaves_leaves_the_review_to_the_others() -> None:
    reviews = Reviews(DENIED)
    reviews.gate = asyncio.Event()
    authorizer = Authorizer(reviews, ttl=5.0, clock=Clock())
    first = asyncio.ensure_future(authorizer.check("sha256:a", CONFIGMAPS, "Bearer a"))
    second = asyncio.ensure_future(authorizer.check("sha256:a", CONFIGMAPS, "Bearer a"))
    await asyncio.wait_for(reviews.started.wait(), 1)
    await asyncio.sleep(0)  # the other checks have joined it
    first.cancel()  # its client went away
    with pytest.raises(asyncio.CancelledError):
        await first
    reviews.gate.set()
    assert await second is DENIED
    assert len(reviews.asked) == 1
    assert (
        authorizer.cached(next(iter(authorizer._verdicts))) is DENIED
    )  # kept for the next request too


async def test_close_ends_the_reviews_still_running() -> None:
    reviews = Reviews()
    reviews.gate = asyncio.Event()
    authorizer = Authorizer(reviews, ttl=5.0, clock=Clock())
    waiter = asyncio.ensure_future(authorizer.check("sha256:a", CONFIGMAPS, "Bearer a"))
    await asyncio.wait_for(reviews.started.wait(), 1)
    await asyncio.sleep(0)  # the other checks have joined it
    await authorizer.close()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert not authorizer._pending


def test_review_answers_read_as_the_apiserver_means_them() -> None:
    assert verdict_of(201, {"status": {"allowed": True}}) is ALLOWED
    denied = verdict_of(201, {"status": {"allowed": False, "reason": "RBAC: role x not found"}})
    assert (denied.decision, denied.reason, denied.lasting) == (
        Decision.DENIED,
        "RBAC: role x not found",
        True,
    )
    assert verdict_of(201, {"status": {"allowed": False}}).reason == ""
    # An authorizer that failed: the apiserver answers the request 500, not 403.
    failed = verdict_of(201, {"status": {"allowed": False, "evaluationError": "webhook down"}})
    assert (failed.decision, failed.lasting) == (Decision.PASS, True)
    for status in (401, 403):  # the credential is not taken, or may not review: its own answer
        assert verdict_of(status, {}) == Verdict(Decision.PASS)
    for status, body in ((500, {}), (429, {}), (201, None), (201, {"status": "x"})):
        assert verdict_of(status, body) is UNANSWERED


def test_username_is_read_from_a_self_subject_review() -> None:
    who = {"status": {"userInfo": {"username": "system:serviceaccount:ns:a", "groups": []}}}
    assert username_of(201, who) == "system:serviceaccount:ns:a"
    assert username_of(403, who) is None
    assert username_of(201, {"status": {"userInfo": {}}}) is None
    assert username_of(201, None) is None


def test_forbidden_status_is_the_apiservers() -> None:
    user = "system:serviceaccount:ns:reader"
    verdict = Verdict(Decision.DENIED, username=user)
    assert forbidden_status(CONFIGMAPS, verdict) == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": f'configmaps is forbidden: User "{user}" cannot list resource "configmaps" '
        'in API group "" in the namespace "ns"',
        "reason": "Forbidden",
        "details": {"kind": "configmaps"},
        "code": 403,
    }
    cluster = forbidden_status(WATCH_DEPLOYMENTS, dataclasses.replace(verdict, reason="RBAC: x"))
    assert cluster["message"] == (
        f'deployments.apps is forbidden: User "{user}" cannot watch resource "deployments" in '
        'API group "apps" at the cluster scope: RBAC: x'
    )
    assert cluster["details"] == {"group": "apps", "kind": "deployments"}
    named = forbidden_status(CONFIGMAPS._replace(name="one"), verdict)
    assert named["message"].startswith('configmaps "one" is forbidden: User ')
    assert named["details"] == {"name": "one", "kind": "configmaps"}
    # The apiserver escapes what could read as HTML in its part of the message, not the reason.
    odd = forbidden_status(CONFIGMAPS, Verdict(Decision.DENIED, reason="<r>", username="a<b>&"))
    assert 'User "a&lt;b&gt;&amp;" cannot' in odd["message"]
    assert odd["message"].endswith(": <r>")


def test_review_body_asks_about_the_requests_attributes() -> None:
    attributes = Attributes(
        "watch", "apps", "v1", "deployments", namespace="ns", name="d", field_selector="a=b"
    )
    assert review_body(attributes) == {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {
            "resourceAttributes": {
                "verb": "watch",
                "group": "apps",
                "version": "v1",
                "resource": "deployments",
                "namespace": "ns",
                "name": "d",
                "fieldSelector": {"rawSelector": "a=b"},
            }
        },
    }


def test_attributes_name_the_object_a_field_selector_requires() -> None:
    path = parse_api_path("/api/v1/namespaces/ns/configmaps")

    def attributes(selector: str, verb: str = "list") -> Attributes:
        return attributes_of(verb, path, parse_watch_query({"fieldSelector": selector}))

    assert attributes("metadata.name=one").name == "one"
    assert attributes("metadata.name=one", "watch").name == "one"
    assert attributes("metadata.name!=one").name == ""
    assert attributes("metadata.name=a/b").name == ""  # not a name the apiserver keeps
    assert attributes("").name == ""
    whole = attributes_of("list", path, parse_watch_query({"labelSelector": "app=x"}))
    assert whole == Attributes(
        "list", "", "v1", "configmaps", namespace="ns", label_selector="app=x"
    )
    group = attributes_of("watch", parse_api_path("/apis/apps/v1/deployments"), None)
    assert group == WATCH_DEPLOYMENTS


def test_denials_are_answered_here_only_to_clients_that_read_json() -> None:
    for accept in (None, "", "application/json", "*/*", "application/json;as=Table;g=meta.k8s.io"):
        assert _reads_json(accept), accept
    for accept in ("application/vnd.kubernetes.protobuf, application/json", "application/cbor"):
        assert not _reads_json(accept), accept
