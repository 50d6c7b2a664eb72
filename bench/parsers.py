"""The cost of parsing one controller request head, by the parsers the API port could use.

    .venv/bin/python -m bench.parsers [--before DIR] [--rounds 5] [--parses 20000]

Measured: llhttp through httptools with callbacks that keep the target and the header fields
(what ``server.protocol`` asks of it), aiohttp's exported C parser
(``aiohttp.http.HttpRequestParser``, llhttp as well, building its message object), and, with
``--before DIR`` (a checkout of watchproxy before 2026-12-07), the hand-written head parser the
fast lane used (``server/requesthead.py`` there; loaded from the file, as this tree has it no
more). Printed: the minimum over ``--rounds`` of the mean time per parse, in microseconds.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httptools
from aiohttp import http as aiohttp_http

# A client-go GET as bench/gocontroller sends it (one of the controller mix's requests).
HEAD = (
    b"GET /api/v1/namespaces/bench/configmaps/worker-3 HTTP/1.1\r\n"
    b"Host: 127.0.0.1:8001\r\n"
    b"User-Agent: gocontroller/v0.0.0 (linux/amd64) kubernetes/$Format\r\n"
    b"Accept: application/json, */*\r\n"
    b"Accept-Encoding: gzip\r\n"
    b"\r\n"
)


class _Callbacks:
    """What ``server.protocol`` keeps of a request: its target and its fields."""

    def __init__(self) -> None:
        self.url: list[bytes] = []
        self.fields: list[tuple[bytes, bytes]] = []
        self.done = 0

    def on_message_begin(self) -> None:
        self.url = []
        self.fields = []

    def on_url(self, url: bytes) -> None:
        self.url.append(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self.fields.append((name, value))

    def on_message_complete(self) -> None:
        self.done += 1


def httptools_parse() -> Callable[[], None]:
    callbacks = _Callbacks()
    parser = httptools.HttpRequestParser(callbacks)  # one per connection, fed each request

    def parse() -> None:
        parser.feed_data(HEAD)
        parser.get_method()

    return parse


class _Protocol:
    _reading_paused = False
    transport = None

    def pause_reading(self, **kwargs: Any) -> None:
        pass

    def resume_reading(self, **kwargs: Any) -> None:
        pass


def aiohttp_parse(loop: asyncio.AbstractEventLoop) -> Callable[[], None]:
    parser = aiohttp_http.HttpRequestParser(
        _Protocol(), loop, 2**16, max_line_size=8190, max_field_size=8190, max_headers=128
    )

    def parse() -> None:
        parser.feed_data(HEAD)

    return parse


def hand_parse(before: Path) -> Callable[[], None]:
    path = before / "watchproxy" / "server" / "requesthead.py"
    spec = importlib.util.spec_from_file_location("requesthead_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    parse_head = module.parse_request_head

    def parse() -> None:
        parse_head(HEAD)

    return parse


def timed(parse: Callable[[], None], rounds: int, parses: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        for _ in range(parses):
            parse()
        best = min(best, (time.perf_counter() - started) / parses)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, help="a checkout with server/requesthead.py")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--parses", type=int, default=20000)
    a = parser.parse_args()
    loop = asyncio.new_event_loop()
    parsers = {
        f"httptools {httptools.__version__} (llhttp), callbacks": httptools_parse(),
        "aiohttp.http.HttpRequestParser (llhttp), message object": aiohttp_parse(loop),
    }
    if a.before is not None:
        parsers["hand-written requesthead (uncompiled)"] = hand_parse(a.before)
    for name, parse in parsers.items():
        print(f"{timed(parse, a.rounds, a.parses):6.2f} us  {name}")
    loop.close()


if __name__ == "__main__":
    main()
