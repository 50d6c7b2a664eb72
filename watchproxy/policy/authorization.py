"""Whether the apiserver would serve a client what the hub holds, in forward identity mode.

With ``security.identity: forward`` the hub keys shared state by a digest of each client's
credential, and it lists and watches with that credential: the apiserver authorized the client
when its shared watch started, not since. A client whose access is revoked afterwards would go
on being served from that state. So before the hub serves a client a watch or a LIST from
shared state, the client's request is authorized as the apiserver authorizes it: one
``SelfSubjectAccessReview`` sent with the client's own credential (every authenticated user may
create one; no right is granted to the proxy, and the apiserver authenticates the credential
itself) for the request's attributes, the ones the apiserver's request-info resolver derives.

This module is the pure part: the attributes of a request, the review's body, reading its
answer, the apiserver's Forbidden ``Status`` for a denial, and :class:`Authorizer`, a verdict
cache (keyed by the identity's digest, never the credential; bounded; each verdict kept
``ttl`` seconds) in front of an injected review coroutine, with concurrent checks of one key
sharing one review. The review itself (the HTTP request) is the caller's, in
``watchproxy.server.sharedaccess``.
"""

from __future__ import annotations

import asyncio
import enum
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, NamedTuple

REVIEW_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
WHOAMI_PATH = "/apis/authentication.k8s.io/v1/selfsubjectreviews"
WHOAMI_BODY = b'{"apiVersion":"authentication.k8s.io/v1","kind":"SelfSubjectReview"}'
# How many (identity, request attributes) verdicts are kept at most: a pod's programs ask for
# a few dozen; a client making up selectors costs at most this many entries.
MAX_VERDICTS = 4096


class Attributes(NamedTuple):
    """What the apiserver authorizes a resource request by (its ``authorizer.Attributes``).

    A tuple: it is hashed for every request served from shared state, and a tuple's hash is
    the interpreter's, not generated Python.

    ``name`` is set for a list or watch whose field selector requires one ``metadata.name``, as
    the apiserver's request-info resolver sets it (RBAC ``resourceNames`` then apply). The
    selectors are the request's, canonical: the apiserver passes them to its authorizers
    (RBAC ignores them; a webhook may not).
    """

    verb: str
    group: str
    version: str
    resource: str
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    label_selector: str = ""
    field_selector: str = ""


def review_body(attributes: Attributes) -> dict[str, Any]:
    """The ``SelfSubjectAccessReview`` that asks the apiserver about ``attributes``."""
    resource: dict[str, Any] = {
        "verb": attributes.verb,
        "group": attributes.group,
        "version": attributes.version,
        "resource": attributes.resource,
    }
    for field_name, value in (
        ("subresource", attributes.subresource),
        ("namespace", attributes.namespace),
        ("name", attributes.name),
    ):
        if value:
            resource[field_name] = value
    # The raw form, which the apiserver parses as it parses a request's query.
    if attributes.label_selector:
        resource["labelSelector"] = {"rawSelector": attributes.label_selector}
    if attributes.field_selector:
        resource["fieldSelector"] = {"rawSelector": attributes.field_selector}
    return {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": resource},
    }


class Decision(enum.Enum):
    """What the hub does with a request whose verdict this is."""

    ALLOWED = "allowed"  # serve it from shared state
    DENIED = "denied"  # answer the apiserver's 403
    # Let the apiserver answer it (pass it through): the review could not say, or the client
    # cannot be answered for the apiserver (an unauthenticated credential, an authorizer
    # error, which the apiserver answers with a 500, a user name that cannot be read).
    PASS = "pass"


@dataclass(frozen=True, slots=True)
class Verdict:
    """A review's outcome. ``lasting`` verdicts are kept for the cache's ``ttl``; the others
    (no answer, a 5xx, a 429) are asked again by the next request."""

    decision: Decision
    lasting: bool = True
    reason: str = ""  # DENIED: the authorizer's reason (may be empty), as the apiserver adds it
    username: str = ""  # DENIED: who the credential is, for the message


ALLOWED = Verdict(Decision.ALLOWED)
UNANSWERED = Verdict(Decision.PASS, lasting=False)


def verdict_of(status: int, body: Any) -> Verdict:
    """The verdict in the apiserver's answer (``status`` and parsed ``body``) to a review.

    A denial still needs the user's name (:func:`username_of`) before it can be answered."""
    if status in (401, 403):
        # The credential is not accepted, or may not review: the apiserver answers the
        # request itself, as it would have without the proxy.
        return Verdict(Decision.PASS)
    if status != 201 and status != 200:
        return UNANSWERED
    review_status = body.get("status") if isinstance(body, dict) else None
    if not isinstance(review_status, dict):
        return UNANSWERED
    if review_status.get("allowed") is True:
        return ALLOWED
    if review_status.get("evaluationError"):
        # The apiserver answers a request its authorizers failed on with a 500, not a 403.
        return Verdict(Decision.PASS)
    reason = review_status.get("reason")
    return Verdict(Decision.DENIED, reason=reason if isinstance(reason, str) else "")


def username_of(status: int, body: Any) -> str | None:
    """The user name in a ``SelfSubjectReview`` answer, None if there is none."""
    if (status != 201 and status != 200) or not isinstance(body, dict):
        return None
    review_status = body.get("status")
    user = review_status.get("userInfo") if isinstance(review_status, dict) else None
    name = user.get("username") if isinstance(user, dict) else None
    return name if isinstance(name, str) and name else None


_SANITIZE = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})


def forbidden_status(attributes: Attributes, verdict: Verdict) -> dict[str, Any]:
    """The ``Status`` the apiserver answers a request it does not authorize with (its
    ``responsewriters.Forbidden``): the same message, reason and details."""
    resource = attributes.resource
    if attributes.subresource:
        resource += "/" + attributes.subresource
    user = f"User {_go_quote(verdict.username)} cannot {attributes.verb} resource "
    user += f"{_go_quote(resource)} in API group {_go_quote(attributes.group)}"
    if attributes.namespace:
        user += f" in the namespace {_go_quote(attributes.namespace)}"
    else:
        user += " at the cluster scope"
    text = user.translate(_SANITIZE)
    if verdict.reason:
        text += ": " + verdict.reason
    qualified = attributes.resource
    if attributes.group:
        qualified += "." + attributes.group
    if attributes.name:
        message = f"{qualified} {_go_quote(attributes.name)} is forbidden: {text}"
    else:
        message = f"{qualified} is forbidden: {text}"
    details: dict[str, Any] = {}
    if attributes.name:
        details["name"] = attributes.name
    if attributes.group:
        details["group"] = attributes.group
    details["kind"] = attributes.resource
    return {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "Forbidden",
        "details": details,
        "code": 403,
    }


def _go_quote(text: str) -> str:
    """Go's ``%q`` for the printable text names are made of (and escapes for the rest)."""
    out = ['"']
    for char in text:
        if char == '"' or char == "\\":
            out.append("\\" + char)
        elif char.isprintable():
            out.append(char)
        elif ord(char) < 0x10000:
            out.append(f"\\u{ord(char):04x}" if ord(char) > 0x7F else f"\\x{ord(char):02x}")
        else:
            out.append(f"\\U{ord(char):08x}")
    out.append('"')
    return "".join(out)


class AccessKey(NamedTuple):
    """One verdict's key: who (a digest of the credential, never the credential) and what."""

    identity: str
    attributes: Attributes


# Asks the apiserver about (attributes, credential); an answer it cannot get is UNANSWERED,
# not an exception.
Review = Callable[[Attributes, str], Awaitable[Verdict]]


class Authorizer:
    """Verdicts for (identity, attributes), each asked of the apiserver at most once per
    ``ttl`` seconds.

    Guarantees: a lasting verdict is reused for ``ttl`` seconds from when its review answered,
    never longer; at most ``max_entries`` verdicts are kept (the oldest go first); checks of one
    key that arrive while its review runs share that review; the credential goes to the review
    and is never kept. The reviews are tasks this object owns: a waiter that leaves (its client
    went away) leaves the review to the others, and :meth:`close` ends the rest.
    """

    def __init__(
        self,
        review: Review,
        *,
        ttl: float,
        max_entries: int = MAX_VERDICTS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._review = review
        self.ttl = ttl
        self.max_entries = max_entries
        self._clock = clock
        # key -> (verdict, until); insertion order is expiry order (one ttl for all).
        self._verdicts: dict[AccessKey, tuple[Verdict, float]] = {}
        self._pending: dict[AccessKey, asyncio.Task[Verdict]] = {}
        self.reviews = 0  # reviews started

    def cached(self, key: AccessKey) -> Verdict | None:
        """The verdict kept for ``key``, None when there is none or it is ``ttl`` old."""
        kept = self._verdicts.get(key)
        if kept is None:
            return None
        verdict, until = kept
        if self._clock() < until:
            return verdict
        del self._verdicts[key]
        return None

    def __len__(self) -> int:
        return len(self._verdicts)

    async def check(self, identity: str, attributes: Attributes, credential: str) -> Verdict:
        """The verdict for ``identity`` (the digest of ``credential``) on ``attributes``."""
        key = AccessKey(identity, attributes)
        verdict = self.cached(key)
        if verdict is not None:
            return verdict
        task = self._pending.get(key)
        if task is None:
            self.reviews += 1
            task = asyncio.ensure_future(self._reviewed(key, credential))
            self._pending[key] = task
        # Shielded: a waiter cancelled (its client left) leaves the review to the others.
        return await asyncio.shield(task)

    async def _reviewed(self, key: AccessKey, credential: str) -> Verdict:
        try:
            verdict = await self._review(key.attributes, credential)
        finally:
            self._pending.pop(key, None)
        if verdict.lasting and self.ttl > 0:
            self._keep(key, verdict)
        return verdict

    def _keep(self, key: AccessKey, verdict: Verdict) -> None:
        verdicts = self._verdicts
        verdicts.pop(key, None)
        if len(verdicts) >= self.max_entries:
            now = self._clock()
            for old in [k for k, (_, until) in verdicts.items() if until <= now]:
                del verdicts[old]
            while len(verdicts) >= self.max_entries:
                del verdicts[next(iter(verdicts))]
        verdicts[key] = (verdict, self._clock() + self.ttl)

    async def close(self) -> None:
        """End the reviews still running."""
        tasks = list(self._pending.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pending.clear()
