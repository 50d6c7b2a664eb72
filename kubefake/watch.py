"""WATCH: options, per-watcher filtering of changes (as the watch cache does), event encoding,
and the streaming loop with bookmarks and an exact timeout."""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .context import CUT, OpenStream, ServerContext
from .errors import Expired
from .listing import parse_rv
from .options import ListOptions
from .resources import ResourceType
from .selectors import Filter
from .store import Change, Obj, etcd_order
from .table import METADATA, TABLE, Representation, partial_metadata, to_table
from .websocket import WebSocketWatch, is_websocket, websocket_refusal

INITIAL_EVENTS_END = "k8s.io/initial-events-end"


@dataclass(frozen=True)
class WatchOptions:
    rv: int | None
    send_initial_events: bool | None
    allow_bookmarks: bool
    timeout: float | None

    @property
    def ends_initial_events(self) -> bool:
        """The initial events end with the annotated bookmark: asked for, or (kube-apiserver
        1.34 on) by default for a watch from "now" that allows bookmarks."""
        if self.send_initial_events is not None:
            return self.send_initial_events
        return not self.rv and self.allow_bookmarks

    @classmethod
    def of(cls, options: ListOptions) -> WatchOptions:
        """From decoded and validated ListOptions; timeoutSeconds 0 (or absent) is the server's
        choice, a negative one ends the watch at once."""
        seconds = options.timeout_seconds
        return cls(
            parse_rv(options.resource_version),
            options.send_initial_events,
            options.allow_watch_bookmarks,
            None if not seconds else float(seconds),
        )


def _with_rv(obj: Obj, rv: int) -> Obj:
    return {**obj, "metadata": {**obj.get("metadata", {}), "resourceVersion": str(rv)}}


def filter_change(change: Change, flt: Filter) -> tuple[str, Obj] | None:
    """The event one watcher sees for a change: leaving its selector is DELETED (the old state
    at the new RV), entering it is ADDED, as in the apiserver's cacheWatcher."""
    now = change.type != "DELETED" and flt.matches(change.obj)
    before = change.prev is not None and flt.matches(change.prev)
    if change.type == "ADDED":
        return ("ADDED", change.obj) if now else None
    if change.type == "DELETED":
        return ("DELETED", change.obj) if before else None
    if now and before:
        return ("MODIFIED", change.obj)
    if now:
        return ("ADDED", change.obj)
    if before and change.prev is not None:
        return ("DELETED", _with_rv(change.prev, change.rv))
    return None


class EventEncoder:
    """Encodes a watch's events in its representation; Table column definitions go only in the
    first event (the apiserver's watchEmbeddedEncoder sets NoHeaders after it)."""

    def __init__(self, rt: ResourceType, rep: Representation, include_object: str) -> None:
        self._rt = rt
        self._rep = rep
        self._include = include_object
        self._first = True

    def _line(self, event_type: str, obj: Obj) -> bytes:
        return (
            json.dumps({"type": event_type, "object": obj}, separators=(",", ":")).encode() + b"\n"
        )

    def encode(self, event_type: str, obj: Obj) -> bytes:
        if self._rep.kind == TABLE:
            rv = obj.get("metadata", {}).get("resourceVersion", "")
            obj = to_table(
                self._rt,
                [obj],
                now=time.time(),
                list_meta={"resourceVersion": rv},
                include_object=self._include,
                with_columns=self._first,
                version=self._rep.version,
            )
            self._first = False
        elif self._rep.kind == METADATA:
            obj = partial_metadata(obj, self._rep.version)
        return self._line(event_type, obj)

    def bookmark(self, rv: int, *, initial_events_end: bool = False) -> bytes:
        meta: dict[str, Any] = {"resourceVersion": str(rv)}
        if initial_events_end:
            meta["annotations"] = {INITIAL_EVENTS_END: "true"}
        obj: Obj
        if self._rep.kind == TABLE:
            obj = {
                "kind": "Table",
                "apiVersion": self._rep.api_version,
                "metadata": meta,
                "columnDefinitions": None,
                "rows": [],
            }
        elif self._rep.kind == METADATA:
            obj = {
                "kind": "PartialObjectMetadata",
                "apiVersion": self._rep.api_version,
                "metadata": meta,
            }
        else:
            obj = {"kind": self._rt.kind, "apiVersion": self._rt.api_version, "metadata": meta}
        return self._line("BOOKMARK", obj)

    def error(self, status: Obj) -> bytes:
        return self._line("ERROR", status)


async def serve_watch(
    request: web.Request,
    ctx: ServerContext,
    rt: ResourceType,
    flt: Filter,
    rep: Representation,
    include_object: str,
    headers: Mapping[str, str],
    options: ListOptions,
) -> web.StreamResponse:
    opts = WatchOptions.of(options)
    stream = OpenStream(request.transport, watch=True)
    overflow = False

    def on_change(change: Change) -> None:
        nonlocal overflow
        if stream.queue.qsize() >= ctx.max_watch_buffer:
            overflow = True  # a watcher that cannot keep up is ended alone
            stream.queue.put_nowait(CUT)
            return
        stream.queue.put_nowait(change)

    # Subscribing and reading the initial state happen in one step: nothing is missed or repeated.
    unsubscribe = ctx.store.subscribe(rt.name, on_change)
    opened = False
    ws_watch: WebSocketWatch | None = None  # closed on the way out, however the watch ends
    try:
        initial: list[tuple[str, Obj]] = []
        expired: Expired | None = None
        initial_events = opts.send_initial_events or (
            opts.send_initial_events is None and not opts.rv
        )
        try:
            if initial_events:
                objects, last_rv = ctx.store.snapshot(rt.name)
                initial = [
                    ("ADDED", objects[k])
                    for k in sorted(objects, key=etcd_order)
                    if flt.matches(objects[k])
                ]
            elif opts.rv is None:
                last_rv = ctx.store.resource_version
            else:
                last_rv = opts.rv
                for change in ctx.store.changes_since(rt.name, opts.rv):
                    event = filter_change(change, flt)
                    if event is not None:
                        initial.append(event)
        except Expired as exc:
            expired = exc
        resp: web.StreamResponse | WebSocketWatch
        if is_websocket(request):
            refused = websocket_refusal(request)
            if refused is not None:
                return refused
            resp = ws_watch = WebSocketWatch(request, stream)
        else:
            resp = web.StreamResponse(
                status=200, headers={**headers, "Content-Type": "application/json"}
            )
            resp.enable_chunked_encoding()
        await resp.prepare(request)
        ctx.streams.add(stream)
        ctx.stats.watch_opened(request.path)
        opened = True
        encoder = EventEncoder(rt, rep, include_object)
        if expired is not None:
            await resp.write(encoder.error(expired.status()))
            await resp.write_eof()
            return _answer(resp)
        if ctx.faults.hang:
            while await stream.queue.get() is not CUT:
                pass
            return _answer(resp)
        await _stream_events(ctx, stream, resp, encoder, flt, opts, initial, last_rv)
        if not stream.cut_off or overflow:
            await resp.write_eof()
        return _answer(resp)
    except ConnectionError:
        return web.Response()  # the client went away: nothing left to write
    finally:
        if ws_watch is not None:
            await ws_watch.close()
        unsubscribe()
        ctx.streams.discard(stream)
        if opened:
            ctx.stats.watch_closed()


def _answer(resp: web.StreamResponse | WebSocketWatch) -> web.StreamResponse:
    return resp.response if isinstance(resp, WebSocketWatch) else resp


def _default_timeout(ctx: ServerContext) -> float:
    # The apiserver picks a random lifetime in [minRequestTimeout, 2*minRequestTimeout).
    return 1800.0 * (1.0 + ctx.rng.random())


async def _stream_events(
    ctx: ServerContext,
    stream: OpenStream,
    resp: web.StreamResponse | WebSocketWatch,
    encoder: EventEncoder,
    flt: Filter,
    opts: WatchOptions,
    initial: list[tuple[str, Obj]],
    last_rv: int,
) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + (opts.timeout if opts.timeout is not None else _default_timeout(ctx))
    interval = ctx.bookmark_interval
    next_bookmark = loop.time() + interval if opts.allow_bookmarks else math.inf

    async def write(line: bytes) -> None:
        if ctx.faults.take_garbage():
            line = line[: max(1, len(line) // 2)] + b"\n"
        await resp.write(line)

    for index, (event_type, obj) in enumerate(initial):
        await ctx.faults.before_initial_event(index)
        await write(encoder.encode(event_type, obj))
    if opts.ends_initial_events:
        await write(encoder.bookmark(last_rv, initial_events_end=True))
    while True:
        now = loop.time()
        if now >= deadline:
            return
        if stream.queue.empty():
            if now >= next_bookmark:
                # The queue is empty, so every change up to the store's RV has been delivered.
                await write(encoder.bookmark(ctx.store.resource_version))
                next_bookmark = now + interval
                continue
            try:
                async with asyncio.timeout(min(deadline, next_bookmark) - now):
                    item = await stream.queue.get()
            except TimeoutError:
                continue
        else:
            item = stream.queue.get_nowait()
        if item is CUT:
            return
        assert isinstance(item, Change)
        event = filter_change(item, flt)
        if event is not None:
            delay = ctx.faults.watch_delay or stream.lag
            if delay:
                await asyncio.sleep(delay)  # a lagging watch cache, or a lagging watcher
            await write(encoder.encode(*event))
