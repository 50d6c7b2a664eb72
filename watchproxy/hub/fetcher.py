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
from collections.abc import AsyncGenerator, Callable
from http import HTTPStatus
from typing import Any

from watchproxy.errors import ProxyError, UpstreamBodyTooLarge
from watchproxy.hub import cachestate
from watchproxy.hub.cachetypes import ListedObject, parse_rv
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
from watchproxy.kube.representation import Representation
from watchproxy.metrics import Metrics

LIST_PAGE_SIZE = 500
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


def _unwell(status: int) -> bool:
    return status >= 500 or status == 429


def _media_type(content_type: str) -> str:
    return content_type.partition(";")[0].strip().lower()


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
    ) -> None:
        self.key = key
        self.representation = representation
        self.source = source
        self.health = health
        self._received = metrics.events_received.labels(key.resource_label)
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
        """A full paginated list, as one outcome."""
        items: list[dict[str, Any] | ListedObject] = []
        list_rv: str | None = None
        token = ""
        listed_bytes = 0
        while True:
            extra = {"limit": str(LIST_PAGE_SIZE)}
            if token:
                extra["continue"] = token  # (the apiserver forbids resourceVersion with it)
            elif action.not_older_than is not None:
                extra["resourceVersion"] = action.not_older_than
                extra["resourceVersionMatch"] = "NotOlderThan"
            try:
                answer = await self._open(self._path(**extra), "list")
            except ProxyError as error:
                return self._broken(error)
            try:
                body = await answer.body()
            except UpstreamBodyTooLarge as error:
                if action.relist:  # a shared key's relist: an upstream error, retried
                    return self._broken(error)
                return Unshareable(NotShared.CACHE_FULL)  # one page beyond the whole budget
            except ProxyError as error:
                return self._broken(error)
            finally:
                answer.close()
            if answer.status == 410 and token:
                items, list_rv, token = [], None, ""  # the continue token expired: start over
                continue
            if answer.status == HTTPStatus.NOT_ACCEPTABLE:
                # No such encoding for this kind (protobuf for a custom resource, say).
                return Unshareable(NotShared.UNENCODABLE)
            if answer.status != 200:
                return Refused(answer.status, body, answer.content_type, answer.retry_after)
            if _media_type(answer.content_type) != self.representation.content_type:
                # The apiserver answered in another encoding than the one asked for: the
                # kind has no such encoding either.
                return Unshareable(NotShared.UNENCODABLE)
            rep = self.representation
            try:
                page = rep.decode_list_page_lines(body)
                first = len(items)
                items.extend(cachestate.listed(rep, obj, line) for obj, line in page.items)
                page_rv, token, remaining = page.rv, page.token, page.remaining
            except (ValueError, KeyError, TypeError, AttributeError) as error:
                return Broken(f"unreadable list: {type(error).__name__}")
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
        try:
            answer = await self._open(path, "watch")
        except ProxyError as error:
            outcome = self._broken(error)
        else:
            try:
                if answer.status != 200:
                    outcome = await self._refusal(answer)
                else:
                    deadline = yield Opened()
                    loop = asyncio.get_running_loop()
                    lines = answer.frames() if self.representation.framed else answer.lines()
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
