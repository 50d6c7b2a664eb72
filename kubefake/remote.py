"""pods/exec and pods/attach over WebSocket, the way kubectl >= 1.30 speaks them.

The Kubernetes remote-command protocol frames every message with its channel as the first
byte: 0 stdin, 1 stdout, 2 stderr, 3 error/status (a JSON Status), 4 resize; v5 adds a close
message on channel 255. The fake "runs" two commands: ``echo ARGS`` prints ARGS, and ``cat``
copies stdin to stdout until stdin is closed. Anything else exits 127 with a message.
"""

from __future__ import annotations

import json

import aiohttp
from aiohttp import web

from .errors import BadRequest

PROTOCOLS = ("v5.channel.k8s.io", "v4.channel.k8s.io")
STDIN, STDOUT, STDERR, STATUS, CLOSE = 0, 1, 2, 3, 255


def _status(exit_code: int, message: str = "") -> bytes:
    if exit_code == 0:
        body: dict[str, object] = {"metadata": {}, "status": "Success"}
    else:
        body = {
            "metadata": {},
            "status": "Failure",
            "message": message or f"command terminated with non-zero exit code: {exit_code}",
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": str(exit_code)}]},
        }
    return bytes([STATUS]) + json.dumps(body).encode()


async def exec_websocket(request: web.Request) -> web.StreamResponse:
    if request.headers.get("Upgrade", "").lower() != "websocket":
        raise BadRequest(
            "this fake apiserver speaks the remote-command protocol over WebSocket only"
        )
    command = request.query.getall("command", [])
    if not command:
        raise BadRequest("you must specify at least one command for the container")
    ws = web.WebSocketResponse(protocols=PROTOCOLS)
    await ws.prepare(request)
    if command[0] == "echo":
        await ws.send_bytes(bytes([STDOUT]) + (" ".join(command[1:]) + "\n").encode())
        await ws.send_bytes(_status(0))
    elif command[0] == "cat":
        async for message in ws:
            if message.type != aiohttp.WSMsgType.BINARY or not message.data:
                continue
            channel, data = message.data[0], message.data[1:]
            if channel == STDIN:
                await ws.send_bytes(bytes([STDOUT]) + data)
            elif channel == CLOSE and data[:1] == bytes([STDIN]):
                break
        await ws.send_bytes(_status(0))
    else:
        await ws.send_bytes(bytes([STDERR]) + f"{command[0]}: not found\n".encode())
        await ws.send_bytes(_status(127, f"{command[0]}: not found"))
    await ws.close()
    return ws
