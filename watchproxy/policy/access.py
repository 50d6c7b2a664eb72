"""Who may ask what: the Host allowlist and the method/path rules of the API port."""

from __future__ import annotations

import fnmatch
import functools
from collections.abc import Iterable

from watchproxy.config import AccessRule
from watchproxy.errors import Forbidden

WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class HostNotAllowed(Forbidden):
    """A Host header outside the allowlist (a DNS-rebinding attempt, or a misconfigured client)."""


class ReadOnlyRefused(Forbidden):
    """A write refused because ``security.read_only`` is set."""


class PolicyDenied(Forbidden):
    """A request refused by a ``deny`` rule of ``security.rules``."""


class ImpersonationRefused(Forbidden):
    """A request with ``Impersonate-*`` headers while ``security.impersonation`` is refuse."""


# Clients send the same Host on every request: each answer is kept (bounded, whatever a client
# sends).
@functools.lru_cache(maxsize=256)
def host_name(host_header: str | None) -> str | None:
    """The name part of a Host header, lower case (an IPv6 literal keeps its brackets)."""
    if not host_header:
        return None
    host = host_header.strip().lower()
    if host.startswith("["):
        end = host.find("]")
        return host[: end + 1] if end > 0 else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


class AccessPolicy:
    """First matching rule wins; no match allows. ``read_only`` refuses every write first."""

    def __init__(
        self,
        rules: Iterable[AccessRule],
        *,
        read_only: bool = False,
        forward_impersonation: bool = False,
    ) -> None:
        self.rules = tuple(rules)
        self.read_only = read_only
        self.forward_impersonation = forward_impersonation

    def check_impersonation(self, header_names: Iterable[str]) -> None:
        """Refuse a request that asks to act as someone else, unless that is configured.

        Dropping the headers instead would run the request as the proxy's (or the client's
        own) identity: more than a client that asked to act as a less privileged user meant.
        """
        if self.forward_impersonation:
            return
        asked = sorted({n for n in header_names if n.lower().startswith("impersonate-")})
        if asked:
            raise ImpersonationRefused(
                f"watchproxy does not forward impersonation ({', '.join(asked)}): "
                "security.impersonation is refuse"
            )

    def check(self, method: str, path: str) -> None:
        """Raise Forbidden if ``method`` on the (already canonical) ``path`` is not allowed."""
        method = method.upper()
        if self.read_only and method in WRITE_METHODS:
            raise ReadOnlyRefused(f"watchproxy is read-only: {method} {path} is not allowed")
        for rule in self.rules:
            if rule.methods and method not in {m.upper() for m in rule.methods}:
                continue
            if fnmatch.fnmatchcase(path, rule.path) or path == rule.path:
                if rule.action == "deny":
                    raise PolicyDenied(f"watchproxy policy denies {method} {path}")
                return
