"""pods/exec, pods/attach and pods/portforward over SPDY/3.1, as kubelet serves them.

kubectl before 1.30, and client-go's SPDY executor (the fallback of later versions) open the
connection with ``Upgrade: SPDY/3.1`` and the protocols they speak in
``X-Stream-Protocol-Version``; the server answers 101 with the one it chose. The client then
opens one SPDY stream per channel, each a SYN_STREAM with a ``streamtype`` header, and waits
for a SYN_REPLY to each:

- remote command (``v4.channel.k8s.io`` down to ``channel.k8s.io``): ``error``, ``stdin``,
  ``stdout``, ``stderr``, ``resize``. The command runs once every requested stream is open; the
  server writes a JSON Status to ``error`` (v4) and half-closes its streams when it is done.
  Commands: ``echo ARGS``, ``cat`` (stdin to stdout), ``seq FIRST LAST`` (its lines, at once;
  then the connection ends without waiting for the client to close, as the apiserver ends a
  session it relayed once the kubelet ends it, whatever the client still has to read).
- port-forward (``portforward.k8s.io``): per forwarded connection an ``error`` and a ``data``
  stream sharing a ``requestid``. The fake's pods answer every port with an echo service.

kubectl >= 1.31 tunnels the port-forward SPDY session in WebSocket binary messages
(subprotocol ``SPDY/3.1+portforward.k8s.io``); the same session runs over either carrier.
Flow control (WINDOW_UPDATE) and SETTINGS are accepted and ignored, as spdystream does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import struct
from collections.abc import Awaitable, Callable
from typing import Any, cast

import aiohttp
from aiohttp import web

from .errors import BadRequest
from .spdy import (
    FLAG_FIN,
    GOAWAY,
    PING,
    RST_STREAM,
    SYN_REPLY,
    SYN_STREAM,
    ControlFrame,
    DataFrame,
    FrameReader,
    HeaderCodec,
    ProtocolError,
    encode_control,
    encode_data,
    parse_syn_stream,
    syn_reply_payload,
)

EXEC_PROTOCOLS = ("v4.channel.k8s.io", "v3.channel.k8s.io", "v2.channel.k8s.io", "channel.k8s.io")
PORT_FORWARD_PROTOCOL = "portforward.k8s.io"
TUNNELED_PORT_FORWARD = "SPDY/3.1+portforward.k8s.io"
# kubelet's stream-creation timeout is 30 s; the fake's tests want a quicker verdict.
STREAMS_TIMEOUT = 10.0
SESSION_END_TIMEOUT = 10.0
MAX_DATA_FRAME = 32 * 1024


class SpdyStream:
    def __init__(self, session: SpdySession, stream_id: int, headers: dict[str, list[str]]):
        self.session = session
        self.id = stream_id
        self.headers = {name: values[0] for name, values in headers.items() if values}
        self._inbound: asyncio.Queue[bytes] = asyncio.Queue()
        self.remote_closed = False

    @property
    def type(self) -> str:
        return self.headers.get("streamtype", "")

    def _receive(self, data: bytes, fin: bool) -> None:
        if self.remote_closed:
            return
        if data:
            self._inbound.put_nowait(data)
        if fin:
            self.remote_closed = True
            self._inbound.put_nowait(b"")

    async def read(self) -> bytes:
        """The next bytes the client sent on this stream; b"" once it half-closed it."""
        return await self._inbound.get()

    def write(self, data: bytes, *, fin: bool = False) -> None:
        for start in range(0, len(data), MAX_DATA_FRAME):
            last = start + MAX_DATA_FRAME >= len(data)
            self.session.send(
                encode_data(self.id, data[start : start + MAX_DATA_FRAME], fin=fin and last)
            )
        if fin and not data:
            self.session.send(encode_data(self.id, b"", fin=True))


class SpdySession:
    """One SPDY connection from the server's side: answers every stream the client opens and
    hands it to ``streams``; answers PINGs; ends on the client's GOAWAY or close."""

    def __init__(self, send_bytes: Callable[[bytes], None]) -> None:
        self.send = send_bytes
        self._codec = HeaderCodec()
        self._frames = FrameReader()
        self.streams: asyncio.Queue[SpdyStream] = asyncio.Queue()
        self._by_id: dict[int, SpdyStream] = {}
        self.ended = asyncio.Event()

    def feed(self, data: bytes) -> None:
        """Bytes from the client (a WebSocket carrier may bring an empty message: no end)."""
        try:
            frames = self._frames.feed(data)
        except ProtocolError:
            self._end()
            return
        for frame in frames:
            if isinstance(frame, DataFrame):
                stream = self._by_id.get(frame.stream_id)
                if stream is not None:
                    stream._receive(frame.data, bool(frame.flags & FLAG_FIN))
            else:
                self._control(frame)

    def _control(self, frame: ControlFrame) -> None:
        if frame.type == SYN_STREAM:
            stream_id, headers = parse_syn_stream(self._codec, frame.payload)
            stream = SpdyStream(self, stream_id, headers)
            self._by_id[stream_id] = stream
            self.send(encode_control(SYN_REPLY, 0, syn_reply_payload(self._codec, stream_id, {})))
            stream._receive(b"", bool(frame.flags & FLAG_FIN))
            self.streams.put_nowait(stream)
        elif frame.type == PING:
            self.send(encode_control(PING, 0, frame.payload))
        elif frame.type == RST_STREAM and len(frame.payload) >= 4:
            (stream_id,) = struct.unpack_from(">I", frame.payload)
            reset = self._by_id.get(stream_id & 0x7FFFFFFF)
            if reset is not None:
                reset._receive(b"", True)
        elif frame.type == GOAWAY:
            self._end()

    def close(self) -> None:
        """The client's connection ended."""
        self._end()

    def _end(self) -> None:
        for stream in self._by_id.values():
            stream._receive(b"", True)
        self.ended.set()

    async def open_streams(self, wanted: set[str]) -> dict[str, SpdyStream]:
        """Wait until the client opened a stream of every type in ``wanted``."""
        opened: dict[str, SpdyStream] = {}
        async with asyncio.timeout(STREAMS_TIMEOUT):
            while not wanted <= opened.keys():
                stream = await self.streams.get()
                opened[stream.type] = stream
        return opened


class _Feed:
    """The connection's payload parser after the 101: every byte goes to the session."""

    def __init__(self, session: SpdySession) -> None:
        self.session = session

    def feed_data(self, data: bytes) -> tuple[bool, bytes]:
        if data:
            self.session.feed(data)
        return False, b""

    def feed_eof(self) -> None:
        self.session.close()


def _negotiate(request: web.Request, supported: tuple[str, ...]) -> str:
    offered = [
        p.strip()
        for value in request.headers.getall("X-Stream-Protocol-Version", [])
        for p in value.split(",")
    ]
    for protocol in offered:
        if protocol in supported:
            return protocol
    raise BadRequest(f"unable to upgrade: unable to negotiate protocol: client supports {offered}")


async def _serve_raw(
    request: web.Request,
    protocol: str,
    run: Callable[[SpdySession], Awaitable[None]],
    *,
    wait_for_client: bool = True,
) -> web.StreamResponse:
    response = web.StreamResponse(
        status=101,
        headers={
            "Connection": "Upgrade",
            "Upgrade": "SPDY/3.1",
            "X-Stream-Protocol-Version": protocol,
        },
    )
    response.force_close()
    transport = request.transport
    assert transport is not None
    session = SpdySession(lambda data: None if transport.is_closing() else transport.write(data))
    # The connection's parser is replaced before the 101 goes out, so the client's first frame
    # reaches the session (aiohttp would parse it as HTTP: it upgrades only WebSocket itself).
    request.protocol.set_parser(cast(Any, _Feed(session)))
    await response.prepare(request)
    if wait_for_client:
        await _run_session(session, run)
    else:
        with contextlib.suppress(TimeoutError):
            await run(session)
        transport.close()  # after the bytes written (aiohttp's transport flushes them first)
    return response


async def _serve_tunneled(
    request: web.Request, run: Callable[[SpdySession], Awaitable[None]]
) -> web.StreamResponse:
    ws = web.WebSocketResponse(protocols=(TUNNELED_PORT_FORWARD,), max_msg_size=0)
    await ws.prepare(request)
    outbox: asyncio.Queue[bytes] = asyncio.Queue()
    session = SpdySession(outbox.put_nowait)

    async def carry() -> None:
        async def inbound() -> None:
            async for message in ws:
                if message.type == aiohttp.WSMsgType.BINARY:
                    session.feed(message.data)
            session.close()

        async def outbound() -> None:
            while True:
                await ws.send_bytes(await outbox.get())

        async with asyncio.TaskGroup() as group:
            group.create_task(inbound())
            sender = group.create_task(outbound())
            await session.ended.wait()
            sender.cancel()

    carrier = asyncio.create_task(carry())
    try:
        await _run_session(session, run)
        while not outbox.empty():
            await ws.send_bytes(outbox.get_nowait())
        await ws.close()
    finally:
        carrier.cancel()
        await asyncio.gather(carrier, return_exceptions=True)
    return ws


async def _run_session(session: SpdySession, run: Callable[[SpdySession], Awaitable[None]]) -> None:
    """Run the server's side, then give the client time to close (as it does when done)."""
    try:
        await run(session)
    except TimeoutError:
        return  # the client never opened its streams: drop the connection
    try:
        async with asyncio.timeout(SESSION_END_TIMEOUT):
            await session.ended.wait()
    except TimeoutError:
        pass


# -- exec ------------------------------------------------------------------------------------


def _status(protocol: str, exit_code: int, message: str) -> bytes:
    if protocol != EXEC_PROTOCOLS[0]:
        return message.encode() if exit_code else b""  # v1-v3: a plain error text, or nothing
    if exit_code == 0:
        return json.dumps({"metadata": {}, "status": "Success"}).encode()
    return json.dumps(
        {
            "metadata": {},
            "status": "Failure",
            "message": message or f"command terminated with non-zero exit code: {exit_code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(exit_code)}]},
        }
    ).encode()


def _flag(request: web.Request, name: str) -> bool:
    return request.query.get(name, "").lower() in ("true", "1")


async def exec_spdy(request: web.Request) -> web.StreamResponse:
    protocol = _negotiate(request, EXEC_PROTOCOLS)
    command = request.query.getall("command", [])
    if not command and request.path.endswith("/exec"):
        raise BadRequest("you must specify at least one command for the container")
    tty = _flag(request, "tty")
    wanted = {"error"}
    wanted |= {"stdin"} if _flag(request, "stdin") else set()
    wanted |= {"stdout"} if _flag(request, "stdout") else set()
    wanted |= {"stderr"} if _flag(request, "stderr") and not tty else set()
    wanted |= {"resize"} if tty else set()

    async def run(session: SpdySession) -> None:
        streams = await session.open_streams(wanted)
        stdout, stderr = streams.get("stdout"), streams.get("stderr")
        exit_code, message = 0, ""
        if command and command[0] == "echo":
            if stdout is not None:
                stdout.write((" ".join(command[1:]) + "\n").encode())
        elif command and command[0] == "seq" and len(command) == 3:
            lines = b"".join(b"%d\n" % i for i in range(int(command[1]), int(command[2]) + 1))
            if stdout is not None:
                stdout.write(lines)
        elif command and command[0] == "cat":
            stdin = streams.get("stdin")
            while stdin is not None and (data := await stdin.read()):
                if stdout is not None:
                    stdout.write(data)
        else:
            exit_code, message = 127, f"{command[0] if command else 'attach'}: not found"
            if stderr is not None:
                stderr.write(f"{message}\n".encode())
        streams["error"].write(_status(protocol, exit_code, message), fin=True)
        for name in ("stdout", "stderr"):
            if name in streams:
                streams[name].write(b"", fin=True)

    return await _serve_raw(
        request, protocol, run, wait_for_client=not (command and command[0] == "seq")
    )


# -- port-forward ----------------------------------------------------------------------------


async def _echo_connection(data: SpdyStream, error: SpdyStream | None) -> None:
    while chunk := await data.read():
        data.write(chunk)
    data.write(b"", fin=True)
    if error is not None:
        error.write(b"", fin=True)


async def _forward_ports(session: SpdySession) -> None:
    errors: dict[str, SpdyStream] = {}
    async with asyncio.TaskGroup() as group:
        ended = group.create_task(session.ended.wait())
        while not ended.done():
            next_stream = group.create_task(session.streams.get())
            await asyncio.wait((next_stream, ended), return_when=asyncio.FIRST_COMPLETED)
            if not next_stream.done():
                next_stream.cancel()
                break
            stream = next_stream.result()
            request_id = stream.headers.get("requestid", "")
            if stream.type == "error":
                errors[request_id] = stream
            elif stream.type == "data":
                group.create_task(_echo_connection(stream, errors.pop(request_id, None)))


async def port_forward(request: web.Request) -> web.StreamResponse:
    if request.headers.get("Upgrade", "").lower() == "websocket":
        return await _serve_tunneled(request, _forward_ports)
    if request.headers.get("Upgrade", "").lower() != "spdy/3.1":
        raise BadRequest("Upgrade request required")
    protocol = _negotiate(request, (PORT_FORWARD_PROTOCOL,))
    return await _serve_raw(request, protocol, _forward_ports)
