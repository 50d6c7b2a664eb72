"""Consistent LISTs from the hub: the I/O around ``lists.fresh``.

The apiserver's current revision is read with ``GET <collection>?limit=1`` (the same path
without the query: the revision is the whole store's), through the LIST batcher so that the
requests waiting at the same time share one probe, and each probe is sent after they arrived.
A LIST with more objects than its limit is answered in pages: page 1 so, and its continuations
from the snapshot page 1 was cut from (``lists.pages``).

Every way to the apiserver is decided before the probe is sent, so that a LIST costs one
upstream request (issue 43): quiet, not watching, ``limit=1``, or paused after a recent miss
(``lists.fresh.Misses``). Only a probe that then finds the watch behind costs two, and it pauses
the watch so that the LISTs after it do not.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from watchproxy.errors import ProxyError
from watchproxy.hub.cachetypes import parse_rv
from watchproxy.hub.freshwatch import IN_FLIGHT_SECONDS
from watchproxy.hub.transitions import Phase
from watchproxy.kube.apipath import ApiPath
from watchproxy.kube.headers import Headers
from watchproxy.kube.watchquery import WatchQuery
from watchproxy.lists.answers import Answer, EncodedAnswer
from watchproxy.lists.batch import BatchAnswer, ListBatcher, Outgoing
from watchproxy.lists.cached import hub_answer
from watchproxy.lists.cover import Cover, consistent_cover
from watchproxy.lists.fresh import Misses, looks_busy, wait_current
from watchproxy.lists.pages import Snapshots, decode_continue, page_of
from watchproxy.lists.ports import ListedWatch, ListRequest, SharedWatches
from watchproxy.lists.sharedaccess import SharedAccess
from watchproxy.metrics import Metrics


def _key_prefix(api_path: ApiPath) -> str:
    """What the keys of a LIST of ``api_path`` start with, and its continue tokens leave out:
    a namespaced LIST's keys are relative to its namespace, as etcd's are to the LIST's prefix."""
    return "" if api_path.namespace is None else api_path.namespace + "/"


# A one-item LIST answer: one object (a pod with many managed fields is tens of KB).
PROBE_MAX_BYTES = 4 * 1024 * 1024


class ConsistentLists:
    """Answers a LIST without a resourceVersion from a shared watch only once its state is at
    least the apiserver's current revision, read after the LIST arrived; otherwise returns None
    and the LIST goes upstream. Owns its probes' batcher: :meth:`close` ends them."""

    def __init__(
        self,
        hub: SharedWatches,
        forwarder: Outgoing,
        *,
        wait_seconds: float,
        metrics: Metrics,
        access: SharedAccess | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hub = hub
        # Forward identity mode: who may read a shared watch's state (lists.sharedaccess).
        self.access = access
        # Its own batcher: probes are shared even when limits.list_batch_max_bytes is 0. Only
        # its shared_answer is used, which counts each probe in freshness_probes.
        self.probes = ListBatcher(
            forwarder, max_bytes=PROBE_MAX_BYTES, metrics=metrics, stream=False
        )
        self.wait = wait_seconds
        self.snapshots = Snapshots(clock)  # page 1 of each paged answer, for its continuations
        # Watches that left a LIST behind lately: not tried for a while.
        self.misses: Misses[ListedWatch] = Misses(clock)
        self.metrics = metrics
        self.clock = clock

    async def close(self) -> None:
        await self.probes.close()

    async def serve(
        self, request: ListRequest, api_path: ApiPath, query: WatchQuery
    ) -> Answer | EncodedAnswer | None:
        """The answer from a shared watch; None: the LIST goes to the apiserver."""
        if self.wait <= 0:
            return None
        if query.continue_token:
            if consistent_cover(self.hub, api_path, query, request.headers) is None:
                return None
            admitted = await self._admitted(request, api_path, query)
            if admitted is not True:
                return admitted if isinstance(admitted, Answer) else None
            return self._next_page(api_path, query, request.headers)
        cover = consistent_cover(self.hub, api_path, query, request.headers)
        if cover is None:
            return None
        outcomes = self.metrics.consistent_lists
        # Every way to the apiserver from here is decided before anything is sent (the probe,
        # and in forward identity mode the access review), so that a LIST costs one upstream
        # request, except after a probe that finds the watch behind (see lists.fresh.Misses
        # for why that one stays, and how it is kept from repeating).
        if query.limit == 1:
            # The LIST is the probe's size: sent as it is, it costs what the probe would, and
            # its answer is the client's whatever the watch's state.
            outcomes.labels("one-item").inc()
            return None
        if not looks_busy(cover.shared, self.wait, self.clock()):
            outcomes.labels("quiet").inc()
            return None
        if cover.shared.state is not Phase.WATCHING:
            # Backing off, relisting, waiting for the apiserver: its state would not catch up
            # in time, and the probe would be a second request for nothing.
            outcomes.labels("not-watching").inc()
            return None
        if self.misses.paused(cover.shared):
            outcomes.labels("lagging").inc()  # it left a LIST behind lately: not tried
            return None
        admitted = await self._admitted(request, api_path, query)
        if admitted is not True:
            return admitted if isinstance(admitted, Answer) else None
        # More objects than the limit: page 1 of several (a limit below 1 is no limit).
        paged = query.limit is not None and 0 < query.limit < cover.count()
        current = await self._current_rv(request)
        if not isinstance(current, int):
            outcomes.labels("probe-failed").inc()
            if isinstance(current, ProxyError):
                # No answer (unreachable, throttled): the client's LIST would have met the same,
                # and is not sent a second time behind its back.
                raise current.with_traceback(None)
            if current is None:
                # An answer with no revision in it (not the JSON list asked for, or too big):
                # the LIST goes upstream, and the watch is not probed again for a while, as
                # after a miss: the next probe would most likely read the same.
                self._missed(cover, None)
            return current

        # Only an event's flight: past it the state reaches R with the collection's next write,
        # and a LIST held for that was late by up to the wait (402 ms at the median against
        # 1.8 ms direct on a collection written every 500 ms, docs/lists.md).
        if not await wait_current(cover, current, min(self.wait, IN_FLIGHT_SECONDS), self.clock):
            outcomes.labels("behind").inc()
            self._missed(cover, current)
            return None
        self.misses.answered(cover.shared)
        outcomes.labels("hub").inc()
        if not paged:
            return hub_answer(cover, cover.list_pieces())
        snapshot = cover.snapshot()
        self.snapshots.put(cover.shared, cover.namespace, snapshot)
        page = page_of(snapshot, None, query.limit or 0, _key_prefix(api_path))
        return hub_answer(cover, cover.page_pieces(snapshot, page))

    def _missed(self, cover: Cover, revision: int | None) -> None:
        self.misses.missed(cover.shared, revision)
        if len(self.misses) > len(self.hub.watches):
            self.misses.forget(lambda watch: not watch.closed)

    async def _admitted(
        self, request: ListRequest, api_path: ApiPath, query: WatchQuery
    ) -> Answer | bool:
        """True when the client may be served from shared state; else False (the LIST goes
        upstream) or the apiserver's 403 to answer with."""
        if self.access is None:
            return True
        return await self.access.admit(request.headers, "list", api_path, query)

    def _next_page(
        self, api_path: ApiPath, query: WatchQuery, headers: Headers
    ) -> Answer | EncodedAnswer | None:
        """A continuation of a page 1 the hub answered, from its snapshot: no probe, the
        snapshot is the collection at the token's revision. Anything else goes upstream."""
        cover = consistent_cover(self.hub, api_path, query, headers)
        if cover is None:
            return None  # first: a busy controller pages with no shared watch to read from
        token = decode_continue(query.continue_token or "")
        if token is None:
            return None
        rv, start = token
        snapshot = self.snapshots.get(cover.shared, cover.namespace, rv)
        if snapshot is None:
            self.metrics.consistent_lists.labels("page-gone").inc()
            return None
        self.metrics.consistent_lists.labels("page").inc()
        page = page_of(snapshot, start, query.limit or 0, _key_prefix(api_path))
        return hub_answer(cover, cover.page_pieces(snapshot, page))

    async def _current_rv(self, request: ListRequest) -> int | Answer | ProxyError | None:
        """The apiserver's current revision; else the probe's error answer, which is the
        client's answer too, or None (the LIST goes upstream)."""
        headers, auth = self.probes.forwarder.outgoing_headers(request.headers)
        headers["Accept"] = "application/json"  # parsed here, whatever the client reads
        headers.popall("Accept-Encoding", None)
        answer = await self.probes.shared_answer(
            probe_target(request.raw_path), headers, auth, counted_in=self.metrics.freshness_probes
        )
        if isinstance(answer, ProxyError) or answer is None:
            return answer
        if not isinstance(answer, BatchAnswer):
            return None
        if answer.status != 200:
            # The client's own path, selectors and credential: its LIST would get this verdict.
            return answer.whole()
        try:
            return parse_rv(json.loads(answer.body)["metadata"]["resourceVersion"])
        except (ValueError, KeyError, TypeError):
            return None


_PROBE_KEEPS = ("labelSelector=", "fieldSelector=")


def probe_target(raw_path: str) -> str:
    """The one-item LIST that reads the current revision for a LIST of ``raw_path``: the same
    path and selectors (so that an error answer, an authorization that depends on the
    selectors, is the one the LIST would get), as they came, and ``limit=1``."""
    path, _, query = raw_path.partition("?")
    kept = [part for part in query.split("&") if part.startswith(_PROBE_KEEPS)]
    return path + "?" + "&".join([*kept, "limit=1"])
