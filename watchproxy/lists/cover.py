"""Which synced shared watch can answer a LIST, and the body it answers with.

A LIST is covered by the shared watch of exactly its key, or, for a namespaced LIST, by the
cluster-wide shared watch of the same resource, selectors, representation and identity: its
state holds every object of that namespace (an informer watching all pods answers
``kubectl get pods -n x``), and the namespace's objects are picked out by their keys. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from watchproxy.hub.cachetypes import NotSynced
from watchproxy.hub.watchkey import Unservable
from watchproxy.kube.apipath import ApiPath
from watchproxy.kube.headers import Headers
from watchproxy.kube.watchquery import WatchQuery, is_go_duration
from watchproxy.lists.pages import Page, Snapshot
from watchproxy.lists.ports import ListedWatch, SharedWatches


@dataclass(frozen=True, slots=True)
class Cover:
    shared: ListedWatch
    namespace: str | None  # set when the watch is cluster-wide: only this namespace's objects

    def count(self) -> int:
        cache = self.shared.cache
        return len(cache) if self.namespace is None else cache.state.count_in(self.namespace)

    def list_body(self) -> bytes:
        """The LIST answer at the state's resourceVersion."""
        return self.shared.cache.list_response(self.namespace)

    def list_pieces(self) -> Iterator[bytes]:
        """:meth:`list_body` in pieces, each encoded when it is asked for, from the objects
        the state holds now."""
        return self.shared.cache.list_pieces(self.namespace)

    def snapshot(self) -> Snapshot:
        """The covered objects now, in key order, to page through (see ``pages``)."""
        cache = self.shared.cache
        rv, rv_str = cache.resource_version, cache.resource_version_str
        if rv is None or rv_str is None:
            raise NotSynced("snapshot() before the first LIST")
        keys, kept = cache.state.sorted_kept(self.namespace)
        return Snapshot(rv, rv_str, keys, kept)

    def page_body(self, snapshot: Snapshot, page: Page) -> bytes:
        state = self.shared.cache.state
        if page.token is None:  # the last page: a LIST like any other
            return state.encode_list(page.kept, snapshot.rv_str)
        return state.encode_page(page.kept, snapshot.rv_str, page.token, page.remaining)

    def page_pieces(self, snapshot: Snapshot, page: Page) -> Iterator[bytes]:
        """:meth:`page_body` in pieces."""
        meta = None if page.token is None else (page.token, page.remaining)
        return self.shared.cache.state.page_pieces(page.kept, snapshot.rv_str, meta)


def find_cover(
    hub: SharedWatches, api_path: ApiPath, query: WatchQuery, headers: Headers
) -> Cover | None:
    """The cover of a LIST of ``api_path`` among the hub's running watches."""
    if query.timeout is not None and not is_go_duration(query.timeout):
        return None  # the apiserver's 400 for a request deadline it cannot parse
    watches = hub.watches
    if not watches:
        return None  # nothing shared: no key to build (a LIST of a busy controller's)
    candidates: list[tuple[ApiPath, str | None]] = [(api_path, None)]
    if api_path.namespace is not None:
        candidates.append((dataclasses.replace(api_path, namespace=None), api_path.namespace))
    for path, namespace in candidates:
        found = hub.key_of(path, query, headers)
        if isinstance(found, Unservable):
            return None
        shared = watches.get(found[0])
        if shared is not None and not shared.closed and shared.cache.synced:
            return Cover(shared, namespace)
    return None


def cached_cover(
    hub: SharedWatches, api_path: ApiPath, query: WatchQuery, headers: Headers
) -> Cover | None:
    """What answers a LIST with resourceVersion=0 ("any state"): any synced cover. ``limit``
    is ignored, as the apiserver's watch cache ignores it."""
    if query.resource_version != "0" or query.continue_token:
        return None
    return find_cover(hub, api_path, query, headers)


def consistent_cover(
    hub: SharedWatches, api_path: ApiPath, query: WatchQuery, headers: Headers
) -> Cover | None:
    """What can answer a consistent LIST, or a continuation of one. Without selectors in
    pages when it must (``pages``: the apiserver's remainingItemCount then counts exactly
    what is left); with selectors only a LIST its answer fits in one page of."""
    if query.resource_version or query.resource_version_match:
        return None
    cover = find_cover(hub, api_path, query, headers)
    if cover is None:
        return None
    if query.label_selector.matches_everything and query.field_selector.matches_everything:
        return cover
    if query.continue_token or (query.limit and cover.count() > query.limit):
        return None
    return cover
