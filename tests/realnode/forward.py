"""A TCP relay from the machine's loopback into the node's network namespace.

    python -m tests.realnode.forward NETNS_PATH TARGET_HOST TARGET_PORT READY_FILE

Listens on 127.0.0.1 (a free port) in the namespace it was started in, writes that port to
READY_FILE, and relays every connection to TARGET_HOST:TARGET_PORT as seen from inside the
namespace at NETNS_PATH (``/run/netns/<name>``). The tests, kubectl and watchproxy run on the
machine's loopback and reach the node's apiserver this way; nothing with an address is added to
the machine's own interfaces.

A socket belongs to the network namespace its thread was in when it was created: the relay
enters the node's namespace for the moment of ``socket()`` and returns at once, so one process
serves both sides. Ends on SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import socket
import sys

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def socket_in(netns_fd: int, own_fd: int) -> socket.socket:
    """A TCP socket made inside the namespace ``netns_fd`` (the thread returns to ``own_fd``)."""
    _setns(netns_fd)
    try:
        return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    finally:
        _setns(own_fd)


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        writer.transport.abort()


async def main(netns_path: str, host: str, port: int, ready_file: str) -> None:
    netns_fd = os.open(netns_path, os.O_RDONLY)
    own_fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    relays: set[asyncio.Task[None]] = set()

    async def relay(client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        sock = socket_in(netns_fd, own_fd)
        try:
            sock.setblocking(False)
            await asyncio.wait_for(loop.sock_connect(sock, (host, port)), 10)
        except (OSError, TimeoutError):
            sock.close()
            client_w.transport.abort()
            return
        up_r, up_w = await asyncio.open_connection(sock=sock)
        try:
            await asyncio.gather(_pipe(client_r, up_w), _pipe(up_r, client_w))
        finally:
            up_w.close()
            client_w.close()

    def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.create_task(relay(reader, writer))
        relays.add(task)
        task.add_done_callback(relays.discard)

    server = await asyncio.start_server(accepted, "127.0.0.1", 0)
    listen_port = server.sockets[0].getsockname()[1]
    tmp = ready_file + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        out.write(f"{listen_port}\n")
    os.replace(tmp, ready_file)
    await stop.wait()
    server.close()
    for task in list(relays):
        task.cancel()
    for task in list(relays):
        with contextlib.suppress(BaseException):
            await task


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]))
