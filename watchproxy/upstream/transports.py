"""The two ways a request leaves for the apiserver, and what their failures are called.

One-shot requests go through :class:`~watchproxy.upstream.pool.ConnectionPool` (one write per
request, the answer parsed as it arrives); streams (watches, ``logs -f``) through aiohttp's
client. Both dial through one :class:`~watchproxy.upstream.connector.SerialConnector`, so the
rules for dialing hold for both: one dial at a time, none while the apiserver is known to be
down, every socket created and owned by the event loop.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable

import aiohttp
from multidict import CIMultiDict
from yarl import URL

from watchproxy.config import UpstreamConfig
from watchproxy.errors import BadRequest
from watchproxy.metrics import Metrics
from watchproxy.policy.adaptive import Outcome
from watchproxy.upstream.connector import DialFailed, SerialConnector, dial_cause
from watchproxy.upstream.credentials import UpstreamTarget
from watchproxy.upstream.http1 import Broken, HeaderBlock, encode_head
from watchproxy.upstream.pool import ConnectionPool
from watchproxy.upstream.response import StreamAnswer, UpstreamResponse

# Methods the pool may send a second time when a reused connection turned out closed before
# any answer came (RFC 9110 section 9.2.2: the idempotent ones).
IDEMPOTENT = frozenset({"GET", "HEAD", "PUT", "DELETE", "OPTIONS"})
# Methods whose request carries a Content-Length even without a body, as clients send them.
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


class Transports:
    """The connector, the pool and the aiohttp session of one apiserver; closed once."""

    def __init__(
        self,
        target: UpstreamTarget,
        config: UpstreamConfig,
        *,
        is_down: Callable[[], bool],
        on_dial_failure: Callable[[BaseException], None],
        metrics: Metrics,
    ) -> None:
        self.target = target
        self.config = config
        server = URL(target.server)
        assert server.host is not None and server.port is not None, target.server
        self._host_header = server.raw_authority.rpartition("@")[2]
        self._path_prefix = server.raw_path.rstrip("/")
        self._secure = server.scheme == "https"
        self._default_ssl: ssl.SSLContext | None = None
        self.connector = SerialConnector(
            is_down=is_down,
            on_failure=on_dial_failure,
            on_dial=metrics.upstream_connection_attempts.inc,
            on_reused_descriptor=metrics.reused_descriptors.inc,
            ssl=target.ssl_context if target.ssl_context is not None else False,
            limit=0,
            ttl_dns_cache=30,
        )
        self.pool = ConnectionPool(
            self.connector, (server.raw_host or server.host).strip("[]"), server.port
        )
        connector, pool = self.connector, self.pool
        metrics.count_upstream_connections(
            lambda: connector.open_connections() + pool.open_connections()
        )
        # auto_decompress off: bodies pass through byte for byte with their Content-Encoding.
        self.session = aiohttp.ClientSession(
            base_url=None,
            connector=connector,
            auto_decompress=False,
            timeout=aiohttp.ClientTimeout(total=None),
            skip_auto_headers=("User-Agent", "Accept-Encoding"),
            read_bufsize=2**18,
            max_line_size=65536,
            max_field_size=65536,
        )

    async def close(self, timeout: float) -> None:
        await self.pool.close(timeout)
        await self.session.close()
        await self.connector.wait_closed(timeout)

    async def send(
        self,
        method: str,
        path_qs: str,
        headers: CIMultiDict[str] | HeaderBlock,
        body: bytes | None,
        read_timeout: float | None,
        deadline: float | None = None,
        *,
        auth: str | None = None,
    ) -> UpstreamResponse:
        """A one-shot request on a pooled connection; returns once the answer's head came
        (TimeoutError when it has not within ``deadline`` seconds). ``auth``: the credential
        that goes with a HeaderBlock (other headers carry theirs)."""
        # The body's framing field, if any: beside a HeaderBlock, or in the headers.
        framing: tuple[str, str] | None = None
        if body is not None or method in BODY_METHODS:
            framing = ("Content-Length", str(len(body) if body is not None else 0))
        target = self._path_prefix + path_qs
        try:
            if isinstance(headers, HeaderBlock):
                extra = ""
                if auth is not None:
                    if "\r" in auth or "\n" in auth:
                        raise ValueError("the credential holds a line break")
                    extra = f"Authorization: {auth}\r\n"
                if framing is not None:
                    extra += f"{framing[0]}: {framing[1]}\r\n"
                head = encode_head(method, target, self._host_header, headers, extra=extra)
            else:
                if framing is not None:
                    headers[framing[0]] = framing[1]
                head = encode_head(method, target, self._host_header, headers)
        except ValueError as error:
            raise BadRequest(str(error)) from None
        return await self.pool.request(
            head + body if body else head,
            ssl_context=self._ssl_context(),
            connect_timeout=self.config.connect_timeout_seconds,
            head_request=method == "HEAD",
            may_resend=method in IDEMPOTENT,
            read_timeout=read_timeout,
            deadline=deadline,
        )

    async def stream(
        self,
        method: str,
        path_qs: str,
        headers: CIMultiDict[str],
        body: bytes | None,
        read_timeout: float | None,
    ) -> UpstreamResponse:
        """A streamed request through aiohttp's client; returns once the answer's head came."""
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=self.config.connect_timeout_seconds, sock_read=read_timeout
        )
        response = await self.session.request(
            method,
            URL(self.target.server + path_qs, encoded=True),
            headers=headers,
            data=body,
            timeout=timeout,
            allow_redirects=False,
            ssl=self.target.ssl_context or True,  # replaced when a cert rotates
        )
        return StreamAnswer(response)

    def _ssl_context(self) -> ssl.SSLContext | None:
        if not self._secure:
            return None
        if self.target.ssl_context is not None:
            return self.target.ssl_context  # replaced when a certificate rotates
        if self._default_ssl is None:
            self._default_ssl = ssl.create_default_context()
        return self._default_ssl


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
    """A short, credential-free cause for logs and Status messages. A failed dial is worded by
    ``connector.dial_cause``, whether aiohttp's connector or watchproxy's own reports it."""
    if isinstance(error, aiohttp.ClientConnectorCertificateError):
        return dial_cause(error.certificate_error, error.host, error.port)
    if isinstance(error, aiohttp.ClientConnectorError):
        dns = isinstance(error, aiohttp.ClientConnectorDNSError)
        return dial_cause(error.os_error, error.host, error.port, resolving=dns)
    if isinstance(error, TimeoutError):
        return "timed out"
    if isinstance(error, DialFailed | Broken):
        return str(error)
    return f"{type(error).__name__}: {error}"
