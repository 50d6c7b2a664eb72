"""Consistent LISTs answered from a shared watch once it is known to be current.

A LIST without a resourceVersion must reflect every write that finished before it arrived. The
apiserver (KEP-2340) serves it from its watch cache after asking etcd for its current revision
and waiting until the cache has caught up with it. watchproxy does the same one level up: the
caller reads the apiserver's current revision R with a one-item LIST sent after the request
arrived, and the shared watch's state may answer once its resourceVersion is at least R. Events
reach a watch in resourceVersion order, so by then every write to the collection up to R is in
the state.

Unlike etcd, the apiserver cannot be asked for a progress notification: the state reaches R only
with the collection's next event, or its next bookmark (about once a minute). A collection that
changes often catches up within a fraction of a second; a quiet one would keep the client
waiting for nothing, so a watch whose state has not moved for a while is not tried at all, and
the wait is bounded in any case. Either way the LIST then goes to the apiserver.
"""

from __future__ import annotations

from collections.abc import Callable

from watchproxy.hub.freshwatch import caught_up, looks_busy
from watchproxy.lists.cover import Cover

__all__ = ["looks_busy", "wait_current"]


async def wait_current(
    cover: Cover, current_rv: int, wait: float, clock: Callable[[], float]
) -> bool:
    """Whether the state reflects ``current_rv`` within ``wait`` seconds (False if the shared
    watch ends first). True means: answer from it now, before the next await."""
    return await caught_up(cover.shared, current_rv, wait, clock)
