"""The one way to send a request to the apiserver: credentials, TLS, timeouts, rate limits.

Every request the proxy makes upstream — pass-through or a shared watch — goes through
:meth:`Upstream.open`, which waits for the rate limiter, injects the proxy's own credential,
re-reads a rotated token on a 401, honours an upstream 429's ``Retry-After`` for everything
that follows, and keeps the up/down state that ``/readyz`` and the metrics report.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable, Mapping

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from watchproxy.config import UpstreamConfig
from watchproxy.errors import TooManyRequests, UpstreamTimeout, UpstreamUnavailable
from watchproxy.kube.credentials import UpstreamTarget
from watchproxy.metrics import Metrics
from watchproxy.policy.ratelimit import UpstreamLimiter, parse_retry_after
from watchproxy.upstream.connectivity import Connectivity
from watchproxy.upstream.connector import PROBING, SerialConnector, UpstreamDown

log = logging.getLogger("watchproxy.upstream")


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
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.target = target
        self.config = config
        self.limiter = limiter
        self.metrics = metrics
        self.max_wait = max_wait
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self.connectivity: Connectivity | None = None

    async def start(self) -> None:
        connector = SerialConnector(
            is_down=lambda: self.connectivity is not None and self.connectivity.down,
            on_failure=lambda error: self._mark(False, describe(error)),
            on_dial=self.metrics.upstream_connection_attempts.inc,
            ssl=self.target.ssl_context if self.target.ssl_context is not None else False,
            limit=0,
            ttl_dns_cache=30,
        )
        self.metrics.count_upstream_connections(connector.open_connections)
        # auto_decompress off: bodies pass through byte for byte with their Content-Encoding.
        self._session = aiohttp.ClientSession(
            base_url=None,
            connector=connector,
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            read_bufsize=2**18,
            max_line_size=65536,
            max_field_size=65536,
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
        self.target.close()

    def _with_credential(
        self,
        headers: Mapping[str, str] | CIMultiDict[str] | None,
        forwarded_auth: str | None,
    ) -> CIMultiDict[str]:
        """The request headers plus the credential: the proxy's own, or in forward mode the
        client's ("" = the client sent none, so the request goes anonymous)."""
        send_headers: CIMultiDict[str] = CIMultiDict(headers or {})
        auth = self.target.auth_header() if forwarded_auth is None else forwarded_auth or None
        if auth is not None:
            send_headers["Authorization"] = auth
        return send_headers

    def _retry_after(self) -> float:
        return self.connectivity.retry_after() if self.connectivity is not None else 1.0

    def _mark(self, ok: bool, reason: str | None = None) -> None:
        if self.connectivity is not None:
            if ok:
                self.connectivity.report_ok()
            else:
                self.connectivity.report_unreachable(reason)

    def _unavailable(self) -> UpstreamUnavailable:
        cause = self.connectivity.last_error if self.connectivity is not None else None
        return UpstreamUnavailable(
            f"the apiserver is unreachable ({cause or 'no answer'}); "
            "watchproxy is retrying on its backoff schedule",
            retry_after=self._retry_after(),
        )

    async def open(
        self,
        method: str,
        path_qs: str,
        *,
        headers: Mapping[str, str] | CIMultiDict[str] | None = None,
        body: bytes | None = None,
        verb: str = "get",
        streaming: bool = False,
        read_timeout: float | None = None,
        wait: bool = True,
        forwarded_auth: str | None = None,
        probe: bool = False,
    ) -> aiohttp.ClientResponse:
        """Send one request and return the response with its body unread (caller releases it).

        ``streaming`` requests get no total deadline, only ``read_timeout`` between reads.
        ``forwarded_auth`` replaces the proxy's own credential (``security.identity: forward``).
        Raises UpstreamUnavailable / UpstreamTimeout when no HTTP answer comes.
        """
        assert self._session is not None, "Upstream.start() was not called"
        if not probe and self.connectivity is not None and self.connectivity.down:
            # Fail fast while the prober waits out the backoff: piling up requests on a dead
            # apiserver helps nobody, and the attempt count must follow one schedule.
            raise self._unavailable()
        timeout = aiohttp.ClientTimeout(
            total=None if streaming else self.config.request_timeout_seconds,
            sock_connect=self.config.connect_timeout_seconds,
            sock_read=read_timeout if streaming else None,
        )
        url = self.target.server + path_qs
        for attempt in range(2):
            if forwarded_auth is None:
                await self.target.refresh()  # an exec plugin's credential, when it is due
            send_headers = self._with_credential(headers, forwarded_auth)
            queued = self._clock()
            try:
                async with self.limiter.slot(max_wait=self.max_wait if not wait else None):
                    waited = self._clock() - queued
                    if waited > 0.001:
                        self.metrics.ratelimit_wait.inc(waited)
                    sent = self._clock()
                    response = await self._session.request(
                        method,
                        URL(url, encoded=True),
                        headers=send_headers,
                        data=body,
                        timeout=timeout,
                        allow_redirects=False,
                        ssl=self.target.ssl_context or True,  # replaced when a cert rotates
                    )
            except UpstreamDown:
                raise self._unavailable() from None
            except TooManyRequests:
                self.metrics.throttled.labels("upstream").inc()
                raise
            except TimeoutError:
                self._mark(False, "timed out")
                self.metrics.upstream_errors.labels("timeout").inc()
                raise UpstreamTimeout(f"the apiserver did not answer {method} {path_qs}") from None
            except aiohttp.ClientSSLError as exc:
                self._mark(False, describe(exc))
                self.metrics.upstream_errors.labels("tls").inc()
                raise self._unavailable() from None
            except (aiohttp.ClientError, OSError) as exc:
                self._mark(False, describe(exc))
                self.metrics.upstream_errors.labels("connect").inc()
                raise self._unavailable() from None
            # Any HTTP answer means the apiserver is reachable, even a 5xx from it.
            self._mark(True)
            self.metrics.upstream_requests.labels(verb, str(response.status)).inc()
            self.metrics.upstream_request_duration.labels(verb).observe(self._clock() - sent)
            if response.status == 429:
                self.metrics.upstream_throttled.inc()
                delay = parse_retry_after(response.headers.get("Retry-After"), time.time())
                self.limiter.note_retry_after(delay if delay is not None else 1.0)
            if (
                response.status == 401
                and attempt == 0
                and forwarded_auth is None
                and self.target.invalidate(send_headers.get("Authorization"))
            ):
                # A rotated token file or an exec credential the apiserver no longer takes:
                # get a fresh one and try once more.
                response.release()
                continue
            return response
        raise AssertionError("unreachable")  # pragma: no cover

    async def websocket(
        self,
        path_qs: str,
        *,
        protocols: list[str],
        headers: CIMultiDict[str],
        forwarded_auth: str | None = None,
    ) -> aiohttp.ClientWebSocketResponse:
        """Open a WebSocket to the apiserver (exec, attach, port-forward) as the proxy.

        Raises aiohttp.WSServerHandshakeError when the apiserver refuses the upgrade.
        """
        assert self._session is not None, "Upstream.start() was not called"
        if self.connectivity is not None and self.connectivity.down:
            raise self._unavailable()
        if forwarded_auth is None:
            await self.target.refresh()
        send_headers = self._with_credential(headers, forwarded_auth)
        try:
            async with self.limiter.slot(max_wait=self.max_wait):
                ws = await self._session.ws_connect(
                    URL(self.target.server + path_qs, encoded=True),
                    protocols=protocols,
                    headers=send_headers,
                    max_msg_size=0,
                    timeout=aiohttp.ClientWSTimeout(ws_close=10.0),
                    ssl=self.target.ssl_context or True,
                )
        except aiohttp.WSServerHandshakeError as refused:
            self._mark(True)
            self.metrics.upstream_requests.labels("connect", str(refused.status)).inc()
            raise
        except UpstreamDown:
            raise self._unavailable() from None
        except (aiohttp.ClientError, OSError) as exc:
            self._mark(False, describe(exc))
            self.metrics.upstream_errors.labels("connect").inc()
            raise self._unavailable() from None
        self._mark(True)
        self.metrics.upstream_requests.labels("connect", "101").inc()
        return ws

    async def probe(self) -> bool:
        """One reachability check (used by the connectivity prober only)."""
        token = PROBING.set(True)
        try:
            response = await self.open("GET", "/readyz", verb="get", probe=True, wait=True)
        finally:
            PROBING.reset(token)
        response.release()
        return response.status < 500


async def read_lines(response: aiohttp.ClientResponse, max_line: int) -> AsyncIterator[bytes]:
    """Yield ``\\n``-terminated lines of a watch body, of any size up to ``max_line``.

    aiohttp's own readline refuses long lines; one watch event can be several MiB.
    A final fragment without a newline is a truncated event and is not yielded.
    """
    buffer = bytearray()
    async for chunk in response.content.iter_any():
        start = 0
        while True:
            end = chunk.find(b"\n", start)
            if end < 0:
                buffer += chunk[start:]
                if len(buffer) > max_line:
                    raise LineTooLong(len(buffer))
                break
            if buffer:
                buffer += chunk[start : end + 1]
                line = bytes(buffer)
                buffer.clear()
            else:
                line = chunk[start : end + 1]
            if len(line) > max_line:
                raise LineTooLong(len(line))
            yield line
            start = end + 1


def describe(error: BaseException) -> str:
    """A short, credential-free cause for logs and Status messages."""
    if isinstance(error, aiohttp.ClientConnectorCertificateError):
        return f"TLS certificate verification failed: {error.certificate_error}"
    if isinstance(error, aiohttp.ClientSSLError):
        return f"TLS error: {error}"
    if isinstance(error, aiohttp.ClientConnectorDNSError):
        return f"DNS lookup failed for {error.host}"
    if isinstance(error, aiohttp.ClientConnectorError):
        return f"cannot connect to {error.host}:{error.port}: {error.os_error.strerror or error}"
    if isinstance(error, TimeoutError):
        return "timed out"
    return f"{type(error).__name__}: {error}"


class LineTooLong(Exception):
    """A watch event line exceeded the configured limit."""

    def __init__(self, size: int) -> None:
        super().__init__(f"watch event line of {size} bytes exceeds the limit")
