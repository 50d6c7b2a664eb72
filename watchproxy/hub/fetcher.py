"""One LIST or WATCH of a shared watch, performed through the hub's ports, as outcomes.

The I/O half of the driver (see :mod:`watchproxy.hub.sharedwatch`): it builds the upstream
request of a key, sends it through the :class:`~watchproxy.hub.ports.WatchSource`, and turns
what comes back — pages, lines, errors, silence — into the machine's outcomes. It never calls
the machine: :meth:`Fetcher.list` returns one outcome, :meth:`Fetcher.watch` yields one per
line and is sent the machine's next silence deadline back. A failure is turned into an outcome
value inside its ``except`` and yielded after it, so nothing is awaited while an exception
(and through its traceback, a broken connection) is held.
"""

from __future__ import annotations

import asyncio
import json
import urllib.parse
from collections.abc import AsyncGenerator, Callable, MutableSequence, Sequence
from http import HTTPStatus
from itertools import repeat
from typing import Any

from watchproxy.errors import ProxyError, UpstreamBodyTooLarge
from watchproxy.hub import cachestate
from watchproxy.hub.cachestate import Entry
from watchproxy.hub.cachetypes import ListedObject, parse_rv
from watchproxy.hub.firstsync import FirstSync
from watchproxy.hub.outcomes import (
    Bookmark,
    Broken,
    Ended,
    Event,
    Expired,
    Listed,
    NotShared,
    Opened,
    OpenList,
    OpenWatch,
    Outcome,
    Refused,
    Silent,
    Unshareable,
)
from watchproxy.hub.ports import UpstreamAnswer, UpstreamHealth, WatchSource
from watchproxy.hub.watchkey import WatchKey
from watchproxy.kube.jsonobjects import key_of, rv_of
from watchproxy.kube.representation import ListPage, PageReader, Representation
from watchproxy.metrics import Metrics

LIST_PAGE_SIZE = 500
# A page of a representation parsed whole (Table, PartialObjectMetadata, protobuf: only JSON
# pages are parsed as they arrive) is held whole with its parsed objects: it is asked for with
# a limit that keeps it near WHOLE_PAGE_BYTES, the first with FIRST_WHOLE_PAGE_SIZE objects
# (etcd's objects of at most 1.5 MiB: 30 MiB at worst), the next from the pages before.
WHOLE_PAGE_BYTES = 4 * 1024 * 1024
FIRST_WHOLE_PAGE_SIZE = 20
# The largest LIST item a page read as it arrives may hold (a JSON page is parsed item by item,
# see Fetcher._read_page): etcd stores objects up to 1.5 MiB; upstream.max_event_bytes' default.
MAX_LIST_ITEM_BYTES = 16 * 1024 * 1024
# A replay's upstream watch ends after this long (the apiserver's smallest timeoutSeconds): it
# sends the events it already holds at once, so a quiet key's replay is this long and empty.
REPLAY_SECONDS = 1
REPLAY_FAILED = -1  # what replay() and probe() return when they could not tell
UNAVAILABLE = -2  # current_rv(), replay() and probe(): no answer, or a 5xx or 429 (the
# apiserver is unwell)
# A probe's watch-list ends after this long if its initial events have not (the apiserver
# waits up to 3 s for its watch cache to reach the requested revision before it answers).
PROBE_SECONDS = 5
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
# A cold key's watch-list (see firstsync.py) goes on as its shared watch after the initial
# events: its timeoutSeconds unless the shared watch says otherwise.
INITIAL_EVENTS_SECONDS = 600
_ADDED_LINE = b'{"type":"ADDED",'
# How long the state waits to be built until the first client has taken the relayed lines
# (what its socket cannot take at once waits in its write buffer, which parsing would not
# empty: the loop writes it out between slices). Other clients of the key wait this much more.
RELAY_WRITE_SECONDS = 5.0
# Lines of the initial events parsed between two yields to the event loop: the loop serves
# every other client meanwhile (500: about 1.5 ms of 2.8 KB pods).
PARSE_SLICE = 500


def whole_page_limit(objects: int, body_bytes: int) -> int:
    """The limit of the next page read whole, after one of ``objects`` in ``body_bytes``:
    about WHOLE_PAGE_BYTES of objects like those, 1 to LIST_PAGE_SIZE."""
    if objects <= 0 or body_bytes <= 0:
        return LIST_PAGE_SIZE
    return max(1, min(LIST_PAGE_SIZE, WHOLE_PAGE_BYTES * objects // body_bytes))


def _unwell(status: int) -> bool:
    return status >= 500 or status == 429


def _media_type(content_type: str) -> str:
    return content_type.partition(";")[0].strip().lower()


class _KeptWatch:
    """A cold key's watch-list past its initial events: the key's shared watch from ``rv``."""

    def __init__(
        self,
        rv: str,
        answer: UpstreamAnswer,
        batches: AsyncGenerator[tuple[list[bytes], int], None],
        after: list[bytes],
    ) -> None:
        self.rv = rv
        self.answer = answer
        self._batches = batches
        self._after = after

    async def lines(self) -> AsyncGenerator[bytes, None]:
        """Its lines from the end bookmark on, the rest of the batch it ended first."""
        after, self._after = self._after, []
        try:
            for line in after:
                yield line
            async for batch, _ in self._batches:
                for line in batch:
                    yield line
        finally:
            await self._batches.aclose()

    async def close(self) -> None:
        await self._batches.aclose()
        self.answer.close()


# What :meth:`Fetcher.watch` yields and is sent: outcomes out, the next silence deadline in.
WatchOutcomes = AsyncGenerator[Outcome, float]


class Fetcher:
    """Sends one key's upstream requests and reports what came back as outcomes."""

    def __init__(
        self,
        key: WatchKey,
        representation: Representation,
        *,
        source: WatchSource,
        health: UpstreamHealth,
        metrics: Metrics,
        forwarded_auth: str | None,
        clock: Callable[[], float],
        cache_admits: Callable[[int], bool] = lambda _bytes: True,
        first_sync: FirstSync | None = None,
        initial_timeout_seconds: int = INITIAL_EVENTS_SECONDS,
        watch_lists_refused: Callable[[], None] = lambda: None,
        cached: Callable[[str], Entry | None] = lambda _key: None,
    ) -> None:
        self.key = key
        # The cache's entry of a key: a relisted object it holds at the same resourceVersion
        # is kept as the cache's bytes, not as a second copy (see _listed).
        self._cached = cached
        # The key's first client, relayed the first list's lines (taken by the first list).
        self.first_sync = first_sync
        # The first list's watch-list goes on as the shared watch: its lifetime.
        self.initial_timeout_seconds = initial_timeout_seconds
        # Told when the apiserver refuses watch-lists (422): the hub stops trying them.
        self._watch_lists_refused = watch_lists_refused
        self._kept: _KeptWatch | None = None
        self.representation = representation
        self.source = source
        self.health = health
        self._received = metrics.events_received.labels(key.resource_label)
        self._sent = metrics.events_sent.labels(key.resource_label)  # relayed, first_sync
        self.forwarded_auth = forwarded_auth
        self.clock = clock
        self._cache_admits = cache_admits

    def _broken(self, error: ProxyError) -> Broken:
        return Broken(error.message, down=self.health.down)

    def _path(self, **extra: str) -> str:
        params: dict[str, str] = {}
        if self.key.label_selector:
            params["labelSelector"] = self.key.label_selector
        if self.key.field_selector:
            params["fieldSelector"] = self.key.field_selector
        if self.key.include_object:
            params["includeObject"] = self.key.include_object
        params.update(self.representation.query_params)
        params.update(extra)
        query = urllib.parse.urlencode(params, quote_via=urllib.parse.quote, safe="")
        return f"{self.key.collection_path}?{query}"

    async def _open(self, path_qs: str, verb: str) -> UpstreamAnswer:
        rep = self.representation
        accept = rep.list_accept_header if verb == "list" else rep.watch_accept_header
        return await self.source.open(
            path_qs, accept=accept, verb=verb, forwarded_auth=self.forwarded_auth
        )

    async def list(self, action: OpenList) -> Outcome:
        """A full paginated list, as one outcome; the first list of a key with a first client
        to relay to is a watch-list instead (see :mod:`watchproxy.hub.firstsync`)."""
        relay, self.first_sync = self.first_sync, None
        if relay is not None and not action.relist and action.not_older_than is None:
            outcome = await self.initial_events(relay)
            if outcome is not None:
                return outcome
        items: list[dict[str, Any] | ListedObject] = []
        list_rv: str | None = None
        token = ""
        listed_bytes = 0
        whole_pages = self.representation.list_page_reader(MAX_LIST_ITEM_BYTES) is None
        limit = FIRST_WHOLE_PAGE_SIZE if whole_pages else LIST_PAGE_SIZE
        while True:
            extra = {"limit": str(limit)}
            if token:
                extra["continue"] = token  # (the apiserver forbids resourceVersion with it)
            elif action.not_older_than is not None:
                extra["resourceVersion"] = action.not_older_than
                extra["resourceVersionMatch"] = "NotOlderThan"
            try:
                answer = await self._open(self._path(**extra), "list")
            except ProxyError as error:
                return self._broken(error)
            rep = self.representation
            streamed = None
            if answer.status == 200 and _media_type(answer.content_type) == rep.content_type:
                streamed = rep.list_page_reader(MAX_LIST_ITEM_BYTES)
            if streamed is not None:
                # Parsed as it arrives: the page's body is never held whole, only the item
                # being read and its line, which the cache keeps.
                first = len(items)
                read = await self._read_page(answer, streamed, items, action, listed_bytes)
                if not isinstance(read, ListPage):
                    return read
                page_rv, token, remaining = read.rv, read.token, read.remaining
            else:
                try:
                    body = await answer.body()
                except UpstreamBodyTooLarge as error:
                    if action.relist:  # a shared key's relist: an upstream error, retried
                        return self._broken(error)
                    return Unshareable(NotShared.CACHE_FULL)  # one page beyond the budget
                except ProxyError as error:
                    return self._broken(error)
                finally:
                    answer.close()
                if answer.status == 410 and token:
                    items, list_rv, token = [], None, ""  # the continue token expired: over
                    continue
                if answer.status == HTTPStatus.NOT_ACCEPTABLE:
                    # No such encoding for this kind (protobuf for a custom resource, say).
                    return Unshareable(NotShared.UNENCODABLE)
                if answer.status != 200:
                    return Refused(answer.status, body, answer.content_type, answer.retry_after)
                if _media_type(answer.content_type) != rep.content_type:
                    # The apiserver answered in another encoding than the one asked for: the
                    # kind has no such encoding either.
                    return Unshareable(NotShared.UNENCODABLE)
                try:
                    page = rep.decode_list_page_lines(body)
                    first = len(items)
                    items.extend(self._listed(obj, line) for obj, line in page.items)
                    page_rv, token, remaining = page.rv, page.token, page.remaining
                except (ValueError, KeyError, TypeError, AttributeError) as error:
                    return Broken(f"unreadable list: {type(error).__name__}")
                limit = whole_page_limit(len(items) - first, len(body))
                del page, body  # not held while the next page is read
            page_bytes = sum(i.size for i in items[first:] if isinstance(i, ListedObject))
            listed_bytes += page_bytes
            # What the whole list will take, from this page's average and the apiserver's
            # remainingItemCount when it gives one: a collection that cannot fit is refused
            # after its first page rather than after the budget's worth of pages.
            expected = listed_bytes
            if remaining is not None and len(items) > first:
                expected += page_bytes * remaining // (len(items) - first)
            if not action.relist and not self._cache_admits(expected):
                # The key is not shared (see the multiplexer), nothing is kept.
                return Unshareable(NotShared.CACHE_FULL)
            list_rv = list_rv or page_rv
            if not token:
                return Listed(items, list_rv)

    def _listed(self, obj: dict[str, Any], line: bytes | None) -> ListedObject:
        """A listed object as the cache keeps it; one the cache holds at the same
        resourceVersion already (a relist's unchanged objects, nearly all of them) is its
        cached form, so that a relist holds the collection once, not twice."""
        listed = cachestate.listed(self.representation, obj, line)
        entry = self._cached(listed.key)
        if entry is not None and entry.rv == listed.rv:
            return ListedObject(listed.key, listed.rv, entry.kept, entry.size)
        return listed

    async def _read_page(
        self,
        answer: UpstreamAnswer,
        reader: PageReader,
        items: MutableSequence[dict[str, Any] | ListedObject],
        action: OpenList,
        listed_bytes: int,
    ) -> ListPage | Outcome:
        """One LIST page (a 200 in the key's encoding) parsed as its body arrives, its objects
        appended to ``items`` in the form the cache keeps; its metadata, or the outcome that
        ends the list. What was listed so far is held against the cache budget as it grows."""
        pieces = answer.pieces()
        outcome: Outcome | None = None
        try:
            async for piece in pieces:
                for obj, line in reader.feed(piece):
                    listed = self._listed(obj, line)
                    items.append(listed)
                    listed_bytes += listed.size
                del piece
                if not action.relist and not self._cache_admits(listed_bytes):
                    outcome = Unshareable(NotShared.CACHE_FULL)  # nothing is kept
                    break
            else:
                last, page = reader.finish()
                items.extend(self._listed(obj, line) for obj, line in last)
                return page
        except UpstreamBodyTooLarge as error:
            # Inflated past the cache budget: a shared key's relist fails as an upstream
            # error and is retried; a first list is not shared.
            outcome = self._broken(error) if action.relist else Unshareable(NotShared.CACHE_FULL)
        except ProxyError as error:
            outcome = self._broken(error)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            outcome = Broken(f"unreadable list: {type(error).__name__}")
        finally:
            await pieces.aclose()
            answer.close()
        return outcome

    async def initial_events(self, relay: FirstSync) -> Outcome | None:
        """The key's first list, read from one upstream watch-list up to its initial-events-end
        bookmark, its lines relayed to ``relay`` as they come: Listed at that bookmark's RV.
        Refused with its answer when the apiserver refuses it, but None when it refuses
        watch-lists (422) or answers in another encoding: nothing was relayed, the caller
        lists page by page."""
        try:
            return await self._initial_events(relay)
        finally:
            relay.abandon()  # unless it ended or was abandoned: a failure, a cancel, a bug

    async def _initial_events(self, relay: FirstSync) -> Outcome | None:
        path = self._path(
            watch="true",
            sendInitialEvents="true",
            resourceVersionMatch="NotOlderThan",
            allowWatchBookmarks="true",
            timeoutSeconds=str(self.initial_timeout_seconds),
        )
        try:
            answer = await self._open(path, "watch")
        except ProxyError as error:
            return self._broken(error)
        if answer.status == 422:  # no watch-lists here (the WatchList gate is off): pages
            answer.close()
            self._watch_lists_refused()
            return None
        if answer.status != 200:
            # The key's answer (a 404 for a resource that is not there, a 403, a 429): as
            # the LIST's would be, without a LIST to learn it again.
            try:
                body = await answer.body()
            except ProxyError as error:
                return self._broken(error)
            finally:
                answer.close()
            return Refused(answer.status, body, answer.content_type, answer.retry_after)
        if _media_type(answer.content_type) != "application/json":
            answer.close()
            return None
        relay.open()
        # Every ADDED line, parsed once all are in. The body comes cut into lines, a piece's
        # worth at a time (nearly always ADDED ones only), and the client is relayed those
        # very lines: were it relayed the body's pieces, a client slower than
        # RELAY_WRITE_SECONDS would hold them in its buffers while the state holds the lines
        # cut from them, the collection twice (test_hub_sync_memory).
        kept: list[bytes] = []
        end_rv: str | None = None
        after: list[bytes] = []  # what came after the end bookmark in its batch
        outcome: Outcome | None = None
        handed = False  # the stream is the first client's (see FirstSync.hand_over)
        size = 0
        batches = answer.line_batches()
        try:
            async for lines, batch_size in batches:
                if _all_added(lines):
                    relay.put(lines, batch_size)
                    kept.extend(lines)
                    size += batch_size
                else:
                    parts, end_rv, strange, after = _initial_lines(lines)
                    for added, bookmark, end in parts:
                        part_size = sum(map(len, added))
                        relay.put(added, part_size)
                        kept.extend(added)
                        size += part_size
                        if bookmark is not None:
                            relay.bookmark(bookmark, end=end)
                            if end:
                                self._learn_kind(bookmark)
                    if strange is not None:
                        outcome = Broken(f"{strange} in the initial events of a watch-list")
                        break
                if not self._cache_admits(size):
                    # Not shared: the first client has had part of the initial events, and
                    # gets the rest of this stream as its own, as a client passed through.
                    outcome = Unshareable(NotShared.CACHE_FULL)
                    handed = relay.hand_over(_KeptWatch("", answer, batches, after))
                    break
                if end_rv is not None:
                    break
            else:
                outcome = Broken("the watch-list ended before its initial events did")
        except ProxyError as error:
            outcome = self._broken(error)
        finally:
            if (end_rv is None or outcome is not None) and not handed:
                await batches.aclose()
                answer.close()
        if outcome is not None or end_rv is None:
            relay.fail()  # (not after a hand-over)
            return outcome or Broken("no initial-events-end bookmark")
        # The same stream goes on as the key's shared watch from the end bookmark's RV: one
        # upstream request for the list and the watch (see watch()).
        self._kept = _KeptWatch(end_rv, answer, batches, after)
        relay.end(end_rv)
        await relay.written(RELAY_WRITE_SECONDS)
        listed = await self._listed_lines(kept, end_rv)
        if not isinstance(listed, Listed):
            await self.close()
        return listed

    def _learn_kind(self, bookmark: bytes) -> None:
        """The kind and apiVersion of the key's objects, from a watch-list's end bookmark: of
        an empty collection it is the only object there is, and the hub's own bookmarks are
        made of the kind a paged LIST would have taught (client-go refuses a kindless one)."""
        _, obj = self.representation.decode_event(bookmark)
        self.representation.prepare(obj)

    async def close(self) -> None:
        """Close what the fetcher keeps open between two outcomes (see :meth:`watch`)."""
        kept, self._kept = self._kept, None
        if kept is not None:
            await kept.close()

    async def _listed_lines(self, lines: Sequence[bytes], rv: str) -> Outcome:
        """ADDED lines as the cache keeps their objects (the lines themselves), parsed a
        slice at a time."""
        rep = self.representation
        items: list[dict[str, Any] | ListedObject] = []
        parsed = 0
        try:
            for line in lines:
                kind, obj = rep.decode_event(line)
                if kind != "ADDED":
                    return Broken(f"an event of type {kind} in the initial events")
                items.append(cachestate.listed(rep, rep.prepare(obj), line))
                parsed += 1
                if parsed % PARSE_SLICE == 0:
                    await asyncio.sleep(0)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            return Broken(f"unreadable initial event: {type(error).__name__}")
        self._sent.inc(len(items))
        return Listed(items, rv)

    async def watch(self, action: OpenWatch) -> WatchOutcomes:
        """One upstream watch, read to its end, as outcomes.

        A 200 yields :class:`Opened`, then one outcome per line, then how the watch ended;
        after each but the last the caller sends back the deadline by which the next line
        must come (else the watch is :class:`Silent`). Any other answer yields one outcome.
        The caller ``aclose()``s it as soon as it stops reading, which closes the answer.
        """
        path = self._path(
            watch="true",
            allowWatchBookmarks="true",
            resourceVersion=action.resource_version,
            timeoutSeconds=str(action.timeout_seconds),
        )
        outcome: Outcome
        kept, self._kept = self._kept, None
        if kept is not None and kept.rv != action.resource_version:
            await kept.close()  # the watch starts elsewhere (a client wants older history)
            kept = None
        try:
            answer = kept.answer if kept is not None else await self._open(path, "watch")
        except ProxyError as error:
            outcome = self._broken(error)
        else:
            try:
                if answer.status != 200:
                    outcome = await self._refusal(answer)
                else:
                    deadline = yield Opened()
                    loop = asyncio.get_running_loop()
                    lines: AsyncGenerator[bytes, None]
                    if kept is not None:
                        lines = kept.lines()
                    elif self.representation.framed:
                        lines = answer.frames()
                    else:
                        lines = answer.lines()
                    try:
                        # The silence timer, moved by every line the machine takes in: a
                        # half-open connection or a hung apiserver reads nothing, forever.
                        # It spans the yields: the driver awaits nothing between taking an
                        # outcome and sending the next deadline, so it only fires in a read.
                        start = loop.time() + deadline - self.clock()
                        async with asyncio.timeout_at(start) as silence:
                            async for line in lines:
                                if not line.strip():
                                    continue
                                deadline = yield self._parse(line)
                                silence.reschedule(loop.time() + deadline - self.clock())
                        outcome = Ended()
                    except TimeoutError:
                        outcome = Silent()
                    except ProxyError as error:
                        outcome = self._broken(error)
                    finally:
                        await lines.aclose()
            finally:
                answer.close()
        yield outcome

    async def _refusal(self, answer: UpstreamAnswer) -> Outcome:
        """The outcome of a watch the apiserver did not answer with 200."""
        try:
            body = await answer.body()
        except ProxyError as error:
            return self._broken(error)
        if answer.status == 410:
            return Expired(self.representation.error_event_from_body(body))
        return Refused(answer.status, body, answer.content_type, answer.retry_after)

    def _parse(self, line: bytes) -> Outcome:
        try:
            kind, obj = self.representation.decode_event(line)
            if kind == "BOOKMARK":
                self.representation.learn_bookmark(obj)
                return Bookmark(str((obj.get("metadata") or {})["resourceVersion"]))
            if kind == "ERROR":
                if obj.get("code") == 410:
                    return Expired(line)
                return Broken(f"upstream watch error: {obj.get('message')}")
            if kind not in ("ADDED", "MODIFIED", "DELETED"):
                return Broken(f"unexpected watch event type {kind!r}")
            self._received.inc()
            return Event(kind, obj)
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            return Broken(f"unreadable watch event: {type(error).__name__}")

    async def current_rv(self) -> int | None:
        """The apiserver's current revision, from a one-item LIST of the key's collection sent
        now (a consistent read, as every LIST without a resourceVersion); None if refused or
        unreadable, UNAVAILABLE if the apiserver could not answer."""
        try:
            answer = await self.source.open(
                f"{self.key.collection_path}?limit=1",
                accept="application/json",
                verb="list",
                forwarded_auth=self.forwarded_auth,
            )
        except ProxyError:
            return UNAVAILABLE
        try:
            body = await answer.body()
        except ProxyError:
            return UNAVAILABLE
        finally:
            answer.close()
        if answer.status != 200:
            return UNAVAILABLE if _unwell(answer.status) else None
        try:
            return parse_rv(json.loads(body)["metadata"]["resourceVersion"])
        except (ValueError, KeyError, TypeError):
            return None

    async def replay(self, since: str, up_to: int) -> int | None:
        """The resourceVersion of the key's last change in (``since``, ``up_to``], read from a
        short upstream watch from ``since``; None when there was none, REPLAY_FAILED when the
        watch could not tell (refused, expired, broken), UNAVAILABLE if the apiserver could not
        answer. Once the apiserver has answered a
        consistent read at ``up_to``, such a watch replays every change up to it at once."""
        path = self._path(watch="true", resourceVersion=since, timeoutSeconds=str(REPLAY_SECONDS))
        rep = self.representation
        newest: int | None = None
        try:
            answer = await self._open(path, "watch")
        except ProxyError:
            return UNAVAILABLE
        try:
            if answer.status != 200:
                return UNAVAILABLE if _unwell(answer.status) else REPLAY_FAILED
            records = answer.frames() if rep.framed else answer.lines()
            try:
                # Bounded even if the apiserver ignored timeoutSeconds.
                async with asyncio.timeout(REPLAY_SECONDS + 10):
                    async for record in records:
                        if not record.strip():
                            continue
                        kind, obj = rep.decode_event(record)
                        if kind == "BOOKMARK":
                            rv = parse_rv(str(obj["metadata"]["resourceVersion"]))
                        elif kind in ("ADDED", "MODIFIED", "DELETED"):
                            rv = parse_rv(rep.object_rv(obj))
                        else:
                            return REPLAY_FAILED  # an ERROR: 410 Expired, or worse
                        if rv > up_to:
                            break  # events come in resourceVersion order: the rest are later
                        if kind != "BOOKMARK":
                            newest = rv
            except (TimeoutError, ProxyError, ValueError, KeyError, TypeError, AttributeError):
                return REPLAY_FAILED
            finally:
                await records.aclose()
        finally:
            answer.close()
        return newest

    async def probe(self, at_least: int, max_objects: int) -> tuple[int, dict[str, int]] | int:
        """The resourceVersion B of the initial-events-end bookmark of a watch-list of the key
        from ``at_least`` (``NotOlderThan``, so B >= ``at_least``), closed at that bookmark,
        and the key's objects at B (key -> resourceVersion); REPLAY_FAILED when it could not
        tell (refused, more than ``max_objects`` objects, no such bookmark in time),
        UNAVAILABLE if the apiserver could not answer.

        Always JSON, whatever the key's representation: only names and resourceVersions are
        read, which every representation keys the same way, and a protobuf bookmark's
        annotations are not decoded."""
        params: dict[str, str] = {}
        if self.key.label_selector:
            params["labelSelector"] = self.key.label_selector
        if self.key.field_selector:
            params["fieldSelector"] = self.key.field_selector
        params.update(
            watch="true",
            sendInitialEvents="true",
            resourceVersionMatch="NotOlderThan",
            resourceVersion=str(at_least),
            allowWatchBookmarks="true",
            timeoutSeconds=str(PROBE_SECONDS),
        )
        query = urllib.parse.urlencode(params, quote_via=urllib.parse.quote, safe="")
        objects: dict[str, int] = {}
        try:
            answer = await self.source.open(
                f"{self.key.collection_path}?{query}",
                accept="application/json",
                verb="watch",
                forwarded_auth=self.forwarded_auth,
            )
        except ProxyError:
            return UNAVAILABLE
        try:
            if answer.status != 200:
                return UNAVAILABLE if _unwell(answer.status) else REPLAY_FAILED
            if _media_type(answer.content_type) != "application/json":
                return REPLAY_FAILED
            records = answer.lines()
            try:
                # Bounded even if the apiserver ignored timeoutSeconds.
                async with asyncio.timeout(PROBE_SECONDS + 1):
                    async for record in records:
                        if not record.strip():
                            continue
                        event = json.loads(record)
                        kind, obj = event["type"], event["object"]
                        if kind == "BOOKMARK":
                            meta = obj.get("metadata") or {}
                            if (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                                return parse_rv(str(meta["resourceVersion"])), objects
                        elif kind == "ADDED":
                            objects[key_of(obj)] = parse_rv(rv_of(obj))
                            if len(objects) > max_objects:
                                return REPLAY_FAILED
                        else:
                            return REPLAY_FAILED  # an ERROR, or a change before the end
            except (TimeoutError, ProxyError, ValueError, KeyError, TypeError, AttributeError):
                return REPLAY_FAILED
            finally:
                await records.aclose()
        finally:
            answer.close()
        return REPLAY_FAILED  # ended without its initial-events-end bookmark


# A run of a watch-list's initial events: ADDED lines, then the bookmark that ended the run
# (None at the end of a batch) and whether it is the initial-events-end one.
_Run = tuple[list[bytes], bytes | None, bool]


def _initial_lines(
    batch: list[bytes],
) -> tuple[list[_Run], str | None, str | None, list[bytes]]:
    """A batch of a watch-list's lines before its end, in runs (nearly always one: its ADDED
    lines); the end bookmark's RV if it came; what else came, if anything did; the lines
    after the end bookmark (the shared watch's first)."""
    runs: list[_Run] = []
    start = 0
    for index, line in enumerate(batch):
        if line.startswith(_ADDED_LINE) or not line.strip():
            continue
        try:
            event = json.loads(line)
            kind, obj = event["type"], event["object"]
            if kind != "BOOKMARK":
                # The client gets it as the apiserver sent it, its stream ends after it.
                runs.append(([*_added(batch[start:index]), line], None, False))
                return runs, None, f"an event of type {kind}", []
            meta = obj["metadata"]
            end = (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true"
            runs.append((_added(batch[start:index]), line, end))
            start = index + 1
            if end:
                return runs, str(meta["resourceVersion"]), None, batch[start:]
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            return runs, None, f"an unreadable line ({type(error).__name__})", []
    runs.append((_added(batch[start:] if start else batch), None, False))
    return runs, None, None, []


def _all_added(lines: list[bytes]) -> bool:
    """Whether every line is an ADDED event, as a watch-list's initial events are but for a
    bookmark, or an ERROR, which goes to the client as the apiserver sent it.

    One C call per line, at its first bytes, where a search of the body's piece for a
    bookmark line (``in``) read every byte of it again."""
    return all(map(bytes.startswith, lines, repeat(_ADDED_LINE)))


def _added(lines: list[bytes]) -> list[bytes]:
    """``lines`` without blank ones (which only a line-per-line reader would drop)."""
    if all(line.startswith(_ADDED_LINE) for line in lines):
        return lines
    return [line for line in lines if line.strip()]
