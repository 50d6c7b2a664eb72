"""Checking and classifying Kubernetes API request paths, before anything is forwarded.

The proxy refuses non-canonical paths instead of normalising them: a path that two parsers could
read differently (``..``, ``%2F``, ``//``, a backslash) is how a request aimed at one resource
reaches another. What passes the check is judged on its decoded segments, as the apiserver
(Go's ``url.URL.Path``) decodes them: ``%73ecrets`` is ``secrets``. What goes upstream is
:attr:`ApiPath.canonical`, those same segments encoded again one way only (:func:`encode_segment`),
so that the bytes the apiserver receives decode to exactly the path that was judged. A path
without ``%`` is already canonical and goes as it came.

One trailing slash is not ambiguous: kube-apiserver serves ``/version/``, ``/api/``,
``/apis/apps/v1/``, ``/api/v1/namespaces/default/pods/`` and ``.../pods/p/`` exactly as without
it (checked against v1.34), and some clients ask for ``/version/`` when they connect. Such a path
is classified as if the slash were absent and still forwarded as sent.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass
from typing import Literal

from watchproxy.errors import BadRequest

PathKind = Literal["core", "group", "discovery", "other"]

# RFC 3986 pchar (unreserved, sub-delims, ":" and "@") plus "%" for escapes; "/" separates.
_RAW_SEGMENT_RE = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@%]*", re.ASCII)
_ESCAPE_RE = re.compile(r"%([0-9A-Fa-f]{2})", re.ASCII)
# Subresources of a namespace object itself (apiserver requestinfo's namespaceSubresources).
_NAMESPACE_SUBRESOURCES = frozenset({"status", "finalize"})
# RFC 3986 pchar without "%": what a canonical segment holds unescaped. Go's path decoding leaves
# each of these as it is, so writing them plain or escaped means the same to the apiserver.
_PCHAR = frozenset(
    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-._~!$&'()*+,;=:@"
)
_PLAIN_SEGMENT_RE = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@]*", re.ASCII)
# The apiserver's special verbs (requestinfo's specialVerbs): a path segment after the version.
_SPECIAL_VERBS = frozenset({"watch", "proxy"})


@dataclass(frozen=True, slots=True)
class ApiPath:
    """A checked API path and what it addresses.

    Guarantees: ``raw`` is exactly the string that was checked; ``canonical`` is what to forward:
    ``segments`` encoded by :func:`encode_segment` (``raw`` itself, the same object, when ``raw``
    has no ``%``), so it decodes to the same segments. ``segments`` and every other field hold
    percent-decoded segment text that contains no ``/``, ``\\``, ``%``, control character, and
    is never ``.`` or ``..``; ``segments`` are all of the path's, a trailing slash left out.

    ``kind`` is ``"core"`` for ``/api/v1/...`` resources, ``"group"`` for
    ``/apis/{group}/{version}/...`` resources, ``"discovery"`` for ``/api``, ``/api/{v}``,
    ``/apis``, ``/apis/{g}`` and ``/apis/{g}/{v}``, and ``"other"`` for everything else
    (``/version``, ``/openapi/...``, ``/healthz``, ``/``...). ``namespace`` is None for
    cluster-scoped requests, including those on the ``namespaces`` resource itself.
    ``tail`` holds the segments after a subresource (``.../pods/p/proxy/a/b``); there a trailing
    slash is kept as a final empty segment, because proxied backends tell it apart.
    ``trailing_slash`` is True when ``raw`` ends with one ``/`` after a non-empty segment.
    """

    raw: str
    kind: PathKind
    group: str = ""
    version: str = ""
    namespace: str | None = None
    resource: str | None = None
    name: str | None = None
    subresource: str | None = None
    legacy_watch: bool = False
    tail: tuple[str, ...] = ()
    trailing_slash: bool = False
    # Derived from the rest: not part of what a path is equal to (tests build expected values).
    canonical: str = dataclasses.field(default="", compare=False)
    segments: tuple[str, ...] = dataclasses.field(default=(), compare=False)

    @property
    def decoded(self) -> str:
        """The decoded path, as the apiserver's ``URL.Path`` holds it (no trailing slash)."""
        return "/" + "/".join(self.segments)

    @property
    def is_collection(self) -> bool:
        """True for a request on a whole collection (a resource without a name)."""
        return self.resource is not None and self.name is None


# A controller sends the same few paths thousands of times a second; an ApiPath is frozen, so
# each parse is kept (a refused path is parsed, and refused, again every time).
@functools.lru_cache(maxsize=4096)
def parse_api_path(raw_path: str) -> ApiPath:
    """Check ``raw_path`` (as received, before percent-decoding) and classify it.

    Raises :class:`~watchproxy.errors.BadRequest` for anything non-canonical: a relative or empty
    path, ``.``/``..`` segments (also as ``%2e``), empty segments other than one trailing slash,
    encoded ``/`` or ``\\``, an encoded ``%``, control characters, characters outside RFC 3986
    ``pchar``, malformed escapes or escapes that are not UTF-8. A query string (from ``?``) is
    not part of the path: pass the path alone.
    """
    if not raw_path.startswith("/"):
        raise _invalid(raw_path, "must start with '/'")
    if raw_path == "/":
        return ApiPath(raw=raw_path, kind="other", canonical=raw_path)
    raw_segments = raw_path[1:].split("/")
    segments = [_decode_segment(raw_path, segment) for segment in raw_segments]
    # Escapes of characters that need none (%73ecrets) are written plain, the rest one way.
    canonical = raw_path if "%" not in raw_path else "/" + "/".join(map(encode_segment, segments))
    if len(segments) >= 2 and segments[-1] == "":
        # The apiserver serves "x/" as "x"; a second slash ("x//") stays an empty segment.
        parsed = _classify(raw_path, segments[:-1])
        tail = (*parsed.tail, "") if parsed.subresource == "proxy" else parsed.tail
        return dataclasses.replace(
            parsed,
            trailing_slash=True,
            tail=tail,
            canonical=canonical,
            segments=tuple(segments[:-1]),
        )
    return dataclasses.replace(
        _classify(raw_path, segments), canonical=canonical, segments=tuple(segments)
    )


def encode_segment(segment: str) -> str:
    """``segment`` (decoded text) as it goes in a canonical path: RFC 3986 ``pchar`` characters
    as they are, every other character as the percent-escapes of its UTF-8 bytes, upper-case
    hex. Decoding the result gives ``segment`` back."""
    if _PLAIN_SEGMENT_RE.fullmatch(segment):
        return segment
    return "".join(
        ch if ch in _PCHAR else "".join(f"%{byte:02X}" for byte in ch.encode("utf-8"))
        for ch in segment
    )


def canonical_target(target: str) -> str:
    """The request target to send upstream for ``target`` (a path :func:`parse_api_path`
    accepts, and its query): the canonical path and the query as it came. Raises BadRequest for
    a path it refuses. Without a ``%`` anywhere, ``target`` itself: the hot path does no work."""
    if "%" not in target:
        return target
    path, mark, query = target.partition("?")
    canonical = parse_api_path(path).canonical
    return target if canonical == path else canonical + mark + query


def _classify(raw_path: str, segments: list[str]) -> ApiPath:
    # Empty segments are only meaningful inside a proxied tail; the resource layout decides.
    if segments[0] == "api":
        return _parse_resource_path(raw_path, "core", "", segments[1:])
    if segments[0] == "apis":
        if len(segments) >= 2:
            _require_nonempty(raw_path, segments[1:3])
        if len(segments) <= 3:
            return _checked(
                raw_path,
                ApiPath(
                    raw=raw_path,
                    kind="discovery",
                    group=segments[1] if len(segments) >= 2 else "",
                    version=segments[2] if len(segments) == 3 else "",
                ),
                segments,
            )
        return _parse_resource_path(raw_path, "group", segments[1], segments[2:])
    return _checked(raw_path, ApiPath(raw=raw_path, kind="other"), segments)


def _parse_resource_path(
    raw_path: str, kind: Literal["core", "group"], group: str, parts: list[str]
) -> ApiPath:
    """``parts`` starts at the version segment (``v1/namespaces/ns/pods/...``)."""
    if not parts:
        return _checked(raw_path, ApiPath(raw=raw_path, kind="discovery", group=group), [])
    version, rest = parts[0], parts[1:]
    _require_nonempty(raw_path, [version])
    if not rest:
        return ApiPath(raw=raw_path, kind="discovery", group=group, version=version)
    if rest[0] in _SPECIAL_VERBS and len(rest) < 2:
        # The apiserver cannot resolve "/api/v1/watch" (it answers 500): nothing to forward.
        raise _invalid(raw_path, f"'{rest[0]}' names no resource")
    legacy_watch = rest[0] == "watch"
    if legacy_watch:
        rest = rest[1:]

    namespace: str | None = None
    if len(rest) >= 3 and rest[0] == "namespaces" and rest[2] not in _NAMESPACE_SUBRESOURCES:
        # /namespaces/{ns}/{resource}/...: a namespaced resource. Fewer parts, or a namespace
        # subresource, address the cluster-scoped "namespaces" resource itself.
        _require_nonempty(raw_path, rest[1:2])
        namespace = rest[1]
        rest = rest[2:]

    fixed, tail = rest[:3], tuple(rest[3:])
    _require_nonempty(raw_path, fixed)
    subresource = fixed[2] if len(fixed) >= 3 else None
    # A trailing slash was taken off by the caller; every segment left must be non-empty.
    _require_nonempty(raw_path, list(tail))
    return ApiPath(
        raw=raw_path,
        kind=kind,
        group=group,
        version=version,
        namespace=namespace,
        resource=fixed[0] if fixed else None,
        name=fixed[1] if len(fixed) >= 2 else None,
        subresource=subresource,
        legacy_watch=legacy_watch,
        tail=tail,
    )


def _checked(raw_path: str, result: ApiPath, segments: list[str]) -> ApiPath:
    _require_nonempty(raw_path, segments)
    return result


def _require_nonempty(raw_path: str, segments: list[str]) -> None:
    if any(segment == "" for segment in segments):
        raise _invalid(raw_path, "empty path segment")


def _decode_segment(raw_path: str, raw_segment: str) -> str:
    if not _RAW_SEGMENT_RE.fullmatch(raw_segment):
        bad = next(ch for ch in raw_segment if not _RAW_SEGMENT_RE.fullmatch(ch))
        if bad == "?":
            raise _invalid(raw_path, "a query string is not part of the path")
        raise _invalid(raw_path, f"character {bad!r} is not allowed")
    if "%" in raw_segment:
        if raw_segment.count("%") != len(_ESCAPE_RE.findall(raw_segment)):
            raise _invalid(raw_path, "malformed percent-escape")
        raw_bytes = _ESCAPE_RE.sub(lambda m: chr(int(m.group(1), 16)), raw_segment)
        try:
            segment = raw_bytes.encode("latin-1").decode("utf-8")
        except UnicodeDecodeError:
            raise _invalid(raw_path, "percent-escapes are not UTF-8") from None
    else:
        # The pattern above already admits no slash, backslash or control character.
        if raw_segment in (".", ".."):
            raise _invalid(raw_path, "'.' and '..' segments are refused")
        return raw_segment
    if segment in (".", ".."):
        raise _invalid(raw_path, "'.' and '..' segments are refused")
    for ch in segment:
        if ch in "/\\":
            raise _invalid(raw_path, "encoded slash or backslash")
        if ch == "%":
            raise _invalid(raw_path, "encoded '%' is refused")
        if ord(ch) < 0x20 or 0x7F <= ord(ch) <= 0x9F:
            raise _invalid(raw_path, "control character")
    return segment


def _invalid(raw_path: str, why: str) -> BadRequest:
    shown = raw_path if len(raw_path) <= 200 else raw_path[:200] + "..."
    return BadRequest(f"invalid request path {shown!r}: {why}")
