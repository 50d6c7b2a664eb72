"""The query of a list or watch request, decoded and validated the way the apiserver does it.

Decoding follows apimachinery's query conversion (the first value of a repeated parameter wins;
booleans are false only for ``0`` and ``false``), then ``ValidateListOptions`` with the WatchList
feature enabled. Parameters the proxy does not understand are reported in
:attr:`WatchQuery.unknown` so that the hub passes such requests through instead of serving them
wrongly.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

from watchproxy.errors import BadRequest
from watchproxy.kube.fieldselectors import FieldSelector, parse_field_selector
from watchproxy.kube.selectors import LabelSelector, parse_label_selector

ResourceVersionMatch = Literal["", "NotOlderThan", "Exact"]
_Selector = TypeVar("_Selector", LabelSelector, FieldSelector)
IncludeObject = Literal["None", "Object", "Metadata"]

# A watch that ends sooner than this with nothing in it, unasked, ended at once: its client
# cannot tell it from an error and re-watches immediately (client-go counts it as one). The
# server counts such client watches against the errored-watch budget; the hub backs off from
# such upstream watches instead of re-opening them in a loop.
QUICK_END_SECONDS = 1.0

_UINT64_MAX = 2**64 - 1
_INT64_MAX = 2**63 - 1
_DECIMAL_RE = re.compile(r"[0-9]+", re.ASCII)
_INT64_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)
_GO_TRUE = frozenset({"1", "t", "T", "TRUE", "true", "True"})
_GO_FALSE = frozenset({"0", "f", "F", "FALSE", "false", "False"})

KNOWN_PARAMETERS: frozenset[str] = frozenset(
    {
        "watch",
        "resourceVersion",
        "resourceVersionMatch",
        "timeoutSeconds",
        "allowWatchBookmarks",
        "sendInitialEvents",
        "labelSelector",
        "fieldSelector",
        "limit",
        "continue",
        "includeObject",
        "pretty",
        # The apiserver's request deadline; it does not apply to watches (long-running).
        "timeout",
    }
)


# Go's time.ParseDuration: "0", or a sequence of decimal numbers each with a unit.
_GO_DURATION = re.compile(r"[-+]?(0|((\d+\.?\d*|\.\d+)(ns|us|\u00b5s|\u03bcs|ms|s|m|h))+)")


def is_go_duration(value: str) -> bool:
    """Whether the apiserver accepts ``value`` as a request ``timeout`` (a Go duration)."""
    return _GO_DURATION.fullmatch(value) is not None


class InvalidListOptions(BadRequest):
    """Options that decode but break the apiserver's ListOptions rules: its ``422 Invalid``.

    A :class:`~watchproxy.errors.BadRequest` subclass, so callers catching BadRequest still do;
    the Status it renders is the apiserver's (code 422, reason Invalid, with causes).
    """

    code = 422
    reason = "Invalid"

    def __init__(self, causes: list[tuple[str, str, str]]) -> None:
        """``causes`` are (Kubernetes cause type, field, message) triples."""
        texts = [f"{field_name}: {message}" for _, field_name, message in causes]
        shown = texts[0] if len(texts) == 1 else "[" + ", ".join(texts) + "]"
        super().__init__(f'ListOptions.meta.k8s.io "" is invalid: {shown}')
        self.causes = causes

    def status(self) -> dict[str, Any]:
        """The apiserver's ``422 Invalid`` Status for ListOptions, with one cause per rule."""
        status = super().status()
        status["details"] = {
            "group": "meta.k8s.io",
            "kind": "ListOptions",
            "causes": [
                {"reason": cause_type, "message": text, "field": field_name}
                for cause_type, field_name, text in self.causes
            ],
        }
        return status


@dataclass(frozen=True, slots=True)
class WatchQuery:
    """A validated list/watch query.

    Guarantees: every field holds what the apiserver would decode from the same query;
    ``resource_version`` is the raw string (None if absent) and, when non-empty, a decimal
    unsigned 64-bit integer; the selectors are parsed (compare or key them by ``canonical()``);
    ``unknown`` lists, in order of first appearance, every parameter the proxy does not know or
    cannot interpret (a request with any should be passed through unchanged).

    ``timeout_seconds`` 0 means "server's choice", exactly like absent, for the apiserver.
    ``pretty`` is None when absent or empty: the apiserver then decides from the User-Agent.
    """

    watch: bool = False
    resource_version: str | None = None
    resource_version_match: ResourceVersionMatch = ""
    timeout_seconds: int | None = None
    allow_watch_bookmarks: bool = False
    send_initial_events: bool | None = None
    label_selector: LabelSelector = field(default_factory=LabelSelector)
    field_selector: FieldSelector = field(default_factory=FieldSelector)
    limit: int | None = None
    continue_token: str | None = None
    include_object: IncludeObject | None = None
    pretty: bool | None = None
    timeout: str | None = None
    unknown: tuple[str, ...] = ()

    def with_continue_token(self, token: str) -> WatchQuery:
        """This query with another continue token (valid wherever this one's was, since the
        rules read a token only for being there): another page of the same LIST."""
        # Spelled out, in field order, not dataclasses.replace (twice the cost, once per page:
        # bench/README.md, "Figures behind the code"): tests/unit/test_watchquery.py holds it
        # to replace()'s answer with every field set.
        return WatchQuery(
            self.watch,
            self.resource_version,
            self.resource_version_match,
            self.timeout_seconds,
            self.allow_watch_bookmarks,
            self.send_initial_events,
            self.label_selector,
            self.field_selector,
            self.limit,
            token,
            self.include_object,
            self.pretty,
            self.timeout,
            self.unknown,
        )

    @property
    def watch_list(self) -> bool:
        """The apiserver (1.34 on, WatchList enabled) answers this watch with the initial
        events and then a bookmark annotated ``k8s.io/initial-events-end``: when asked to
        (``sendInitialEvents=true``), and by default for a watch from "now" (resourceVersion
        absent, "" or "0") that allows bookmarks."""
        if self.send_initial_events is not None:
            return self.send_initial_events
        from_now = self.resource_version in (None, "", "0")
        return self.watch and from_now and self.allow_watch_bookmarks

    @property
    def resource_version_number(self) -> int | None:
        """The resourceVersion as a number, None if absent or empty."""
        if not self.resource_version:
            return None
        return int(self.resource_version)

    @property
    def label_selector_canonical(self) -> str:
        """The label selector's canonical string ("" for none)."""
        return self.label_selector.canonical()

    @property
    def field_selector_canonical(self) -> str:
        """The field selector's canonical string ("" for none)."""
        return self.field_selector.canonical()


def parse_watch_query(
    query: Mapping[str, str], *, require_bookmarks_for_initial_events: bool = False
) -> WatchQuery:
    """Decode and validate a list or watch query (a dict, or aiohttp's ``request.query``).

    For a multi-valued mapping (multidict) ``query[name]`` is the first value, which is what
    the apiserver uses. Raises :class:`~watchproxy.errors.BadRequest` for values that do not
    decode, and :class:`InvalidListOptions` (a BadRequest with code 422) for combinations the
    apiserver forbids. The apiserver accepts ``sendInitialEvents`` without
    ``allowWatchBookmarks=true``; ``require_bookmarks_for_initial_events`` refuses that.
    """
    unknown = tuple(dict.fromkeys(name for name in query if name not in KNOWN_PARAMETERS))
    extra_unknown: list[str] = []

    include_object = _first(query, "includeObject")
    include: IncludeObject | None = None
    if include_object in ("None", "Object", "Metadata"):
        include = include_object  # type: ignore[assignment]
    elif include_object:
        # The apiserver checks this only for Table output: let it answer.
        extra_unknown.append("includeObject")

    match = _first(query, "resourceVersionMatch") or ""
    result = WatchQuery(
        watch=_apiserver_bool(_first(query, "watch"), default=False),
        resource_version=_resource_version(_first(query, "resourceVersion")),
        resource_version_match=match,  # type: ignore[arg-type]  # checked in _validate
        timeout_seconds=_timeout_seconds(_first(query, "timeoutSeconds")),
        allow_watch_bookmarks=_apiserver_bool(_first(query, "allowWatchBookmarks"), default=False),
        send_initial_events=_optional_apiserver_bool(_first(query, "sendInitialEvents")),
        label_selector=_selector("labelSelector", parse_label_selector, query),
        field_selector=_selector("fieldSelector", parse_field_selector, query),
        limit=_int64("limit", _first(query, "limit")),
        continue_token=_first(query, "continue"),
        include_object=include,
        pretty=_go_parse_bool(_first(query, "pretty")),
        timeout=_first(query, "timeout"),
        unknown=unknown + tuple(extra_unknown),
    )
    _validate(result, require_bookmarks_for_initial_events)
    return result


def _first(query: Mapping[str, str], name: str) -> str | None:
    return query.get(name)  # a multidict gives the first value, as the apiserver takes


def _selector(name: str, parse: Callable[[str], _Selector], query: Mapping[str, str]) -> _Selector:
    try:
        return parse(_first(query, name) or "")
    except BadRequest as error:
        # The apiserver's text does not say which selector it is; the client should see it.
        raise BadRequest(f"invalid {name}: {error.message}") from None


def _apiserver_bool(value: str | None, *, default: bool) -> bool:
    """apimachinery ``Convert_Slice_string_To_bool``: only "0" and "false" (any case) are
    false; any other value, including "", is true."""
    if value is None:
        return default
    return not (value == "0" or value.lower() == "false")


def _optional_apiserver_bool(value: str | None) -> bool | None:
    return None if value is None else _apiserver_bool(value, default=False)


def _go_parse_bool(value: str | None) -> bool | None:
    """Go ``strconv.ParseBool`` with errors read as false, as the apiserver reads ``pretty``."""
    if not value:
        return None
    return value in _GO_TRUE


def _resource_version(value: str | None) -> str | None:
    if value is None or value == "":
        return value
    if not _DECIMAL_RE.fullmatch(value) or int(value) > _UINT64_MAX:
        raise BadRequest(
            f'invalid resourceVersion {_shown(value)}: must be empty, "0", '
            "or a decimal unsigned 64-bit integer"
        )
    return value


def _timeout_seconds(value: str | None) -> int | None:
    # A negative value is valid for the apiserver: a list ignores it, a watch ends at once.
    return _int64("timeoutSeconds", value)


def _int64(name: str, value: str | None) -> int | None:
    """Go ``strconv.ParseInt(value, 10, 64)``, as apimachinery decodes integer parameters."""
    if value is None:
        return None
    if not _INT64_RE.fullmatch(value) or not -_INT64_MAX - 1 <= int(value) <= _INT64_MAX:
        raise BadRequest(f"invalid {name} {_shown(value)}: must be a 64-bit integer")
    return int(value)


def _shown(value: str | None) -> str:
    text = value or ""
    return repr(text if len(text) <= 100 else text[:100] + "...")


def _validate(q: WatchQuery, require_bookmarks_for_initial_events: bool) -> None:
    """apiserver ``ValidateListOptions`` (WatchList enabled), same checks in the same order."""
    causes: list[tuple[str, str, str]] = []
    match = q.resource_version_match
    send_initial_events = q.send_initial_events
    from_now = q.resource_version in (None, "", "0")
    if q.watch and send_initial_events is None and not match and from_now:
        # apimachinery SetListOptionsDefaults (WatchList on): a watch from "now" is validated
        # as sendInitialEvents=true + NotOlderThan, so "?watch=1&continue=x" is a 422.
        send_initial_events, match = True, "NotOlderThan"

    def forbidden(field_name: str, message: str) -> None:
        causes.append(("FieldValueForbidden", field_name, f"Forbidden: {message}"))

    def not_supported(supported: tuple[str, ...]) -> None:
        listed = ", ".join(f'"{value}"' for value in supported)
        causes.append(
            (
                "FieldValueNotSupported",
                "resourceVersionMatch",
                f'Unsupported value: "{match}": supported values: {listed}',
            )
        )

    if q.watch:
        if send_initial_events is not None:
            if match != "NotOlderThan":
                forbidden(
                    "resourceVersionMatch",
                    "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                )
            explicit = q.send_initial_events is not None
            if explicit and require_bookmarks_for_initial_events and not q.allow_watch_bookmarks:
                forbidden(
                    "allowWatchBookmarks",
                    "sendInitialEvents requires setting allowWatchBookmarks to true",
                )
        if match:
            if send_initial_events is None:
                forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden for watch unless sendInitialEvents "
                    "is provided",
                )
            if match != "NotOlderThan":
                not_supported(("NotOlderThan",))
            if q.continue_token:
                forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided",
                )
    else:
        if match:
            if not q.resource_version:
                forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                )
            if q.continue_token:
                forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided",
                )
            if match not in ("Exact", "NotOlderThan"):
                not_supported(("Exact", "NotOlderThan", ""))
            if match == "Exact" and q.resource_version == "0":
                forbidden(
                    "resourceVersionMatch",
                    'resourceVersionMatch "exact" is forbidden for resourceVersion "0"',
                )
        if q.send_initial_events is not None:
            forbidden("sendInitialEvents", "sendInitialEvents is forbidden for list")
    if causes:
        raise InvalidListOptions(causes)
