"""Role: N watch clients (aiohttp on uvloop) that time and check every event they receive.

``python -m bench.subscribers --url URL --count N --rv R0 --expect E --out FILE
[--token T] [--ca PATH]`` opens N watches of ``URL?watch=true&resourceVersion=R0`` and prints
``{"ready", "failed"}`` once every response has its headers (for watchproxy and the fake, the
client is registered by then, so no event after R0 can be missed by a late start). Then it reads.
``drain T`` (sent once the generator is done) waits up to T seconds for every client to reach
RV R0+E, closes everything, writes FILE and answers ``{"done"}``.

Per event: one time.time_ns() per received chunk (the lines of one chunk arrived together),
latency = that time - the ``bench/sent-ns`` stamp. Correctness: the generator's events carry the
consecutive RVs R0+1..R0+E, so each client must see exactly those, once each, in order; anything
else is counted as a gap (missing events), a duplicate/reordering, or a non-event line.
Extraction uses byte searches rather than ``json.loads`` (the same cost for every mode, and small
enough not to become the bottleneck); the first line of every stream is also fully decoded to
check that the byte search read the right fields.
"""

from __future__ import annotations

import argparse
import array
import asyncio
import json
import ssl
import time
from dataclasses import asdict, dataclass
from typing import Any

import aiohttp

from bench.roles import STAMP_KEY, emit, run, stdin_reader

RV_MARK = b'"resourceVersion":"'
STAMP_MARK = f'"{STAMP_KEY}":"'.encode()


@dataclass
class Stream:
    expected_next: int
    last_rv: int
    count: int = 0
    gaps: int = 0  # events skipped over
    reordered: int = 0  # duplicates or RVs going backwards
    bad_lines: int = 0
    first_ns: int = 0
    last_ns: int = 0
    error: str = ""
    ended_early: bool = False


def _field(line: bytes, mark: bytes) -> int:
    start = line.find(mark)
    if start < 0:
        return -1
    start += len(mark)
    end = line.find(b'"', start)
    return int(line[start:end])


def _check_decoded(line: bytes, rv: int, stamp: int) -> bool:
    event = json.loads(line)
    meta = event["object"]["metadata"]
    return (
        event["type"] == "MODIFIED"
        and int(meta["resourceVersion"]) == rv
        and int(meta["annotations"][STAMP_KEY]) == stamp
    )


class Client:
    def __init__(
        self,
        stream: Stream,
        final_rv: int,
        latencies: array.array[int],
        expect: int | None = None,
    ) -> None:
        self.stream = stream
        self.final_rv = final_rv
        self.latencies = latencies
        # By count (a real apiserver: its own writes leave RV gaps): ``expect`` events, each
        # newer than the last; gaps are what is missing at the end.
        self.expect = expect
        self.complete = asyncio.Event()

    def feed(self, chunk_lines: list[bytes], now_ns: int) -> None:
        s = self.stream
        for line in chunk_lines:
            rv = _field(line, RV_MARK)
            stamp = _field(line, STAMP_MARK)
            if rv < 0 or stamp < 0 or b'"type":"MODIFIED"' not in line:
                s.bad_lines += 1
                continue
            if s.count == 0:
                s.first_ns = now_ns
                if not _check_decoded(line, rv, stamp):
                    s.bad_lines += 1
            s.count += 1
            self.latencies.append((now_ns - stamp) // 1000)  # microseconds
            if self.expect is not None:
                if rv <= s.last_rv:
                    s.reordered += 1
                s.last_rv = max(s.last_rv, rv)
                continue
            if rv == s.expected_next:
                s.expected_next += 1
            elif rv > s.expected_next:
                s.gaps += rv - s.expected_next
                s.expected_next = rv + 1
            else:
                s.reordered += 1
            s.last_rv = max(s.last_rv, rv)
        s.last_ns = now_ns
        if (s.count >= self.expect) if self.expect is not None else (s.last_rv >= self.final_rv):
            self.complete.set()

    async def read(self, response: aiohttp.ClientResponse) -> None:
        rest = b""
        try:
            async for chunk in response.content.iter_any():
                now = time.time_ns()
                if rest:
                    chunk = rest + chunk
                lines = chunk.split(b"\n")
                rest = lines.pop()
                self.feed(lines, now)
                if self.complete.is_set():
                    return
            self.stream.ended_early = True
        except (aiohttp.ClientError, ConnectionError) as error:
            self.stream.error = f"{type(error).__name__}: {error}"
        finally:
            self.complete.set()
            response.close()


async def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.subscribers")
    parser.add_argument("--url", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--rv", type=int, required=True)
    parser.add_argument("--expect", type=int, required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--token", default="")
    parser.add_argument("--ca", default="")
    parser.add_argument("--connect-timeout", type=float, default=60.0)
    parser.add_argument(
        "--by-count", action="store_true", help="check counts and order, not consecutive RVs"
    )
    args = parser.parse_args()

    ssl_context: ssl.SSLContext | bool = (
        ssl.create_default_context(cafile=args.ca) if args.ca else False
    )
    headers = {"Authorization": f"Bearer {args.token}"} if args.token else {}
    url = f"{args.url}?watch=true&resourceVersion={args.rv}"
    latencies: array.array[int] = array.array("q")
    final_rv = args.rv + args.expect
    by_count = args.expect if args.by_count else None
    clients = [
        Client(Stream(args.rv + 1, args.rv), final_rv, latencies, by_count)
        for _ in range(args.count)
    ]
    readers: list[asyncio.Task[None]] = []
    failed = 0
    gate = asyncio.Semaphore(32)  # bounded connection storm (TLS handshakes are not free)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=None)

    async with aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0, force_close=True), timeout=timeout
    ) as session:

        async def open_one(client: Client) -> None:
            nonlocal failed
            async with gate:
                try:
                    response = await session.get(url, headers=headers, ssl=ssl_context)
                except (aiohttp.ClientError, OSError) as error:
                    client.stream.error = f"connect: {error}"
                    client.complete.set()
                    failed += 1
                    return
            if response.status != 200:
                client.stream.error = f"status {response.status}: {(await response.text())[:200]}"
                client.complete.set()
                response.close()
                failed += 1
                return
            readers.append(asyncio.create_task(client.read(response)))

        try:
            async with asyncio.timeout(args.connect_timeout):
                await asyncio.gather(*(open_one(c) for c in clients))
        except TimeoutError:
            emit({"ready": 0, "failed": args.count, "error": "connect timeout"})
            return
        emit({"ready": args.count - failed, "failed": failed})
        cpu_ready = time.process_time()

        commands = await stdin_reader()
        drain = 30.0
        while True:
            words = (await commands.readline()).decode().split()
            if not words or words[0] == "quit":
                break
            if words[0] == "drain":
                drain = float(words[1])
                break
        pending = [c.complete.wait() for c in clients if not c.complete.is_set()]
        if pending and words:
            try:
                async with asyncio.timeout(drain):
                    await asyncio.gather(*pending)
            except TimeoutError:
                pass
        cpu_used = time.process_time() - cpu_ready  # reading only, not the report below
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)

    if by_count is not None:
        for c in clients:
            c.stream.gaps = max(0, by_count - c.stream.count)
    result: dict[str, Any] = {
        "streams": [asdict(c.stream) for c in clients],
        "latencies_us": latencies.tolist(),
    }
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    emit({"done": True, "cpu_s": round(cpu_used, 3)})


if __name__ == "__main__":
    run(main)
