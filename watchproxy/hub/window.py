"""Which resourceVersions a watch cache can resume from, and which subscribers it must end.

Kept by :class:`~watchproxy.hub.watchcache.WatchCache` (see its module docstring for why each
rule exists): the oldest resumable RV, the relist gaps (RVs a relist made ambiguous), and the
backfill cutoffs (subscribers that started below an RV the apiserver refused to replay).
Pure and small; the cache calls it, nothing else does.

The window starts where the clients need it. Were the oldest resumable RV the first list's own
RV, a client one change older (an informer that had just LISTed, a client resuming after a
restart) would get a 410 the apiserver would not have given. So the first
:meth:`WatchCache.replace` may be given a ``floor`` (the oldest RV a
waiting client asked for): the upstream watch opens from it, and the events it replays up to
the list RV ("backfill") enter the history only. ``resource_version`` (what the state reflects)
and ``stream_resource_version`` (up to where the history is complete: the upstream watch
resumes from it, bookmarks carry it) differ only then. If the apiserver answers 410 for the
backfill, :meth:`WatchCache.abandon_backfill` records a cutoff: subscribers that started below
the list RV read what they had, then get the apiserver's own 410 line and end.
"""

from __future__ import annotations

# Gaps stay after their events are gone: an RV inside one is still ambiguous. Relists are rare
# (each follows an upstream 410), so only the oldest beyond this bound are dropped.
MAX_GAPS = 64


class ResumeWindow:
    """RV bookkeeping of one cache. ``oldest`` is None until the first list."""

    def __init__(self) -> None:
        self.oldest: int | None = None
        self._gaps: list[tuple[int, int, int]] = []  # (seq at the relist, RV before, list RV)
        self._cutoffs: list[tuple[int, int, bytes]] = []  # (seq, below this start RV, line)

    def start(self, rv: int) -> None:
        """A fresh start at ``rv`` (first list, or a reset): nothing older is resumable."""
        self.oldest = rv
        self._gaps = []
        self._cutoffs = []

    def relisted(self, seq: int, before: int, after: int) -> None:
        """A relist from ``before`` to ``after`` whose diff starts at ``seq``."""
        if after > before:
            self._add_gap((seq, before, after))

    def group_broken(self, rv: int) -> None:
        """Eviction took part of a relist group at ``rv``: that one RV is now ambiguous."""
        gap = (-1, rv - 1, rv + 1)
        if not self._gaps or self._gaps[-1] != gap:
            self._add_gap(gap)

    def evicted(self, rv: int) -> None:
        """An event at ``rv`` left the history: RVs below it are no longer resumable."""
        if self.oldest is None or rv > self.oldest:
            self.oldest = rv

    def cut(self, seq: int, below: int, line: bytes) -> None:
        """Subscribers that started below ``below`` end at ``seq``, with ``line`` last."""
        self._cutoffs.append((seq, below, line))
        self.evicted(below)

    def expired(self, rv: int) -> bool:
        return any(before < rv < after for _, before, after in self._gaps)

    def is_list_rv(self, rv: int) -> bool:
        """``rv`` is the list RV of a relist that changed it: a client there has the group."""
        return any(after == rv and at >= 0 for at, _, after in self._gaps)

    def outside(self, rv: int) -> bool:
        return self.oldest is None or rv < self.oldest

    def end_of(self, seq: int, start_rv: int, next_seq: int) -> int | None:
        """How far a subscriber at ``seq`` may read (exclusive); None: it must end now."""
        if start_rv >= 0 and any(
            seq <= at and before < start_rv < after for at, before, after in self._gaps
        ):
            return None
        end = next_seq
        for at, below, _line in self._cutoffs:
            if start_rv < below:
                if seq >= at:
                    return None
                end = min(end, at)
        return end

    def cut_line(self, seq: int, start_rv: int) -> bytes | None:
        for at, below, line in self._cutoffs:
            if start_rv < below and seq >= at:
                return line
        return None

    def _add_gap(self, gap: tuple[int, int, int]) -> None:
        self._gaps.append(gap)
        if len(self._gaps) > MAX_GAPS:
            del self._gaps[: len(self._gaps) - MAX_GAPS]

    def dropped(self, rv: int, relist: bool, oldest_left: int | None) -> None:
        """The history dropped an event at ``rv`` (``oldest_left``: its oldest event now).

        A client at ``rv`` has seen that event and everything else at that RV — except at
        relist events below their list's RV, which are replayed: with part of them gone, a
        client at that RV could not get them all again, so that one RV becomes a (one-RV) gap.
        """
        if relist and oldest_left == rv and not self.is_list_rv(rv):
            self.group_broken(rv)
        self.evicted(rv)
