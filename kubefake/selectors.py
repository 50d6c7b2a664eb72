"""Label and field selectors: parsing (as the apiserver accepts them) and matching. Pure."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .errors import BadRequest

_KEY = r"[A-Za-z0-9][-A-Za-z0-9_./]*"
_VALUE = r"[-A-Za-z0-9_.]*"
_SET_RE = re.compile(rf"^\s*({_KEY})\s+(in|notin)\s*\(([^)]*)\)\s*$")
_EXISTS_RE = re.compile(rf"^\s*(!?)\s*({_KEY})\s*$")
_BINARY_RE = re.compile(rf"^\s*({_KEY})\s*(==|=|!=|>|<)\s*({_VALUE})\s*$")


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
        if not text or not text.strip():
            return cls()
        reqs: list[Requirement] = []
        for part in _split_top_level(text):
            reqs.append(_parse_requirement(part, text))
        return cls(tuple(reqs))

    def matches(self, labels: Mapping[str, str] | None) -> bool:
        labels = labels or {}
        return all(r.matches(labels) for r in self.requirements)


def _parse_requirement(part: str, whole: str) -> Requirement:
    if m := _SET_RE.match(part):
        values = tuple(v.strip() for v in m.group(3).split(",") if v.strip())
        if not values:
            raise BadRequest(f"unable to parse requirement: values for {m.group(2)} must be given")
        return Requirement(m.group(1), m.group(2), values)
    if m := _EXISTS_RE.match(part):
        return Requirement(m.group(2), "!exists" if m.group(1) else "exists")
    if m := _BINARY_RE.match(part):
        op = {"==": "=", "=": "=", "!=": "!=", ">": "gt", "<": "lt"}[m.group(2)]
        if op in ("gt", "lt") and not re.fullmatch(r"-?[0-9]+", m.group(3)):
            raise BadRequest(f"unable to parse requirement: {part!r}: value must be an integer")
        return Requirement(m.group(1), op, (m.group(3),))
    raise BadRequest(f"unable to parse requirement: found {part!r} in selector {whole!r}")


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
        if not text or not text.strip():
            return cls()
        allowed = set(_BASE_FIELDS) | set(supported)
        reqs: list[FieldRequirement] = []
        for part in text.split(","):
            m = re.match(r"^\s*([A-Za-z0-9_.]+)\s*(==|!=|=)\s*(.*?)\s*$", part)
            if m is None:
                raise BadRequest(f"invalid selector: {text!r}; can't understand {part!r}")
            if m.group(1) not in allowed:
                raise BadRequest(f"field label not supported: {m.group(1)}")
            reqs.append(FieldRequirement(m.group(1), m.group(2) != "!=", m.group(3)))
        return cls(tuple(reqs))

    def matches(self, obj: Mapping[str, Any]) -> bool:
        return all((field_value(obj, r.field) == r.value) == r.equal for r in self.requirements)

    def name(self) -> str | None:
        """The single name this selector pins (``metadata.name=X``), if any."""
        for r in self.requirements:
            if r.field == "metadata.name" and r.equal:
                return r.value
        return None


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
