"""Whether the apiserver behind an API group version serves watch-lists, asked once in a while.

The hub serves ``sendInitialEvents`` from a shared watch's state, whatever the apiserver behind
it would do. An apiserver with the ``WatchList`` gate off (1.33's default; 1.34 on turn it on)
refuses such a watch with a 422, and so does an aggregated apiserver built without it; client-go
then falls back to LIST + WATCH. The hub must answer as that apiserver would: a watch-list it
would refuse is passed through, and the client gets the apiserver's own 422.

The question is asked with one request per group version that the apiserver answers at once
and without storage work either way: a watch-list whose field selector names no field. The
apiserver checks the list options before the selector, so an apiserver that serves watch-lists
answers 400 (the field is not supported) and one that refuses them answers 422. Anything that
answers 200 ignored the selector, and, likely, ``sendInitialEvents`` too: treated as refusing.
Any other answer, or none, says nothing: the hub serves the watch, and asks again next time.
The answer is kept for ``REASK_SECONDS`` (an apiserver can be upgraded behind the proxy).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from watchproxy.errors import ProxyError
from watchproxy.hub.ports import WatchSource
from watchproxy.hub.watchkey import WatchKey

log = logging.getLogger("watchproxy.hub")

REASK_SECONDS = 600.0
PROBE_QUERY = (
    "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true"
    "&timeoutSeconds=1&fieldSelector=watchproxy.invalid%3Dx"
)


class WatchListSupport:
    """Per group version (``v1``, ``apps/v1``): does its apiserver serve watch-lists?"""

    def __init__(self, source: WatchSource, clock: Callable[[], float]) -> None:
        self.source = source
        self.clock = clock
        self._known: dict[str, tuple[bool, float]] = {}  # group version -> (served, until)

    def known(self, key: WatchKey) -> bool | None:
        """What is known of ``key``'s apiserver without asking (None: nothing yet)."""
        known = self._known.get(key.resource_label.rpartition("/")[0])
        return known[0] if known is not None and known[1] > self.clock() else None

    def refused(self, key: WatchKey) -> None:
        """``key``'s apiserver refused a watch-list the hub sent (a 422)."""
        group_version = key.resource_label.rpartition("/")[0]
        log.info("the apiserver refuses watch-lists of %s", group_version)
        self._known[group_version] = (False, self.clock() + REASK_SECONDS)

    async def served(self, key: WatchKey, forwarded_auth: str | None) -> bool:
        """Whether ``key``'s apiserver serves watch-lists (True when it cannot be told)."""
        group_version = key.resource_label.rpartition("/")[0]
        known = self._known.get(group_version)
        if known is not None and known[1] > self.clock():
            return known[0]
        try:
            answer = await self.source.open(
                f"{key.collection_path}?{PROBE_QUERY}",
                accept="application/json",
                verb="list",
                forwarded_auth=forwarded_auth,
            )
        except ProxyError:
            return True
        status = answer.status
        answer.close()  # the status is the answer; a 200's stream is not read
        if status not in (400, 422, 200):
            return True
        served = status == 400
        if not served:
            log.info("the apiserver refuses watch-lists of %s: passed through", group_version)
        self._known[group_version] = (served, self.clock() + REASK_SECONDS)
        return served
