"""Forward identity mode: the hub serves shared state only to a client the apiserver would serve.

The I/O around ``policy.authorization``: each request the hub would answer from shared state (a
watch, a LIST with resourceVersion=0, a consistent LIST) is first authorized with a
``SelfSubjectAccessReview`` sent upstream with the client's own credential, through the same
upstream client, rate limiter and connection pool as every other request. The verdict is kept
for ``security.authorization_cache_seconds`` per (credential digest, request attributes).

- allowed: the hub serves the request;
- denied: the client gets the apiserver's own 403 ``Status`` (its message names the user, read
  once per denial with a ``SelfSubjectReview``), without a request upstream for the next
  ``ttl`` seconds;
- anything else (the review got no answer, a 5xx or a 429; the credential is not accepted; the
  user name could not be read; a client that reads only protobuf or CBOR): the request passes
  through, and the apiserver answers it. Nothing is served from shared state on a verdict the
  apiserver did not give.

Not built at all in the default identity mode (``serviceaccount``): there every client is the
proxy, which the apiserver authorized when the shared watch started.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
from typing import Any

from multidict import CIMultiDict

from watchproxy.errors import ProxyError
from watchproxy.hub.watchkey import identity_of
from watchproxy.kube.apipath import ApiPath
from watchproxy.kube.headers import Headers, forwarded_credential
from watchproxy.kube.requestinfo import selector_name
from watchproxy.kube.watchquery import WatchQuery
from watchproxy.lists.answers import Answer
from watchproxy.metrics import Metrics
from watchproxy.policy.authorization import (
    REVIEW_PATH,
    UNANSWERED,
    WHOAMI_BODY,
    WHOAMI_PATH,
    Attributes,
    Authorizer,
    Decision,
    Verdict,
    forbidden_status,
    review_body,
    username_of,
    verdict_of,
)
from watchproxy.upstream.client import Upstream

log = logging.getLogger("watchproxy.authorization")

_REVIEW_HEADERS = {"Content-Type": "application/json", "Accept": "application/json"}
# An answer bigger than this is not a review's.
_MAX_ANSWER_BYTES = 64 * 1024


class SharedAccess:
    """Whether a client may be served from shared state; owns the authorizer's reviews."""

    def __init__(self, upstream: Upstream, *, ttl: float, metrics: Metrics) -> None:
        self.upstream = upstream
        self.metrics = metrics
        self.authorizer = Authorizer(self._review, ttl=ttl)
        # Looked up once: every request for shared state counts one.
        self._verdicts = {d: metrics.authorization_verdicts.labels(d.value) for d in Decision}

    async def admit(
        self, headers: Headers, verb: str, api_path: ApiPath, query: WatchQuery | None
    ) -> Answer | bool:
        """True: serve the request from shared state. False: pass it through (the apiserver
        answers it). A response: the apiserver's 403 for it, to send as it is."""
        credential = forwarded_credential(headers, True) or ""
        attributes = attributes_of(verb, api_path, query)
        verdict = await self.authorizer.check(identity_of(credential, True), attributes, credential)
        decision = verdict.decision
        if decision is Decision.DENIED and not _reads_json(headers.get("Accept")):
            decision = Decision.PASS  # the apiserver answers in the encoding the client reads
        self._verdicts[decision].inc()
        if decision is Decision.ALLOWED:
            return True
        if decision is Decision.PASS:
            return False
        body = json.dumps(forbidden_status(attributes, verdict)).encode()
        headers = CIMultiDict(
            {"Content-Type": "application/json", "X-Content-Type-Options": "nosniff"}
        )
        return Answer(403, "Forbidden", headers, body)

    async def _review(self, attributes: Attributes, credential: str) -> Verdict:
        body = json.dumps(review_body(attributes)).encode()
        status, answer = await self._post(REVIEW_PATH, body, credential)
        verdict = UNANSWERED if status is None else verdict_of(status, answer)
        if verdict.decision is Decision.DENIED:
            who_status, who = await self._post(WHOAMI_PATH, WHOAMI_BODY, credential)
            name = None if who_status is None else username_of(who_status, who)
            if name is None:
                # Without the user's name the apiserver's message cannot be written: let it
                # answer (again after the ttl if the apiserver did answer, at once if not).
                verdict = dataclasses.replace(UNANSWERED, lasting=who_status is not None)
            else:
                verdict = dataclasses.replace(verdict, username=name)
        outcome = verdict.decision.value if verdict.lasting else "unanswered"
        self.metrics.authorization_reviews.labels(outcome).inc()
        return verdict

    async def _post(self, path: str, body: bytes, credential: str) -> tuple[int | None, Any]:
        """POST ``body`` to ``path`` as ``credential``: the status and the parsed answer, or
        (None, None) when no answer came. Errors name the path, never the credential."""
        try:
            response = await self.upstream.open(
                "POST",
                path,
                headers=_REVIEW_HEADERS,
                body=body,
                verb="create",
                wait=False,
                forwarded_auth=credential,
            )
        except ProxyError as error:
            log.info("an access review got no answer (%s): %s", path, error.message)
            return None, None
        ended = False
        try:
            raw = response.whole_body()
            if raw is None:
                length = response.content_length
                if length is not None and length > _MAX_ANSWER_BYTES:
                    return None, None
                raw = await response.read()
            ended = True
        except ProxyError as error:
            log.info("an access review's answer broke (%s): %s", path, error.message)
            return None, None
        finally:
            if ended:
                response.release()
            else:
                response.cut()
        try:
            return response.status, json.loads(raw)
        except ValueError:
            return response.status, None

    async def close(self) -> None:
        await self.authorizer.close()


# A pod's programs ask for the same few collections over and over: each request's attributes
# are worked out once (ApiPath and WatchQuery are immutable values).
@functools.lru_cache(maxsize=1024)
def attributes_of(verb: str, api_path: ApiPath, query: WatchQuery | None) -> Attributes:
    """The attributes the apiserver authorizes ``verb`` on ``api_path`` with ``query`` by."""
    name = api_path.name or ""
    label_selector = field_selector = ""
    if query is not None and verb in ("list", "watch"):
        label_selector = query.label_selector_canonical
        field_selector = query.field_selector_canonical
        if not name:
            name = selector_name(query.field_selector)
    return Attributes(
        verb=verb,
        group=api_path.group,
        version=api_path.version,
        resource=api_path.resource or "",
        subresource=api_path.subresource or "",
        namespace=api_path.namespace or "",
        name=name,
        label_selector=label_selector,
        field_selector=field_selector,
    )


def _reads_json(accept: str | None) -> bool:
    """Whether the apiserver would answer an error to this ``Accept`` in JSON: it picks the
    first media type it serves, so one asking for protobuf or CBOR first gets that."""
    if not accept:
        return True
    for part in accept.split(","):
        media = part.split(";", 1)[0].strip().lower()
        if media in ("application/json", "*/*", "application/*", ""):
            return True
        if "protobuf" in media or "cbor" in media or "yaml" in media:
            return False
    return True
