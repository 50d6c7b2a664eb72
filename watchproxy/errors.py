"""Named errors and the Kubernetes ``metav1.Status`` bodies they turn into at the edge.

Every failure the proxy distinguishes for a client is a :class:`ProxyError` subclass raised where
it is detected and turned into a Status once, by the API port (``server.http.status_answer``);
the upstream client's failures (a dial, a broken or silent answer) are mapped to these once, at
the upstream boundary (``watchproxy.upstream.client``, ``watchproxy.upstream.response``). A 410
for a too-old resourceVersion is not an exception: it is an in-stream ERROR event, the
apiserver's own (the hub passes such watches through) or, for a resourceVersion a relist made
ambiguous, one the hub writes (``hub.watchcache``).
"""

from __future__ import annotations

import json
from typing import Any, ClassVar


def status_object(code: int, reason: str, message: str, **details: Any) -> dict[str, Any]:
    """A ``metav1.Status`` of failure, as the apiserver writes it."""
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        status["details"] = details
    return status


def status_bytes(code: int, reason: str, message: str, **details: Any) -> bytes:
    return json.dumps(status_object(code, reason, message, **details)).encode()


class ProxyError(Exception):
    """An error that has a Kubernetes Status answer. Subclasses set code and reason."""

    # Class constants, declared so: mypyc compiles a subclass's plain ``code = 422`` as the
    # default of an instance attribute that is never set, and the class kept 400
    # (kube/watchquery.InvalidListOptions answered 400 BadRequest instead of 422 Invalid).
    code: ClassVar[int] = 500
    reason: ClassVar[str] = "InternalError"
    # The answer closes the client's connection: after this error, what the client sends next
    # cannot be told apart from the rest of this request.
    closes_connection: ClassVar[bool] = False

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after = retry_after

    def retry_after_seconds(self) -> int | None:
        """``retry_after`` as an answer states it: whole seconds, at least 1 (None: none)."""
        return None if self.retry_after is None else max(1, round(self.retry_after))

    def status(self) -> dict[str, Any]:
        details: dict[str, Any] = {}
        if self.retry_after is not None:
            details["retryAfterSeconds"] = self.retry_after_seconds()
        return status_object(self.code, self.reason, self.message, **details)


class BadRequest(ProxyError):
    code = 400
    reason = "BadRequest"


class Forbidden(ProxyError):
    code = 403
    reason = "Forbidden"


class BodyTimeout(ProxyError):
    """A request body stopped arriving (``limits.body_timeout_seconds``): the request gets a
    408 and its connection is closed, since what the client sends next cannot be framed."""

    code = 408
    reason = "Timeout"
    closes_connection = True


class FaultyFraming(BadRequest):
    """A message whose body framing cannot be trusted (RFC 9112 section 6.1: an HTTP/1.0
    request with Transfer-Encoding): refused, and its connection closed."""

    closes_connection = True


class PayloadTooLarge(ProxyError):
    code = 413
    reason = "RequestEntityTooLarge"


class TooManyRequests(ProxyError):
    """The proxy itself throttled the client (its own limits, or an upstream Retry-After)."""

    code = 429
    reason = "TooManyRequests"


class BodiesBusy(ProxyError):
    """The proxy holds as many client request bodies as its budget allows: send again soon."""

    code = 503
    reason = "ServiceUnavailable"


class UpstreamUnavailable(ProxyError):
    """The apiserver cannot be reached now; the proxy fails fast instead of piling up."""

    code = 503
    reason = "ServiceUnavailable"


class UpstreamBodyTooLarge(UpstreamUnavailable):
    """A compressed upstream answer that inflates past what its reader may hold (a page of a
    LIST bigger than the hub's whole cache budget, or a gzip bomb)."""


class UpstreamTimeout(ProxyError):
    code = 504
    reason = "Timeout"
