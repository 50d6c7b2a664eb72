"""Label and field selectors: parsing (as the apiserver accepts them) and matching. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import BadRequest

# Label selector grammar as apimachinery's labels.Parse reads it (a lexer, then a parser).
_SPECIAL = frozenset("=!(),<>")
_SYMBOLS = ("!=", "==", "=", "!", "(", ")", ",", "<", ">")
_NAME = re.compile(r"([A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?)?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_INT64 = re.compile(r"[+-]?[0-9]+")
_OPS = {"=": "=", "==": "=", "!=": "!=", "in": "in", "notin": "notin", ">": "gt", "<": "lt"}
_END = ("end", "")


@dataclass(frozen=True)
class Requirement:
    """One label requirement: ``op`` is one of = != in notin exists !exists gt lt."""

    key: str
    op: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        present = self.key in labels
        value = labels.get(self.key)
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and value in self.values
        if self.op in ("!=", "notin"):
            return not present or value not in self.values
        if not present or value is None:
            return False
        try:
            number, bound = int(value), int(self.values[0])
        except ValueError:
            return False
        return number > bound if self.op == "gt" else number < bound


def _split_top_level(text: str) -> list[str]:
    """Split at commas that are not inside ``( )``."""
    parts: list[str] = []
    depth = 0
    current: list[str] = []
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(current))
            current = []
        else:
            current.append(ch)
    parts.append("".join(current))
    return parts


@dataclass(frozen=True)
class LabelSelector:
    """A parsed ``labelSelector``; the empty selector matches everything."""

    requirements: tuple[Requirement, ...] = ()

    @classmethod
    def parse(cls, text: str | None) -> LabelSelector:
        """Parse like the apiserver: BadRequest with its message where it refuses."""
        return cls(tuple(_LabelParser(text or "").parse()))

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)


def _lex(text: str) -> list[tuple[str, str]]:
    """(kind, literal) tokens: kind is "id", "end", or the symbol/keyword itself."""
    tokens: list[tuple[str, str]] = []
    i = 0
    while True:
        while i < len(text) and text[i] in " \t\r\n":
            i += 1
        if i == len(text):
            tokens.append(_END)
            return tokens
        if text[i] in _SPECIAL:
            symbol = next((sym for sym in _SYMBOLS if text.startswith(sym, i)), None)
            if symbol is None:
                raise BadRequest(f"unable to parse requirement: found {text[i]!r}")
            tokens.append((symbol, symbol))
            i += len(symbol)
            continue
        start = i
        while i < len(text) and text[i] not in _SPECIAL and text[i] not in " \t\r\n":
            i += 1
        word = text[start:i]
        tokens.append((word if word in ("in", "notin") else "id", word))


class _LabelParser:
    def __init__(self, text: str) -> None:
        self.tokens = _lex(text)
        self.at = 0

    def peek(self, values: bool = True) -> tuple[str, str]:
        kind, literal = self.tokens[self.at]
        # "in" and "notin" are ordinary identifiers where a key or value is expected.
        return ("id", literal) if values and kind in ("in", "notin") else (kind, literal)

    def take(self, values: bool = True) -> tuple[str, str]:
        token = self.peek(values)
        self.at += 1
        return token

    def parse(self) -> list[Requirement]:
        requirements: list[Requirement] = []
        while True:
            kind, literal = self.peek()
            if kind == "end":
                return requirements
            if kind not in ("id", "!"):
                raise BadRequest(f"found '{literal}', expected: !, identifier, or 'end of string'")
            try:
                requirements.append(self.requirement())
            except BadRequest as error:
                raise BadRequest(f"unable to parse requirement: {error.message}") from None
            kind, literal = self.take()
            if kind == "end":
                return requirements
            if kind != ",":
                raise BadRequest(f"found '{literal}', expected: ',' or 'end of string'")
            kind, literal = self.peek()
            if kind not in ("id", "!"):
                raise BadRequest(f"found '{literal}', expected: identifier after ','")

    def requirement(self) -> Requirement:
        negated = self.peek()[0] == "!"
        if negated:
            self.take()
        kind, key = self.take()
        if kind != "id":
            raise BadRequest(f"found '{key}', expected: identifier")
        _check_key(key)
        if self.peek()[0] in ("end", ","):
            return Requirement(key, "!exists" if negated else "exists")
        kind, literal = self.take(values=False)
        if negated or kind not in _OPS:
            raise BadRequest(f"found '{literal}', expected: in, notin, =, ==, !=, gt, lt")
        op = _OPS[kind]
        values = self.value_set() if op in ("in", "notin") else (self.exact_value(),)
        if op in ("gt", "lt") and not _INT64.fullmatch(values[0]):
            raise BadRequest(f"values[0]: Invalid value: {values[0]!r}: must be an integer")
        for value in values:
            if len(value) > 63 or not _NAME.fullmatch(value):
                raise BadRequest(f"values[0][{key}]: Invalid value: {value!r}: not a label value")
        return Requirement(key, op, values)

    def exact_value(self) -> str:
        if self.peek()[0] in ("end", ","):
            return ""
        kind, literal = self.take()
        if kind != "id":
            raise BadRequest(f"found '{literal}', expected: identifier")
        return literal

    def value_set(self) -> tuple[str, ...]:
        kind, literal = self.take()
        if kind != "(":
            raise BadRequest(f"found '{literal}' expected: '('")
        values: set[str] = set()
        expect_value = True
        while True:
            kind, literal = self.take()
            if kind == ")":
                if expect_value:
                    values.add("")  # "()" and "(a,)" hold the empty value
                return tuple(sorted(values))
            if kind == ",":
                if expect_value:
                    values.add("")
                expect_value = True
                continue
            if kind != "id" or not expect_value:
                raise BadRequest(f"found '{literal}', expected: ',', ')' or identifier")
            values.add(literal)
            expect_value = False


def _check_key(key: str) -> None:
    prefix, slash, name = key.rpartition("/")
    if slash and (not prefix or len(prefix) > 253 or not _DNS_SUBDOMAIN.fullmatch(prefix)):
        raise BadRequest(f"key: Invalid value: {key!r}: prefix must be a DNS subdomain")
    if not name or len(name) > 63 or not _NAME.fullmatch(name) or "/" in prefix:
        raise BadRequest(f"key: Invalid value: {key!r}: name part must be a qualified name")


@dataclass(frozen=True)
class FieldRequirement:
    field: str
    equal: bool
    value: str


_BASE_FIELDS = ("metadata.name", "metadata.namespace")


def field_value(obj: Mapping[str, Any], path: str) -> str:
    """The string value of a dotted field path ("" when absent, as the apiserver compares)."""
    cur: Any = obj
    for part in path.split("."):
        if not isinstance(cur, Mapping):
            return ""
        cur = cur.get(part)
    return "" if cur is None else str(cur)


@dataclass(frozen=True)
class FieldSelector:
    """A parsed ``fieldSelector`` restricted to the field labels a resource supports."""

    requirements: tuple[FieldRequirement, ...] = ()

    @classmethod
    def parse(cls, text: str | None, supported: tuple[str, ...] = ()) -> FieldSelector:
        r"""apimachinery fields.ParseSelector: terms split at unescaped commas, no trimming,
        ``\\``, ``\,`` and ``\=`` the only escapes in values; then the resource's labels."""
        if not text:
            return cls()
        allowed = set(_BASE_FIELDS) | set(supported)
        reqs: list[FieldRequirement] = []
        for part in _split_terms(text):
            if part == "":
                continue
            m = re.match(r"^(.*?)(!=|==|=)(.*)$", part, re.DOTALL)
            if m is None:
                raise BadRequest(f"invalid selector: '{text}'; can't understand '{part}'")
            value = _unescape(m.group(3))
            if m.group(1) not in allowed:
                raise BadRequest(f"field label not supported: {m.group(1)}")
            reqs.append(FieldRequirement(m.group(1), m.group(2) != "!=", value))
        return cls(tuple(reqs))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, r.field) == r.value) == r.equal for r in self.requirements)

    def name(self) -> str | None:
        """The single name this selector pins (``metadata.name=X``), if any."""
        for r in self.requirements:
            if r.field == "metadata.name" and r.equal:
                return r.value
        return None


def _split_terms(text: str) -> list[str]:
    terms: list[str] = []
    current: list[str] = []
    escaped = False
    for ch in text:
        if ch == "," and not escaped:
            terms.append("".join(current))
            current = []
        else:
            current.append(ch)
        escaped = ch == "\\" and not escaped
    terms.append("".join(current))
    return terms


def _unescape(raw: str) -> str:
    out: list[str] = []
    escaped = False
    for ch in raw:
        if escaped:
            if ch not in "\\,=":
                raise BadRequest(f"invalid field selector: invalid escape sequence: \\{ch}")
            out.append(ch)
            escaped = False
        elif ch == "\\":
            escaped = True
        elif ch in ",=":
            raise BadRequest(f"invalid field selector: unescaped character in value: {ord(ch)}")
        else:
            out.append(ch)
    if escaped:
        raise BadRequest("invalid field selector: invalid escape sequence: \\")
    return "".join(out)


@dataclass(frozen=True)
class Filter:
    """Everything that decides whether one object is in a list or watch: namespace + selectors."""

    namespace: str | None = None
    labels: LabelSelector = LabelSelector()
    fields: FieldSelector = FieldSelector()

    def matches(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        return self.labels.matches(meta.get("labels")) and self.fields.matches(obj)
