"""The one way to send a request to the apiserver: credentials, TLS, timeouts, rate limits.

Every request the proxy makes upstream — pass-through or a shared watch — goes through
:meth:`Upstream.open`, which waits for the rate limiter, injects the proxy's own credential,
re-reads a rotated token on a 401, honours an upstream 429's ``Retry-After`` for everything
that follows, and keeps the up/down state that ``/readyz`` and the metrics report.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from collections.abc import Mapping

import aiohttp
from multidict import CIMultiDict

from watchproxy.config import UpstreamConfig
from watchproxy.errors import (
    ProxyError,
    TooManyRequests,
    UpstreamTimeout,
    UpstreamUnavailable,
)
from watchproxy.metrics import Metrics
from watchproxy.policy.adaptive import Outcome
from watchproxy.policy.ratelimit import UpstreamLimiter, parse_retry_after
from watchproxy.upstream.bodies import LineTooLong, read_frames, read_lines
from watchproxy.upstream.connectivity import NO_PROBER, ProbeFailed, Prober
from watchproxy.upstream.connector import PROBING, DialFailed, UpstreamDown
from watchproxy.upstream.credentials import UpstreamTarget
from watchproxy.upstream.http1 import Broken, HeaderBlock
from watchproxy.upstream.response import UpstreamResponse
from watchproxy.upstream.transports import Transports, describe, outcome_of
from watchproxy.upstream.upgrade import BadAnswer, UpgradeAnswer, open_upgrade

# read_lines, read_frames and LineTooLong live in upstream.bodies; named here for their callers.
__all__ = [
    "LineTooLong",
    "Upstream",
    "UpstreamResponse",
    "describe",
    "outcome_of",
    "read_frames",
    "read_lines",
]

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

# Failures of a dial, which the dialer reports itself. A tuple at module level: mypyc compiles
# `name = A | B` inside a function as a type alias and never assigns the local.
_DIAL_ERRORS = (aiohttp.ClientConnectorError, UpstreamDown, DialFailed)


async def _exchange(
    transports: Transports,
    method: str,
    path_qs: str,
    headers: CIMultiDict[str] | HeaderBlock,
    body: bytes | None,
    read_timeout: float | None,
    *,
    streaming: bool,
    deadline: float | None,
    auth: str | None,
) -> UpstreamResponse:
    """One admitted request's answer head, within ``deadline`` seconds (else TimeoutError): a
    one-shot request on the pool (``auth`` goes beside a HeaderBlock), or a stream."""
    if not streaming:
        return await transports.send(
            method, path_qs, headers, body, read_timeout, deadline, auth=auth
        )
    assert not isinstance(headers, HeaderBlock), "a stream's headers are a CIMultiDict"
    stream = transports.stream(method, path_qs, headers, body, read_timeout)
    if deadline is None:
        return await stream
    async with asyncio.timeout(deadline):
        return await stream


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
        self._transports: Transports | None = None

    async def start(self) -> None:
        self._transports = Transports(
            self.target,
            self.config,
            is_down=lambda: self.connectivity.down,
            on_dial_failure=self._dial_failed,
            metrics=self.metrics,
        )
        self.metrics.upstream_concurrency_limit.set_function(lambda: self.limiter.concurrency_limit)

    async def close(self) -> None:
        if self._transports is not None:
            await self._transports.close(CLOSE_WAIT_SECONDS)
            self._transports = None
        self.target.close()

    def close_idle_connections(self) -> None:
        """Close the pooled keep-alive connections no request is using now."""
        if self._transports is not None:
            self._transports.pool.close_idle()

    def _credential(self, forwarded_auth: str | None) -> str | None:
        """The Authorization a request carries: the proxy's own, or in forward mode the
        client's ("" = the client sent none, so the request goes anonymous: None)."""
        return self.target.auth_header() if forwarded_auth is None else forwarded_auth or None

    def _with_credential(
        self, headers: Mapping[str, str] | CIMultiDict[str] | None, auth: str | None
    ) -> CIMultiDict[str]:
        """The request headers plus the credential ``auth`` (None: none)."""
        send_headers: CIMultiDict[str] = CIMultiDict(headers or {})
        if auth is not None:
            send_headers["Authorization"] = auth
        return send_headers

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
        if not dial_reported and not isinstance(error, _DIAL_ERRORS):
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
        headers: Mapping[str, str] | CIMultiDict[str] | HeaderBlock | None = None,
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
        ``streaming`` requests, none). After that no total deadline applies — a long list keeps
        flowing — only a limit on silence between two reads: ``read_timeout`` for streams (None:
        none), the request timeout otherwise.
        A stream goes through aiohttp's client; anything else through a pooled keep-alive
        connection (``upstream.pool``: one write per request, no per-request objects).
        ``forwarded_auth`` replaces the proxy's own credential (``security.identity: forward``).
        ``headers`` as a HeaderBlock (no Authorization among them) are encoded once for all the
        requests that send them.
        Raises UpstreamUnavailable / UpstreamTimeout when no HTTP answer comes.
        """
        transports = self._transports
        assert transports is not None, "Upstream.start() was not called"
        if not probe and self.connectivity.down:
            # Fail fast while the prober waits out the backoff: piling up requests on a dead
            # apiserver helps nobody, and the attempt count must follow one schedule.
            raise self._unavailable()
        if deadline is None and not streaming:
            deadline = self.config.request_timeout_seconds
        if not streaming:
            read_timeout = self.config.request_timeout_seconds
        for attempt in range(2):
            if forwarded_auth is None and self.target.exec_source is not None:
                await self.target.refresh()  # an exec plugin's credential, when it is due
            auth = self._credential(forwarded_auth)
            send_headers: CIMultiDict[str] | HeaderBlock
            if isinstance(headers, HeaderBlock) and not streaming:
                send_headers = headers  # encoded once; the credential goes beside it
            else:
                fields = headers.fields if isinstance(headers, HeaderBlock) else headers
                send_headers = self._with_credential(fields, auth)
            sent = self._clock()  # set again once admitted
            try:
                if self.limiter.admit_now():  # nothing to wait for: no context manager either
                    try:
                        sent = self._clock()
                        response = await _exchange(
                            transports, method, path_qs, send_headers, body, read_timeout,
                            streaming=streaming, deadline=deadline, auth=auth,
                        )  # fmt: skip
                    finally:
                        self.limiter.release()
                else:
                    async with self.limiter.slot(
                        max_wait=self.max_wait if not wait else None
                    ) as waited:
                        if waited:
                            self.metrics.ratelimit_wait.inc(waited)
                        sent = self._clock()
                        response = await _exchange(
                            transports, method, path_qs, send_headers, body, read_timeout,
                            streaming=streaming, deadline=deadline, auth=auth,
                        )  # fmt: skip
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
            except aiohttp.ClientSSLError as exc:
                self.metrics.upstream_errors.labels("tls").inc()
                raise self._failed(exc) from None
            except (aiohttp.ClientError, OSError, Broken) as exc:
                self.metrics.upstream_errors.labels("connect").inc()
                if not isinstance(exc, aiohttp.ClientConnectorError):
                    # A dial that failed is the outage path's business (one back-off schedule);
                    # an answer cut off on an open connection is the apiserver in trouble.
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
            if (
                status == 401
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
        headers: CIMultiDict[str],
        forwarded_auth: str | None = None,
    ) -> UpgradeAnswer:
        """Send an upgrade request (exec, attach, port-forward) as the proxy and read the
        answer's head: a 101 with its byte stream open, or the apiserver's refusal.
        ``headers`` carry the client's Connection/Upgrade and protocol headers."""
        if self.connectivity.down:
            raise self._unavailable()
        if forwarded_auth is None:
            await self.target.refresh()
        send_headers = self._with_credential(headers, self._credential(forwarded_auth))
        try:
            async with self.limiter.slot(max_wait=self.max_wait):
                self.metrics.upstream_connection_attempts.inc()
                answer = await open_upgrade(
                    self.target.server,
                    self.target.ssl_context,
                    method,
                    path_qs,
                    send_headers,
                    connect_timeout=self.config.connect_timeout_seconds,
                    answer_timeout=self.config.request_timeout_seconds,
                )
        except DialFailed as failed:
            self.metrics.upstream_errors.labels("connect").inc()
            self._dial_failed(failed)
            raise self._failed(failed, dial_reported=True) from None
        except TimeoutError:
            raise self._timed_out(method, path_qs) from None
        except (BadAnswer, OSError) as exc:
            self.metrics.upstream_errors.labels("connect").inc()
            raise self._failed(exc) from None
        self._answered()
        self.metrics.upstream_requests.labels("connect", str(answer.status)).inc()
        return answer

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
