"""ListOptions as kube-apiserver decodes and validates them (list, watch, deletecollection). Pure.

Decoding is apimachinery's query conversion: the first value of a repeated parameter counts,
booleans are false only for ``0`` and ``false`` (any case), integers are Go ``ParseInt`` and an
undecodable one is a 400 with Go's message. Validation is ``ValidateListOptions`` after
``SetListOptionsDefaults`` with the WatchList feature on: a 422 Invalid with one cause per rule.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from .errors import BadRequest, Invalid

_INT64 = re.compile(r"[+-]?[0-9]+")
_INT64_RANGE = range(-(2**63), 2**63)


@dataclass(frozen=True)
class ListOptions:
    watch: bool = False
    allow_watch_bookmarks: bool = False
    send_initial_events: bool | None = None
    resource_version: str = ""
    resource_version_match: str = ""
    timeout_seconds: int | None = None
    limit: int = 0
    continue_token: str = ""
    label_selector: str = ""
    field_selector: str = ""


def _bool(value: str) -> bool:
    return not (value == "0" or value.lower() == "false")


def _int64(value: str) -> int:
    if not _INT64.fullmatch(value):
        raise BadRequest(f'strconv.ParseInt: parsing "{value}": invalid syntax')
    number = int(value)
    if number not in _INT64_RANGE:
        raise BadRequest(f'strconv.ParseInt: parsing "{value}": value out of range')
    return number


def decode_list_options(query: Mapping[str, str], *, force_watch: bool = False) -> ListOptions:
    """Decode and validate; ``force_watch`` for the legacy ``/watch/`` paths."""
    sie = query.get("sendInitialEvents")
    timeout = query.get("timeoutSeconds")
    limit = query.get("limit")
    options = ListOptions(
        watch=force_watch or _bool(query.get("watch", "false")),
        allow_watch_bookmarks=_bool(query.get("allowWatchBookmarks", "false")),
        send_initial_events=None if sie is None else _bool(sie),
        resource_version=query.get("resourceVersion", ""),
        resource_version_match=query.get("resourceVersionMatch", ""),
        timeout_seconds=None if timeout is None else _int64(timeout),
        limit=0 if limit is None else _int64(limit),
        continue_token=query.get("continue", ""),
        label_selector=query.get("labelSelector", ""),
        field_selector=query.get("fieldSelector", ""),
    )
    _validate(options)
    return options


def _validate(o: ListOptions) -> None:
    problems: list[str] = []
    match, sie = o.resource_version_match, o.send_initial_events
    if o.watch and sie is None and not match and o.resource_version in ("", "0"):
        sie, match = True, "NotOlderThan"  # the WatchList defaults
    if o.watch:
        if sie is not None and match != "NotOlderThan":
            problems.append(
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting "
                "resourceVersionMatch to NotOlderThan"
            )
        if match:
            if sie is None:
                problems.append(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for "
                    "watch unless sendInitialEvents is provided"
                )
            if match != "NotOlderThan":
                problems.append(
                    f'resourceVersionMatch: Unsupported value: "{match}": supported values: '
                    '"NotOlderThan"'
                )
            if o.continue_token:
                problems.append(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when "
                    "continue is provided"
                )
    else:
        if match:
            if not o.resource_version:
                problems.append(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless "
                    "resourceVersion is provided"
                )
            if o.continue_token:
                problems.append(
                    "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when "
                    "continue is provided"
                )
            if match not in ("Exact", "NotOlderThan"):
                problems.append(
                    f'resourceVersionMatch: Unsupported value: "{match}": supported values: '
                    '"Exact", "NotOlderThan", ""'
                )
            if match == "Exact" and o.resource_version == "0":
                problems.append(
                    'resourceVersionMatch: Forbidden: resourceVersionMatch "exact" is forbidden '
                    'for resourceVersion "0"'
                )
        if sie is not None:
            problems.append("sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list")
    if problems:
        shown = problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
        raise Invalid(
            f'ListOptions.meta.k8s.io "" is invalid: {shown}',
            group="meta.k8s.io",
            kind="ListOptions",
        )
