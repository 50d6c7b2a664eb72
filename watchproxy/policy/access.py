"""Who may ask what: the Host allowlist, the access rules and read-only mode of the API port."""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
from collections.abc import Iterable
from typing import Protocol

from watchproxy.config import AccessRule
from watchproxy.errors import Forbidden


class RequestInfo(Protocol):
    """What the apiserver resolves a request to, as the rules read it
    (``kube.requestinfo.RequestInfo`` fits; policy and kube are separate layers)."""

    @property
    def verb(self) -> str: ...
    @property
    def verbs(self) -> frozenset[str]: ...
    @property
    def path(self) -> str: ...
    @property
    def resource_path(self) -> str: ...
    @property
    def resource_request(self) -> bool: ...
    @property
    def api_group(self) -> str: ...
    @property
    def namespace(self) -> str: ...
    @property
    def resource(self) -> str: ...
    @property
    def subresource(self) -> str: ...
    @property
    def name(self) -> str: ...
    @property
    def reads_only(self) -> bool: ...


# The verbs read-only mode allows (kube.requestinfo's, and a non-resource HEAD).
_READ_VERBS = frozenset({"get", "list", "watch", "head"})


class HostNotAllowed(Forbidden):
    """A Host header outside the allowlist (a DNS-rebinding attempt, or a misconfigured client)."""


class ReadOnlyRefused(Forbidden):
    """A request that does more than read, refused because ``security.read_only`` is set."""


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
    """Judges a request by what the apiserver will do with it (its
    :class:`~watchproxy.kube.requestinfo.RequestInfo`), never by the bytes of its path.

    The rules are tried in order and the first that matches decides: ``deny`` refuses,
    ``allow`` lets the request through. With ``read_only``, a request that does more than read
    (:attr:`RequestInfo.reads_only`) is refused unless the rule that decided it is an ``allow``
    that names, in ``verbs``, one of the request's verbs other than get, list and watch (``*``
    does not count): a broad allow never lifts ``read_only`` by accident. No rule matching
    allows.
    """

    def __init__(
        self,
        rules: Iterable[AccessRule],
        *,
        read_only: bool = False,
        forward_impersonation: bool = False,
    ) -> None:
        # HTTP methods are compared in upper case, as clients send them.
        self.rules = tuple(
            dataclasses.replace(rule, methods=tuple(m.upper() for m in rule.methods))
            for rule in rules
        )
        self.read_only = read_only
        self.forward_impersonation = forward_impersonation
        # Nothing to judge: requests skip resolving what they are.
        self.active = bool(self.rules) or read_only

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

    def check(self, method: str, info: RequestInfo) -> None:
        """Raise Forbidden if ``method`` with what the apiserver resolves it to (``info``) is
        not allowed."""
        method = method.upper()
        for rule in self.rules:
            if rule_matches(rule, method, info):
                if rule.action == "deny":
                    raise PolicyDenied(f"watchproxy policy denies {_described(info)}")
                if self.read_only and not info.reads_only and not _names_verb(rule, info):
                    break
                return
        if self.read_only and not info.reads_only:
            raise ReadOnlyRefused(f"watchproxy is read-only: {_described(info)} is not allowed")


def rule_matches(rule: AccessRule, method: str, info: RequestInfo) -> bool:
    """Whether every condition ``rule`` names holds for the request (an absent one holds)."""
    if rule.methods and method not in rule.methods:
        return False
    if rule.verbs and "*" not in rule.verbs and info.verbs.isdisjoint(rule.verbs):
        return False
    if rule.path is not None and not (
        _path_matches(info.path, rule.path) or _path_matches(info.resource_path, rule.path)
    ):
        return False
    if not (rule.api_groups or rule.resources or rule.namespaces):
        return True
    if not info.resource_request:
        return False  # group, resource and namespace conditions hold for resource requests
    if rule.api_groups and "*" not in rule.api_groups and info.api_group not in rule.api_groups:
        return False
    if rule.resources and not _resource_matches(rule.resources, info):
        return False
    if rule.namespaces:
        if not info.namespace:
            return False
        return "*" in rule.namespaces or info.namespace in rule.namespaces
    return True


def _path_matches(path: str, pattern: str) -> bool:
    return path == pattern or fnmatch.fnmatchcase(path, pattern)


def _resource_matches(resources: tuple[str, ...], info: RequestInfo) -> bool:
    """RBAC's matching: ``*``, ``resource``, ``resource/subresource`` or ``*/subresource``."""
    combined = f"{info.resource}/{info.subresource}" if info.subresource else info.resource
    for resource in resources:
        if resource == "*" or resource == combined:
            return True
        if info.subresource and resource == "*/" + info.subresource:
            return True
    return False


def _names_verb(rule: AccessRule, info: RequestInfo) -> bool:
    """Whether ``rule`` names a verb of the request that does more than read: a WebSocket exec
    is a "get" too, and a rule allowing "get" must not let it past read-only."""
    return not (info.verbs - _READ_VERBS).isdisjoint(rule.verbs)


def _described(info: RequestInfo) -> str:
    if not info.resource_request:
        return f"{info.verb} {info.path}"
    what = f"{info.resource}/{info.subresource}" if info.subresource else info.resource
    group = f" in API group {info.api_group!r}" if info.api_group else ""
    where = f" in namespace {info.namespace!r}" if info.namespace else ""
    name = f" {info.name!r}" if info.name else ""
    return f"{info.verb} on {what}{name}{group}{where}"
