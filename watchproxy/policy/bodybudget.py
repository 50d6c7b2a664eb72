"""How many bytes of client request bodies the proxy holds at once.

A request body is read whole before its request goes upstream, so that a client that sends its
body slowly holds a connection and some memory, never an upstream concurrency slot: a body
streamed upstream as it arrived held one for as long as the client took, and 64 bodies
trickling at the minimum rate filled the adaptive limit's window, after which every other
client got 429s. Reading bodies whole needs a bound on what all of them hold together: that is
this budget. A request whose body does not fit is answered 503 with Retry-After before its body
is read (as the apiserver answers when it is too busy to take a request), and the client sends
it again.
"""

from __future__ import annotations


class BodyBudget:
    """Bytes taken and given back by the bodies being read; never more than ``capacity``
    taken at once. ``capacity`` 0 means no bound."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.held = 0

    def take(self, size: int) -> bool:
        """Take ``size`` bytes if they fit (True), else take nothing (False)."""
        if self.capacity and self.held + size > self.capacity:
            return False
        self.held += size
        return True

    def take_at_most(self, size: int) -> int:
        """Take up to ``size`` bytes, as many as fit; how many were taken."""
        room = size if not self.capacity else max(0, min(size, self.capacity - self.held))
        self.held += room
        return room

    def give(self, size: int) -> None:
        """Give back ``size`` bytes that :meth:`take` took."""
        self.held = max(0, self.held - size)
