"""The one way to send a request to the apiserver: credentials, TLS, timeouts, rate limits.

Every request the proxy makes upstream — pass-through, a shared watch, a LIST, an upgrade —
goes through :meth:`Upstream.open` (or :meth:`Upstream.open_upgrade`, the same path), which
waits for the rate limiter, injects the proxy's own credential, re-reads a rotated token on a
401, honours an upstream 429's ``Retry-After`` for everything that follows, and keeps the
up/down state that ``/readyz`` and the metrics report. Three layers from here to the socket:
this client, the pool (``upstream.pool``: the one dial path) and the connection
(``upstream.connection``: llhttp framing).
"""

from __future__ import annotations

import logging
import ssl
import time
from collections.abc import Mapping

from yarl import URL

from watchproxy.config import UpstreamConfig
from watchproxy.errors import (
    BadRequest,
    ProxyError,
    TooManyRequests,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from watchproxy.metrics import Metrics
from watchproxy.policy.adaptive import Outcome
from watchproxy.policy.ratelimit import UpstreamLimiter, parse_retry_after
from watchproxy.upstream.connection import Broken
from watchproxy.upstream.connectivity import NO_PROBER, ProbeFailed, Prober
from watchproxy.upstream.credentials import UpstreamTarget
from watchproxy.upstream.http1 import HeaderBlock, encode_request
from watchproxy.upstream.pool import PROBING, ConnectionPool, DialFailed, UpstreamDown
from watchproxy.upstream.response import UpstreamResponse

__all__ = ["Upstream", "UpstreamResponse", "describe", "outcome_of"]

log = logging.getLogger("watchproxy.upstream")

# How long close() waits for connections cut mid-response to finish their TLS shutdown.
CLOSE_WAIT_SECONDS = 2.0

# client-go retries a 503 that carries a Retry-After up to 10 times, sleeping what it says each
# time, and kubectl's discovery repeats that per attempt: with the prober's own delay (up to
# backoff.max_seconds) kubectl hung for minutes. So a request that really failed upstream gets
# Retry-After: 1 (a blip may be over by then), and while the apiserver is known to be down a
# request is refused with no Retry-After at all: client-go gives up at once and kubectl prints
# the Status message, which says what is wrong and when watchproxy checks again.
RETRY_AFTER = 1.0

# Methods the pool may send a second time when a reused connection turned out closed before
# any answer came (RFC 9110 section 9.2.2: the idempotent ones).
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})

# A refused upgrade's body is a Status of a few hundred bytes; a bigger one is cut, never
# buffered unbounded.
MAX_REFUSAL_BYTES = 1 << 20


class Upstream:
    """A client of one apiserver, shared by every component of the proxy."""

    def __init__(
        self,
        target: UpstreamTarget,
        config: UpstreamConfig,
        *,
        limiter: UpstreamLimiter,
        metrics: Metrics,
        max_wait: float = 5.0,
    ) -> None:
        self.target = target
        self.config = config
        self.limiter = limiter
        self.metrics = metrics
        self.max_wait = max_wait
        # The limiter's clock: it compares send times with the times of its cuts.
        self._clock = limiter.clock
        # The prober (app.py wires it after both exist: it probes through this client).
        self.connectivity: Prober = NO_PROBER
        server = URL(target.server)
        assert server.host is not None and server.port is not None, target.server
        self._host_header = server.raw_authority.rpartition("@")[2]
        self._path_prefix = server.raw_path.rstrip("/")
        self._secure = server.scheme == "https"
        self._default_ssl: ssl.SSLContext | None = None
        self._dial_host = (server.raw_host or server.host).strip("[]")
        self._dial_port = server.port
        self._pool: ConnectionPool | None = None

    async def start(self) -> None:
        self._pool = pool = ConnectionPool(
            self._dial_host,
            self._dial_port,
            is_down=lambda: self.connectivity.down,
            on_failure=self._dial_failed,
            on_dial=self.metrics.upstream_connection_attempts.inc,
            on_reused_descriptor=self.metrics.reused_descriptors.inc,
        )
        self.metrics.count_upstream_connections(pool.open_connections)
        self.metrics.upstream_concurrency_limit.set_function(lambda: self.limiter.concurrency_limit)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close(CLOSE_WAIT_SECONDS)
            self._pool = None
        self.target.close()

    def close_idle_connections(self) -> None:
        """Close the pooled keep-alive connections no request is using now."""
        if self._pool is not None:
            self._pool.close_idle()

    def _credential(self, forwarded_auth: str | None) -> str | None:
        """The Authorization a request carries: the proxy's own, or in forward mode the
        client's ("" = the client sent none, so the request goes anonymous: None)."""
        return self.target.auth_header() if forwarded_auth is None else forwarded_auth or None

    def _next_probe(self) -> float:
        return self.connectivity.retry_after()

    def _answered(self) -> None:
        """Any HTTP answer proves the apiserver reachable."""
        self.connectivity.report_ok()

    def _dial_failed(self, error: BaseException) -> None:
        """A new connection failed (the connector calls this before the next dial may start)."""
        self.connectivity.report_dial_failure(describe(error))

    def _suspect(self, reason: str) -> None:
        """A request failed on an established connection: that proves nothing about the
        apiserver as a whole (a slow request, a pooled connection that went stale), so the
        upstream stays up and the prober checks now."""
        self.connectivity.suspect(reason)

    def _failed(self, error: BaseException, *, dial_reported: bool = False) -> UpstreamUnavailable:
        """This request got no answer. A failed dial was already reported (by the connector,
        or by the caller: ``dial_reported``); an established connection that broke only raises
        a suspicion."""
        if not dial_reported and not isinstance(error, DialFailed):
            self._suspect(describe(error))
        return UpstreamUnavailable(
            f"the apiserver did not answer: {describe(error)}", retry_after=RETRY_AFTER
        )

    def _timed_out(self, method: str, path_qs: str) -> UpstreamTimeout:
        """No answer in time. One slow request is not an outage: it fails alone."""
        self._suspect(f"{method} timed out")
        self.metrics.upstream_errors.labels("timeout").inc()
        return UpstreamTimeout(f"the apiserver did not answer {method} {path_qs} in time")

    def _unavailable(self) -> UpstreamUnavailable:
        """Refused locally while the upstream is known to be down: at once, with the cause."""
        cause = self.connectivity.last_error
        return UpstreamUnavailable(
            f"the apiserver is unreachable ({cause or 'no answer'}); watchproxy checks again "
            f"on its backoff schedule, next in {self._next_probe():.0f}s"
        )

    async def open(
        self,
        method: str,
        path_qs: str,
        *,
        headers: Mapping[str, str] | HeaderBlock | None = None,
        body: bytes | None = None,
        verb: str = "get",
        streaming: bool = False,
        read_timeout: float | None = None,
        wait: bool = True,
        forwarded_auth: str | None = None,
        probe: bool = False,
        deadline: float | None = None,
    ) -> UpstreamResponse:
        """Send one request and return its answer with the body unread (the caller ends it).

        The response headers must come within ``deadline`` (default: the request timeout; for
        ``streaming`` requests, ``read_timeout``). After that no total deadline applies — a long
        list keeps flowing — only a limit on silence between two reads: ``read_timeout`` for
        streams (None: none), the request timeout otherwise.
        ``forwarded_auth`` replaces the proxy's own credential (``security.identity: forward``).
        ``headers`` as a HeaderBlock (no Authorization among them) are encoded once for all the
        requests that send them.
        Raises UpstreamUnavailable / UpstreamTimeout when no HTTP answer comes.
        """
        if not probe and self.connectivity.down:
            # Fail fast while the prober waits out the backoff: piling up requests on a dead
            # apiserver helps nobody, and the attempt count must follow one schedule.
            raise self._unavailable()
        if not streaming:
            read_timeout = self.config.request_timeout_seconds
        if deadline is None:
            # A stream's head may take as long as any silence in its body: a hung apiserver
            # that never answers a watch is found as one that stops sending mid-stream is.
            deadline = self.config.request_timeout_seconds if not streaming else read_timeout
        for attempt in range(2):
            if forwarded_auth is None and self.target.exec_source is not None:
                await self.target.refresh()  # an exec plugin's credential, when it is due
            auth = self._credential(forwarded_auth)
            response = await self._send(
                method, path_qs, headers or {}, body, auth, verb=verb, wait=wait,
                streaming=streaming, read_timeout=read_timeout, deadline=deadline,
            )  # fmt: skip
            if (
                response.status == 401
                and attempt == 0
                and forwarded_auth is None
                and self.target.invalidate(auth)
            ):
                # A rotated token file or an exec credential the apiserver no longer takes:
                # get a fresh one and try once more.
                response.cut()
                continue
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    async def _send(
        self,
        method: str,
        path_qs: str,
        headers: Mapping[str, str] | HeaderBlock,
        body: bytes | None,
        auth: str | None,
        *,
        verb: str,
        wait: bool,
        streaming: bool,
        read_timeout: float | None,
        deadline: float | None,
        upgrade: bool = False,
    ) -> UpstreamResponse:
        """One attempt: admitted by the limiter, sent on the pool, its outcome recorded."""
        pool = self._pool
        assert pool is not None, "Upstream.start() was not called"
        try:
            data = encode_request(
                method, self._path_prefix + path_qs, self._host_header, headers, body, auth
            )
        except ValueError as error:
            raise BadRequest(str(error)) from None
        sent = self._clock()  # set again once admitted
        try:
            # Nothing to wait for is the common case: admitted at once, without a context manager.
            if not self.limiter.admit_now():
                waited = await self.limiter.admit(max_wait=self.max_wait if not wait else None)
                if waited:
                    self.metrics.ratelimit_wait.inc(waited)
            try:
                sent = self._clock()
                response = await pool.request(
                    data, ssl_context=self._ssl_context(), head_request=method == "HEAD",
                    connect_timeout=self.config.connect_timeout_seconds,
                    may_resend=method in IDEMPOTENT and not upgrade, read_timeout=read_timeout,
                    deadline=deadline, upgrade=upgrade,
                )  # fmt: skip
            finally:
                self.limiter.release()
        except UpstreamDown:
            raise self._unavailable() from None
        except TooManyRequests:
            self.metrics.throttled.labels("upstream").inc()
            raise
        except TimeoutError:
            self._record(Outcome.TIMEOUT, sent=sent)
            raise self._timed_out(method, path_qs) from None
        except DialFailed as failed:
            self.metrics.upstream_errors.labels(
                "tls" if isinstance(failed.cause, ssl.SSLError) else "connect"
            ).inc()
            raise self._failed(failed) from None
        except (OSError, Broken) as exc:
            # An answer cut off on an open connection is the apiserver in trouble (a dial that
            # failed is the outage path's business: one back-off schedule).
            self.metrics.upstream_errors.labels("connect").inc()
            self._record(Outcome.BROKEN, sent=sent)
            raise self._failed(exc) from None
        # Any HTTP answer means the apiserver is reachable, even a 5xx from it.
        self._answered()
        took = self._clock() - sent
        status = response.status
        self.metrics.upstream_requests_by(verb, str(status)).inc()
        self.metrics.upstream_request_duration_by(verb).observe(took)
        retry_after = None
        if status == 429:
            self.metrics.upstream_throttled.inc()
            delay = parse_retry_after(response.headers.get("Retry-After"), time.time())
            retry_after = delay if delay is not None else 1.0
        self._record(
            outcome_of(response),
            kind=verb,
            # A stream's headers come before its work: their time says nothing of load.
            latency=None if streaming else took,
            retry_after=retry_after,
            sent=sent,
        )
        return response

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self._secure:
            return None
        if self.target.ssl_context is not None:
            return self.target.ssl_context  # replaced when a certificate rotates
        if self._default_ssl is None:
            self._default_ssl = ssl.create_default_context()
        return self._default_ssl

    def _record(
        self,
        outcome: Outcome,
        *,
        kind: str = "",
        latency: float | None = None,
        retry_after: float | None = None,
        sent: float,
    ) -> None:
        """Feed the adaptive concurrency limit; its metrics follow when it moves."""
        if self.limiter.record(
            outcome, kind=kind, latency=latency, retry_after=retry_after, sent=sent
        ):
            adaptive = self.limiter.adaptive
            assert adaptive is not None
            self.metrics.note_concurrency_limit_change(adaptive.reason.value)

    async def open_upgrade(
        self,
        method: str,
        path_qs: str,
        *,
        headers: Mapping[str, str],
        forwarded_auth: str | None = None,
    ) -> UpstreamResponse:
        """Send an upgrade request (exec, attach, port-forward) as the proxy and read the
        answer's head: a 101 whose byte stream :meth:`UpstreamResponse.take_stream` hands over,
        or the apiserver's refusal (its body bounded). ``headers`` carry the client's
        Connection/Upgrade and protocol headers. Its owner ends it with ``await close()``."""
        if self.connectivity.down:
            raise self._unavailable()
        if forwarded_auth is None:
            await self.target.refresh()
        response = await self._send(
            method, path_qs, headers, None, self._credential(forwarded_auth), verb="connect",
            wait=False, streaming=True, read_timeout=self.config.request_timeout_seconds,
            deadline=self.config.request_timeout_seconds, upgrade=True,
        )  # fmt: skip
        if not response.switched:
            response.max_body = MAX_REFUSAL_BYTES
        return response

    async def probe(self) -> bool:
        """One reachability check (used by the connectivity prober only); raises ProbeFailed
        with the reason an operator should read when there is no usable answer."""
        token = PROBING.set(True)
        try:
            response = await self.open(
                "GET",
                "/readyz",
                verb="get",
                probe=True,
                wait=True,
                deadline=self.config.connect_timeout_seconds,
            )
        except ProxyError as error:
            raise ProbeFailed(
                error.message.removeprefix("the apiserver did not answer: ")
            ) from None
        finally:
            PROBING.reset(token)
        response.release()
        if response.status >= 500:
            raise ProbeFailed(f"the apiserver answered /readyz with {response.status}")
        return True


def outcome_of(answer: UpstreamResponse) -> Outcome:
    """What an answer says about the apiserver's load.

    429 is API Priority and Fairness (or the max-in-flight filter) refusing work. A 5xx counts
    only when it speaks of overload: 504 (the apiserver's own request timeout, or a gateway's)
    and any 5xx that asks to retry later. A 503 without Retry-After is most often an aggregated
    API that is not there (a missing metrics-server answers every discovery with one): cutting
    the limit for that would throttle the whole pod for one broken extension.
    """
    status = answer.status
    if status == 429:
        return Outcome.THROTTLED
    # The headers only for a 5xx: a pooled answer's fields are parsed when first read.
    if status == 504 or (status >= 500 and "Retry-After" in answer.headers):
        return Outcome.OVERLOADED
    return Outcome.OK


def describe(error: BaseException) -> str:
    """A short, credential-free cause for logs and Status messages (a failed dial is worded
    by ``pool.dial_cause``)."""
    if isinstance(error, TimeoutError):
        return "timed out"
    if isinstance(error, DialFailed | Broken):
        return str(error)
    return f"{type(error).__name__}: {error}"
