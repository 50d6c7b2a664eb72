"""Consistent LISTs from the hub: the I/O around ``hub.freshlist`` (issue 16, part 2).

The apiserver's current revision is read with ``GET <collection>?limit=1`` (the same path
without the query: the revision is the whole store's), through the LIST batcher so that the
requests waiting at the same time share one probe, and each probe is sent after they arrived.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from aiohttp import web

from watchproxy.hub.cachetypes import parse_rv
from watchproxy.hub.freshlist import list_when_current, looks_busy
from watchproxy.hub.multiplexer import Hub
from watchproxy.kube.apipath import ApiPath
from watchproxy.kube.watchquery import WatchQuery
from watchproxy.metrics import Metrics
from watchproxy.server.listbatch import Answer, ListBatcher
from watchproxy.server.passthrough import Forwarder

# A one-item LIST answer: one object (a pod with many managed fields is tens of KB).
PROBE_MAX_BYTES = 4 * 1024 * 1024


class ConsistentLists:
    def __init__(
        self,
        hub: Hub,
        forwarder: Forwarder,
        *,
        wait_seconds: float,
        metrics: Metrics,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.hub = hub
        # Its own batcher: probes are shared even when limits.list_batch_max_bytes is 0.
        self.probes = ListBatcher(forwarder, max_bytes=PROBE_MAX_BYTES)
        self.wait = wait_seconds
        self.metrics = metrics
        self.clock = clock

    async def close(self) -> None:
        await self.probes.close()

    async def serve(
        self, request: web.Request, api_path: ApiPath, query: WatchQuery
    ) -> web.Response | None:
        """The answer from a shared watch; None: the LIST goes to the apiserver."""
        if self.wait <= 0:
            return None
        cover = self.hub.covering_watch(api_path, query, request.headers)
        if cover is None:
            return None
        outcomes = self.metrics.consistent_lists
        if not looks_busy(cover.shared, self.wait, self.clock()):
            outcomes.labels("quiet").inc()
            return None
        current = await self._current_rv(request)
        if current is None:
            outcomes.labels("probe-failed").inc()
            return None
        served = await list_when_current(cover, current, self.wait, self.clock)
        if served is None:
            outcomes.labels("behind").inc()
            return None
        outcomes.labels("hub").inc()
        body, content_type = served
        answer = web.Response(body=body)
        answer.headers["Content-Type"] = content_type
        return answer

    async def _current_rv(self, request: web.Request) -> int | None:
        headers, auth = self.probes.forwarder.outgoing(request)
        headers["Accept"] = "application/json"  # parsed here, whatever the client reads
        headers.popall("Accept-Encoding", None)
        path = request.raw_path.partition("?")[0] + "?limit=1"
        answer = await self.probes.shared_answer(
            path, headers, auth, counted_in=self.metrics.freshness_probes
        )
        if not isinstance(answer, Answer) or answer.status != 200:
            return None
        try:
            return parse_rv(json.loads(answer.body)["metadata"]["resourceVersion"])
        except (ValueError, KeyError, TypeError):
            return None
