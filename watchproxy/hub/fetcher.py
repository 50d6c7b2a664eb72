"""One LIST or WATCH of a shared watch, performed through the hub's ports, as outcomes.

The I/O half of the driver (see :mod:`watchproxy.hub.sharedwatch`): it builds the upstream
request of a key, sends it through the :class:`~watchproxy.hub.ports.WatchSource`, and turns
what comes back — pages, lines, errors, silence — into the machine's outcomes. A failure is
turned into an outcome value inside its ``except`` and acted on after it, so nothing is awaited
while an exception (and through its traceback, a broken connection) is held.
"""

from __future__ import annotations

import asyncio
import urllib.parse
from collections.abc import Callable
from typing import Any

from watchproxy.errors import ProxyError, status_object
from watchproxy.hub import cachestate
from watchproxy.hub.cachetypes import ListedObject
from watchproxy.hub.machine import SharedWatchMachine
from watchproxy.hub.outcomes import (
    Bookmark,
    Broken,
    Ended,
    Event,
    Expired,
    Listed,
    Opened,
    OpenList,
    OpenWatch,
    Outcome,
    ReadOn,
    Refused,
    Silent,
    Step,
)
from watchproxy.hub.ports import UpstreamAnswer, UpstreamHealth, WatchSource
from watchproxy.hub.watchkey import WatchKey
from watchproxy.kube.representation import Representation, encode_json
from watchproxy.metrics import Metrics

LIST_PAGE_SIZE = 500


CACHE_FULL = encode_json(
    status_object(
        507,
        "InternalError",
        "watchproxy's cache is full (hub.cache_max_bytes): this collection is not shared",
    )
)


def _media_type(content_type: str) -> str:
    return content_type.partition(";")[0].strip().lower()


class Fetcher:
    """Sends one key's upstream requests; feeds the machine while a watch streams."""

    def __init__(
        self,
        key: WatchKey,
        representation: Representation,
        *,
        source: WatchSource,
        health: UpstreamHealth,
        machine: SharedWatchMachine,
        metrics: Metrics,
        forwarded_auth: str | None,
        clock: Callable[[], float],
        took: Callable[[Step], None],
        cache_admits: Callable[[int], bool] = lambda _bytes: True,
    ) -> None:
        self.key = key
        self.representation = representation
        self.source = source
        self.health = health
        self._machine = machine
        self._received = metrics.events_received.labels(key.resource_label)
        self.forwarded_auth = forwarded_auth
        self.clock = clock
        self._took = took
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
            except ProxyError as error:
                return self._broken(error)
            finally:
                answer.close()
            if answer.status == 410 and token:
                items, list_rv, token = [], None, ""  # the continue token expired: start over
                continue
            if answer.status != 200:
                return Refused(answer.status, body, answer.content_type, answer.retry_after)
            if _media_type(answer.content_type) != self.representation.content_type:
                # A kind the apiserver has no such encoding for (a custom resource asked
                # for protobuf): the hub passes such watches through (see the multiplexer).
                return Refused(406, body, answer.content_type, None)
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
                return Refused(507, CACHE_FULL, "application/json", None)
            list_rv = list_rv or page_rv
            if not token:
                return Listed(items, list_rv)

    async def watch(self, action: OpenWatch) -> Step:
        """One upstream watch, read to its end; returns the machine's step after it."""
        path = self._path(
            watch="true",
            allowWatchBookmarks="true",
            resourceVersion=action.resource_version,
            timeoutSeconds=str(action.timeout_seconds),
        )
        try:
            answer = await self._open(path, "watch")
        except ProxyError as error:
            return self._machine.handle(self._broken(error))
        try:
            if answer.status != 200:
                outcome: Outcome
                try:
                    body = await answer.body()
                except ProxyError as error:
                    outcome = self._broken(error)
                else:
                    if answer.status == 410:
                        outcome = Expired(self.representation.error_event_from_body(body))
                    else:
                        outcome = Refused(
                            answer.status, body, answer.content_type, answer.retry_after
                        )
                return self._machine.handle(outcome)
            step = self._machine.handle(Opened())
            self._took(step)
            assert isinstance(step.action, ReadOn)
            return await self._read(answer, step.action.deadline)
        finally:
            answer.close()

    async def _read(self, answer: UpstreamAnswer, deadline: float) -> Step:
        loop = asyncio.get_running_loop()
        lines = answer.frames() if self.representation.framed else answer.lines()
        outcome: Outcome
        try:
            # The silence timer: rescheduled by every event and bookmark (issue 10, item 4).
            # A half-open connection or a hung apiserver reads nothing, forever, otherwise.
            async with asyncio.timeout_at(loop.time() + deadline - self.clock()) as silence:
                async for line in lines:
                    if not line.strip():
                        continue
                    step = self._machine.handle(self._parse(line))
                    if not isinstance(step.action, ReadOn):
                        return step
                    self._took(step)
                    silence.reschedule(loop.time() + step.action.deadline - self.clock())
            outcome = Ended()
        except TimeoutError:
            outcome = Silent()
        except ProxyError as error:
            outcome = self._broken(error)
        finally:
            await lines.aclose()
        return self._machine.handle(outcome)

    def _parse(self, line: bytes) -> Outcome:
        try:
            kind, obj = self.representation.decode_event(line)
            if kind == "BOOKMARK":
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
