"""Which representation a watch asks for: the apiserver's content negotiation, reproduced.

:func:`representation_for` reads a client's ``Accept`` header (and ``includeObject``) the way the
apiserver does (``k8s.io/apiserver/pkg/endpoints/handlers/negotiation`` with
``munnerz/goautoneg``) and returns ``None`` whenever the proxy could not be sure to answer
byte-for-byte what the apiserver would; such requests are passed through unchanged.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from watchproxy.kube.jsonobjects import META_GROUP, META_VERSIONS
from watchproxy.kube.protobuf import ProtobufRepresentation
from watchproxy.kube.representation import (
    JsonRepresentation,
    PartialMetadataRepresentation,
    Representation,
)
from watchproxy.kube.tables import TableRepresentation

_Q_VALUE = re.compile(r"^(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)$")
_UNSUPPORTED_TYPES = frozenset(
    {
        "application/yaml",
        "application/cbor",
        "application/cbor-seq",
        "application/json",  # only reached when the case differs from the apiserver's
    }
)
# The media-type parameters the hub serves: the apiserver's transformation (as, g, v), its watch
# framing, and HTTP's charset (which no Kubernetes version reads). A request with any other is
# passed through, whether the apiserver reads it (pretty, sv, export, profile) or ignores it, as
# 1.37.2 does ``drop=metadata.managedFields``: a later apiserver may answer it with another
# representation, which a watch shared with plain JSON clients would not be.
_SERVED_PARAMS = frozenset({"as", "g", "v", "stream", "charset"})
_INCLUDE_OBJECT = {"": "Metadata", "Metadata": "Metadata", "Object": "Object"}


class _Unservable(Exception):
    pass


def _split_first(s: str, sep: str) -> tuple[str, str]:
    head, found, tail = s.partition(sep)
    return head, tail if found else ""


def _parse_accept(header: str) -> list[tuple[float, str, str, dict[str, str]]]:
    """goautoneg.ParseAccept, minus the sort; raises _Unservable where Go would guess."""
    clauses: list[tuple[float, str, str, dict[str, str]]] = []
    remaining = header
    while remaining:
        part, remaining = _split_first(remaining, ",")
        part = part.strip(" ")
        media_range, rest = _split_first(part, ";")
        type_, sub = _split_first(media_range, "/")
        type_ = type_.strip(" ")
        if not sub:
            if type_ != "*":
                continue
            sub = "*"
        else:
            sub, extra = _split_first(sub, "/")
            if extra:
                continue
            sub = sub.strip(" ")
        q = 1.0
        params: dict[str, str] = {}
        while rest:
            param, rest = _split_first(rest, ";")
            name, value = _split_first(param, "=")
            if not value or "=" in value:
                continue
            name = name.strip(" ")
            if name == "q":
                if not _Q_VALUE.match(value):
                    raise _Unservable
                q = float(value)
            else:
                params[name] = value.strip(" ")
        if type_ == "*" and sub != "*":
            raise _Unservable  # goautoneg's Less is inconsistent for "*/x"
        clauses.append((q, type_, sub, params))
    return clauses


def _specificity(type_: str, sub: str) -> int:
    return 2 if type_ == "*" else 1 if sub == "*" else 0


def _sorted_clauses(header: str) -> list[tuple[float, str, str, dict[str, str]]]:
    clauses = _parse_accept(header)
    keyed = [((-q, _specificity(t, s)), (q, t, s, p)) for q, t, s, p in clauses]
    ordered = sorted(keyed, key=lambda kv: kv[0])  # stable, as Go's sort is for short input
    already_sorted = [k for k, _ in keyed] == [k for k, _ in ordered]
    # Go's sort.Sort is stable only for short inputs (insertion sort up to 12 elements;
    # before Go 1.19 a shell pass made inputs of 7+ unstable unless already sorted).
    if len(clauses) > 12 or (len(clauses) > 6 and not already_sorted):
        raise _Unservable
    for i, (qi, ti, si, _) in enumerate(clauses):
        for qj, tj, sj, _ in clauses[i + 1 :]:
            si_, sj_ = _specificity(ti, si), _specificity(tj, sj)
            if (qi < qj and si_ < sj_) or (qj < qi and sj_ < si_):
                raise _Unservable  # goautoneg's Less is not a strict weak order here
    return [c for _, c in ordered]


def _from_json_params(params: Mapping[str, str], include_object: str | None) -> Representation:
    if params.get("stream", "") not in ("", "watch"):
        raise _Unservable
    if any(name not in _SERVED_PARAMS for name in params):
        raise _Unservable
    if not any(name in params for name in ("as", "g", "v")):
        return JsonRepresentation()
    kind, group, version = params.get("as", ""), params.get("g", ""), params.get("v", "")
    if group != META_GROUP or version not in META_VERSIONS:
        raise _Unservable
    if kind == "PartialObjectMetadata":
        return PartialMetadataRepresentation(version)
    if kind == "Table":
        mode = _INCLUDE_OBJECT.get(include_object or "")
        if mode is None:  # "None" (rows without objects cannot be keyed) or invalid
            raise _Unservable
        return TableRepresentation(version, mode)
    raise _Unservable  # PartialObjectMetadataList on a watch, or an unknown kind


def _from_protobuf_params(params: Mapping[str, str]) -> Representation:
    # Only the kind's own protobuf: PartialObjectMetadata and Table in protobuf are not shared.
    if any(name != "stream" for name in params) or params.get("stream", "") not in ("", "watch"):
        raise _Unservable
    return ProtobufRepresentation()


def representation_for(accept: str | None, include_object: str | None) -> Representation | None:
    """The representation the apiserver would serve for this watch, or None to pass through.

    ``include_object`` is the ``includeObject`` query parameter; only Table watches read it,
    as the apiserver does.
    """
    header = (accept or "").strip(" \t")
    if not header:
        return JsonRepresentation()
    try:
        for _q, type_, sub, params in _sorted_clauses(header):
            if (type_, sub) in (("application", "json"), ("application", "*"), ("*", "*")):
                # application/json is the apiserver's first serializer, so wildcards pick it.
                return _from_json_params(params, include_object)
            if (type_, sub) == ("application", "vnd.kubernetes.protobuf"):
                return _from_protobuf_params(params)
            if f"{type_}/{sub}".lower() in _UNSUPPORTED_TYPES:
                raise _Unservable
        return None  # nothing acceptable: the apiserver answers 406 Not Acceptable
    except _Unservable:
        return None
