"""Role: the fake apiserver and the event generator, in one process.

``python -m bench.fake --dir DIR [--objects K] [--object-bytes B] [--no-tls]
[--max-in-flight N --service-seconds S [--jitter]]`` prints ``{"url", "ca", "token",
"kubeconfig", "rv"}`` once it serves, then answers commands. With ``--max-in-flight`` it serves
like an apiserver with ``--max-requests-inflight`` (``Faults.limit_in_flight``): each request
that is not a watch takes S seconds (0.5 to 1.5 times S with ``--jitter``), and one beyond N
in flight gets 429.

- ``state``: ``{"rv": <store RV>, "watches": <open watch streams>}``
- ``busy N``: answers ``{"in_flight": n}`` once n >= N requests are being served at once
  (``{"error"}`` after 10 s)
- ``arrivals``: ``{"arrivals": [[<time.monotonic() at arrival>, <User-Agent>], ...]}``, every
  request since start-up or the last ``arrivals``/``gen``, in arrival order; forgets them
- ``poke``: one write between cells (no answer)
- ``gen E R``: modify the K configmaps round-robin E times, at R events/s (R <= 0: as fast as
  the loop allows, yielding after each write so the watch streams interleave). Every object is
  stamped with ``bench/sent-ns`` = time.time_ns() right before its write. Answers
  ``{"first_ns", "last_ns", "rv_first", "rv_last", "late_ms"}`` when the last write is done
  (``late_ms``: how far the paced schedule slipped at worst).

Only the generator writes after start-up, so the E events carry RVs rv_first..rv_last with no
gaps: subscribers check exactly that.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from bench.roles import NAMESPACE, RESOURCE, STAMP_KEY, emit, generate, run, serve_commands
from kubefake import FakeApiServer


class Generator:
    """Writes stamped modifications to a fixed set of objects."""

    def __init__(self, fake: FakeApiServer, objects: int, object_bytes: int) -> None:
        self.fake = fake
        self.names = [f"bench-{i}" for i in range(objects)]
        self.seq = 0
        payload = "x" * max(0, object_bytes - 300)  # ~300 bytes of envelope and metadata
        for name in self.names:
            fake.store.create(
                RESOURCE,
                NAMESPACE,
                {
                    "metadata": {"name": name, "labels": {"app": "bench"}},
                    "data": {"seq": "0", "payload": payload},
                },
            )

    def _write_one(self) -> int:
        self.seq += 1
        seq = self.seq

        def stamp(obj: dict[str, Any]) -> None:
            obj["data"]["seq"] = str(seq)
            obj["metadata"].setdefault("annotations", {})[STAMP_KEY] = str(time.time_ns())

        name = self.names[seq % len(self.names)]
        written = self.fake.store.modify(RESOURCE, NAMESPACE, name, stamp)
        return int(written["metadata"]["resourceVersion"])

    def poke(self) -> None:
        self.fake.store.modify(
            RESOURCE, NAMESPACE, self.names[0], lambda obj: obj["data"].update(poke=str(self.seq))
        )
        self.seq += 1

    async def generate(self, events: int, rate: float) -> dict[str, Any]:
        async def write_one() -> int:
            return self._write_one()

        return await generate(write_one, events, rate)


async def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.fake")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--objects", type=int, default=50)
    parser.add_argument("--object-bytes", type=int, default=1024)
    parser.add_argument("--history", type=int, default=200_000)
    parser.add_argument("--no-tls", action="store_true")
    parser.add_argument("--max-in-flight", type=int, default=None)
    parser.add_argument("--service-seconds", type=float, default=0.0)
    parser.add_argument("--jitter", action="store_true")
    args = parser.parse_args()

    fake = FakeApiServer(tls=not args.no_tls, history_size=args.history, bookmark_interval=5.0)
    if args.max_in_flight is not None:
        fake.faults.limit_in_flight(args.max_in_flight, args.service_seconds, jitter=args.jitter)
    await fake.start()
    try:
        generator = Generator(fake, args.objects, args.object_bytes)
        kubeconfig = fake.write_kubeconfig(os.path.join(args.dir, "upstream.kubeconfig"))
        emit(
            {
                "url": fake.url,
                "ca": fake.ca_path,
                "token": fake.token,
                "kubeconfig": kubeconfig,
                "rv": fake.store.resource_version,
            }
        )

        async def handle(words: list[str]) -> dict[str, Any] | None:
            if words[0] == "state":
                return {"rv": fake.store.resource_version, "watches": fake.stats.active_watches}
            if words[0] == "busy":
                wanted = int(words[1])
                try:
                    await fake.stats.wait_until(lambda s: s.in_flight >= wanted, within=10.0)
                except TimeoutError:
                    return {"error": f"fewer than {wanted} requests in flight for 10 s"}
                return {"in_flight": fake.stats.in_flight}
            if words[0] == "arrivals":
                seen = [[r.time, r.headers.get("User-Agent", "")] for r in fake.stats.requests]
                fake.stats.reset()
                return {"arrivals": seen}
            if words[0] == "poke":
                # One write outside any cell: wakes idle watchproxy subscribers of clients that
                # have gone, so they notice at once instead of at their next liveness poll.
                generator.poke()
                return None
            if words[0] == "gen":
                fake.stats.reset()  # keep the request log from growing over a long run
                return await generator.generate(int(words[1]), float(words[2]))
            return {"error": f"unknown command {words[0]!r}"}

        await serve_commands(handle)
    finally:
        await fake.stop()


if __name__ == "__main__":
    run(main)
