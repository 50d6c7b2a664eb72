"""A request's work ends when its client's connection does, whatever the work is waiting on.

Why this is needed: a pass-through stream would find out that its client left only when it
next writes to the client, and it writes only when an upstream byte arrives: a quiet watch, a
``logs -f`` of a silent container or a LIST the apiserver is still assembling would keep its
upstream request open until the collection changed or the request's own timeout (up to an
hour) ended it.

The signal: the connection resolves one future when the loop reports the connection lost
(``protocol.HttpProtocol.connection_lost``); the API handler runs each
request inside :class:`EndsWithClient`, which cancels the handler's own task when that future
resolves and turns the cancellation back into a normal return at the end of the block. Whatever
the handler awaits (an upstream read, a shared watch's fan-out, a rate-limiter slot, an upgrade
relay) is cancelled where it waits, and the owners of upstream connections close them in their
``finally`` blocks, so the apiserver sees the request end at once. No upstream byte is needed.

A bare cancellation would escape the handler: the request would go uncounted in the metrics and
a client that left would be taken for a watch that failed. Here the handler finishes its
bookkeeping and returns.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Any

# What the metrics record for a client that left before any response began (nginx's "client
# closed request"; the client saw no status at all).
CLIENT_CLOSED_REQUEST = 499


def already_lost() -> asyncio.Future[None]:
    """The signal of a connection that was lost before its request was looked at."""
    lost = asyncio.get_running_loop().create_future()
    lost.set_result(None)
    return lost


class EndsWithClient:
    """``with EndsWithClient(lost):`` runs the block until it ends or ``lost`` resolves.

    Guarantees: when ``lost`` resolves while the block is waiting, the block is cancelled where
    it waits and the ``with`` statement then completes normally with :attr:`client_left` True;
    a cancellation from anyone else (shutdown) still propagates, and so does any exception the
    block raises other than the cancellation this scope caused. ``lost=None``: no signal, the
    block just runs. ``task``: the task the block runs in, when the caller holds it (else it is
    looked up: on 3.11 ``asyncio.current_task`` is a Python function, once per request).
    """

    __slots__ = ("_active", "_lost", "_task", "client_left")

    def __init__(
        self, lost: asyncio.Future[None] | None, task: asyncio.Task[Any] | None = None
    ) -> None:
        self._lost = lost
        self._task: asyncio.Task[Any] | None = task
        self._active = False
        self.client_left = False

    def __enter__(self) -> EndsWithClient:
        if self._task is None:
            self._task = asyncio.current_task()
        if self._task is None:  # pragma: no cover - handlers always run in a task
            raise RuntimeError("EndsWithClient must be used inside a task")
        self._active = True
        if self._lost is not None:
            # On a resolved future the callback is scheduled at once: the block is then
            # cancelled at its first wait.
            self._lost.add_done_callback(self._fire)
        return self

    def _fire(self, _lost: asyncio.Future[None]) -> None:
        # A future's callbacks run from the loop, never while this task runs: if the block is
        # still active, the task is suspended inside it and the cancellation lands there.
        if self._active and not self.client_left and self._task is not None:
            self.client_left = True
            self._task.cancel()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool:
        self._active = False
        if self._lost is not None:
            self._lost.remove_done_callback(self._fire)
        if not self.client_left or self._task is None:
            return False
        # Ours to withdraw; a count left above zero means someone else cancels this task too.
        others = self._task.uncancel()
        return exc_type is asyncio.CancelledError and others == 0
