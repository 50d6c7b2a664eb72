"""LISTs with resourceVersion=0 ("any state"), answered from a synced shared watch.

Like the apiserver's watch cache, this answers without an upstream request, and keeps answering
while the apiserver is unreachable (in forward identity mode, while the client's kept verdict
lasts: see ``lists.sharedaccess``).
"""

from __future__ import annotations

from collections.abc import Iterator

from multidict import CIMultiDict

from watchproxy.kube.apipath import ApiPath
from watchproxy.kube.watchquery import WatchQuery
from watchproxy.lists.answers import Answer, EncodedAnswer, encoded
from watchproxy.lists.cover import Cover, cached_cover
from watchproxy.lists.ports import ListRequest, SharedWatches
from watchproxy.lists.sharedaccess import SharedAccess
from watchproxy.metrics import Metrics


class CachedLists:
    """Answers a LIST with resourceVersion=0 from the state of a synced shared watch that
    covers it, or returns None to let the route's next kind answer. With ``access`` (forward
    identity mode) only to a client the apiserver authorizes for that LIST now."""

    def __init__(
        self, hub: SharedWatches, metrics: Metrics, access: SharedAccess | None = None
    ) -> None:
        self.hub = hub
        self.metrics = metrics
        self.access = access

    async def serve(
        self, request: ListRequest, api_path: ApiPath, query: WatchQuery
    ) -> Answer | EncodedAnswer | None:
        cover = cached_cover(self.hub, api_path, query, request.headers)
        if cover is None:
            return None
        if self.access is not None:
            admitted = await self.access.admit(request.headers, "list", api_path, query)
            if admitted is not True:
                # Passed through, or the apiserver's 403.
                return admitted if isinstance(admitted, Answer) else None
        self.metrics.lists_from_cache.inc()
        return hub_answer(cover, cover.list_pieces())


def hub_answer(cover: Cover, pieces: Iterator[bytes]) -> Answer | EncodedAnswer:
    """A LIST answer from the hub: one piece is answered whole, more are written as they are
    encoded (a large collection's LIST is never one bytes object)."""
    content_type = cover.shared.representation.content_type
    body = encoded(content_type, pieces)
    if isinstance(body, EncodedAnswer):
        return body
    return Answer(200, "OK", CIMultiDict({"Content-Type": content_type}), body)
