"""Which synced shared watch can answer a LIST, and the body it answers with.

A LIST is covered by the shared watch of exactly its key, or, for a namespaced LIST, by the
cluster-wide shared watch of the same resource, selectors, representation and identity: its
state holds every object of that namespace (an informer watching all pods answers
``kubectl get pods -n x``), and the namespace's objects are picked out by their keys. Pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from watchproxy.hub.cachetypes import NotSynced
from watchproxy.hub.listpages import Page, Snapshot
from watchproxy.hub.sharedwatch import SharedWatch
from watchproxy.hub.watchkey import Unservable, WatchKey
from watchproxy.kube.apipath import ApiPath
from watchproxy.kube.representation import Representation

KeyOf = Callable[[ApiPath], tuple[WatchKey, Representation] | Unservable]


@dataclass(frozen=True, slots=True)
class Cover:
    shared: SharedWatch
    namespace: str | None  # set when the watch is cluster-wide: only this namespace's objects

    def count(self) -> int:
        cache = self.shared.cache
        return len(cache) if self.namespace is None else cache.state.count_in(self.namespace)

    def list_body(self) -> bytes:
        """The LIST answer at the state's resourceVersion."""
        return self.shared.cache.list_response(self.namespace)

    def snapshot(self) -> Snapshot:
        """The covered objects now, in key order, to page through (see ``listpages``)."""
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


def find_cover(
    watches: dict[WatchKey, SharedWatch], key_of: KeyOf, api_path: ApiPath
) -> Cover | None:
    """The cover of a LIST of ``api_path`` among ``watches``; ``key_of`` gives a path's key."""
    candidates: list[tuple[ApiPath, str | None]] = [(api_path, None)]
    if api_path.namespace is not None:
        candidates.append((dataclasses.replace(api_path, namespace=None), api_path.namespace))
    for path, namespace in candidates:
        found = key_of(path)
        if isinstance(found, Unservable):
            return None
        shared = watches.get(found[0])
        if shared is not None and not shared.closed and shared.cache.synced:
            return Cover(shared, namespace)
    return None
