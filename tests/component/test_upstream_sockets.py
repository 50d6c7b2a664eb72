"""Every upstream socket has one owner and is closed exactly once, even when TLS dials fail.

The failure these tests pin (issue 10): on uvloop, a TLS connection whose peer resets it in
the moment between the TCP connect and the start of the TLS handshake left the Python socket
object that aiohappyeyeballs had connected still holding a descriptor that libuv had already
closed. When that stale object was finalized later, it closed whatever socket the OS had given
the same number in between: a live upstream connection lost its descriptor, and the next socket
to get that number carried another connection's bytes. ``watchproxy.upstream.pool`` explains
the mechanism where it is prevented: its one dial path lets the loop own every socket.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import socket
import ssl
import struct
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from kubefake import FakeApiServer
from tests.harness import running_proxy
from watchproxy.metrics import Metrics
from watchproxy.upstream.pool import ConnectionPool, DialFailed

DIALS = 60


@contextmanager
def resetting_server(delay: float) -> Iterator[int]:
    """A TCP endpoint (in its own thread, so its RST is not scheduled behind our loop) that
    accepts each connection and resets it ``delay`` seconds later."""
    server = socket.create_server(("127.0.0.1", 0))
    port: int = server.getsockname()[1]

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            time.sleep(delay)
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield port
    finally:
        server.shutdown(socket.SHUT_RDWR)
        server.close()
        thread.join(5)


async def jank(stop: asyncio.Event) -> None:
    """Hold the loop for a millisecond per turn, as a busy proxy does: the peer's reset then
    lands between the TCP connect and the TLS handshake's first write."""
    while not stop.is_set():
        time.sleep(0.001)  # noqa: ASYNC251 - blocking on purpose
        await asyncio.sleep(0)


@contextmanager
def recorded_warnings() -> Iterator[list[warnings.WarningMessage]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught


def unclosed_sockets(caught: list[warnings.WarningMessage]) -> list[str]:
    return [
        str(w.message)
        for w in caught
        if issubclass(w.category, ResourceWarning) and "socket" in str(w.message)
    ]


async def test_uvloop_handoff_of_a_connected_socket_is_unsafe_on_failed_tls() -> None:
    """Why the pool never hands a socket to the loop: this uvloop version closes the
    descriptor in libuv and leaves the Python socket holding its number (documents the
    mechanism; skips once uvloop no longer does it)."""
    loop = asyncio.get_running_loop()
    context = ssl.create_default_context()
    stale = 0
    with resetting_server(delay=0.0) as port, recorded_warnings():
        for _ in range(20):
            sock = socket.socket()
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, ("127.0.0.1", port))
            except OSError:
                sock.close()
                continue
            await asyncio.sleep(0.01)  # the reset arrives before the handshake starts
            number = sock.fileno()
            with pytest.raises(OSError):
                await loop.create_connection(
                    asyncio.Protocol, sock=sock, ssl=context, server_hostname="x"
                )
            if sock.fileno() == number:
                with pytest.raises(OSError):
                    os.fstat(number)  # libuv closed it; the socket object still claims it
                stale += 1
                sock.detach()  # the only safe thing left to do with it
            del sock
    if "uvloop" not in type(loop).__module__:
        pytest.skip("the plain asyncio loop owns handed-over sockets correctly")
    if stale == 0:
        pytest.skip("this uvloop no longer leaves a stale socket on a failed TLS hand-off")


async def test_failed_tls_dials_close_each_socket_once_and_spare_live_ones(
    fake_api: FakeApiServer,
) -> None:
    metrics = Metrics()
    failures: list[str] = []  # descriptions only: an exception would keep its frames alive
    stop = asyncio.Event()
    busy = asyncio.create_task(jank(stop))
    victims: list[asyncio.StreamWriter] = []
    request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    try:
        with resetting_server(delay=0.001) as port, recorded_warnings() as caught:
            pool = ConnectionPool(
                "127.0.0.1",
                port,
                on_failure=lambda error: failures.append(type(error).__name__),
                on_dial=metrics.upstream_connection_attempts.inc,
            )
            for _ in range(DIALS):
                # A descriptor closed under a pending connect leaves it waiting forever.
                async with asyncio.timeout(10):
                    with pytest.raises(DialFailed):
                        await pool.request(
                            request,
                            ssl_context=ssl.create_default_context(),
                            connect_timeout=5,
                            may_resend=True,
                        )
                    # A live connection opened right after a failure gets the lowest free
                    # descriptor: the failed dial's, if anything still claims it.
                    _, writer = await asyncio.open_connection(fake_api.host, fake_api.port)
                victims.append(writer)
                gc.collect()  # finalize whatever the failed dial left behind, now
            await pool.close(2)
            stop.set()
            await busy
            gc.collect()
            leaked = unclosed_sockets(caught)
        assert len(failures) == DIALS
        assert metrics.upstream_connection_attempts._value.get() == DIALS
        assert leaked == [], leaked[:3]
        for writer in victims:
            peer: Any = writer.get_extra_info("socket").getpeername()
            assert peer[1] == fake_api.port, "a live connection lost its descriptor"
    finally:
        stop.set()
        await busy
        for writer in victims:
            writer.transport.abort()


async def test_a_reused_descriptor_reported_by_the_loop_is_logged_and_counted(
    tmp_path: Any, caplog: pytest.LogCaptureFixture
) -> None:
    async with running_proxy(tmp_path) as running:
        loop = asyncio.get_running_loop()
        with caplog.at_level(logging.ERROR, logger="watchproxy"):
            loop.call_exception_handler(
                {
                    "message": "Exception in callback",
                    "exception": RuntimeError(
                        "File descriptor 17 is used by transport <TCPTransport closed=False>"
                    ),
                }
            )
            loop.call_exception_handler({"message": "an unrelated report"})
        metrics = running.proxy.metrics
        assert metrics.reused_descriptors._value.get() == 1
        errors = [r for r in caplog.records if r.levelno == logging.ERROR]
        assert any("closed twice" in r.getMessage() for r in errors)
