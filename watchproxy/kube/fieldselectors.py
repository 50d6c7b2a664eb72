"""Field selectors: parsed and validated as the apiserver does (apimachinery
``fields.ParseSelector``), matched and canonicalized. The hub keys shared watches with
:meth:`FieldSelector.canonical`."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from watchproxy.errors import BadRequest

FieldOperator = Literal["=", "!="]


@dataclass(frozen=True, slots=True, order=True)
class FieldRequirement:
    """``field=value`` or ``field!=value``; ``value`` is unescaped. A missing field reads as ""."""

    field: str
    operator: FieldOperator
    value: str

    def matches(self, fields: Mapping[str, str]) -> bool:
        """Whether ``fields`` satisfy this requirement (apimachinery ``hasTerm``/``notHasTerm``)."""
        equal = fields.get(self.field, "") == self.value
        return equal if self.operator == "=" else not equal

    def canonical(self) -> str:
        """The requirement in apiserver syntax, the value escaped as ``fields.EscapeValue``."""
        return f"{self.field}{self.operator}{escape_field_value(self.value)}"


@dataclass(frozen=True, slots=True)
class FieldSelector:
    """A parsed field selector: the AND of its requirements (none = match everything).

    Guarantees: ``requirements`` is sorted and deduplicated and ``==`` is folded into ``=``,
    so :meth:`canonical` is the same string for equivalent spellings and parses back to an
    equal selector. Field names are not checked against a resource's supported fields: the
    apiserver does that per resource.
    """

    requirements: tuple[FieldRequirement, ...] = ()

    @property
    def matches_everything(self) -> bool:
        """True for the empty selector."""
        return not self.requirements

    def matches(self, fields: Mapping[str, str]) -> bool:
        """Whether an object with these field values is selected."""
        return all(requirement.matches(fields) for requirement in self.requirements)

    def canonical(self) -> str:
        """A stable normalised string for this selector ("" for the empty selector)."""
        return ",".join(requirement.canonical() for requirement in self.requirements)


# A selector parses to an immutable value, and a pod's programs send the same few selectors
# (most often none) with every list and watch: each is parsed once. Refusals are not kept.
@functools.lru_cache(maxsize=512)
def parse_field_selector(selector: str) -> FieldSelector:
    """Parse a ``fieldSelector`` like the apiserver; raise BadRequest where it would refuse.

    Terms are split on unescaped commas; in values ``\\\\``, ``\\,`` and ``\\=`` are the only
    escapes, and an unescaped ``,`` or ``=`` in a value is an error, as in apimachinery.
    Whitespace is significant (the apiserver does not trim it either).
    """
    requirements: set[FieldRequirement] = set()
    for term in _split_field_terms(selector):
        if term == "":
            continue
        split = _split_field_term(term)
        if split is None:
            raise BadRequest(f"invalid selector: '{selector}'; can't understand '{term}'")
        field, operator, raw_value = split
        requirements.add(FieldRequirement(field, operator, _unescape_field_value(raw_value)))
    return FieldSelector(tuple(sorted(requirements)))


def escape_field_value(value: str) -> str:
    """Escape ``\\``, ``,`` and ``=`` so that the value survives field selector parsing."""
    return value.replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")


def _split_field_terms(selector: str) -> list[str]:
    terms: list[str] = []
    start = 0
    escaped = False
    for index, char in enumerate(selector):
        if escaped:
            escaped = False
        elif char == "\\":
            escaped = True
        elif char == ",":
            terms.append(selector[start:index])
            start = index + 1
    terms.append(selector[start:])
    return terms


def _split_field_term(term: str) -> tuple[str, FieldOperator, str] | None:
    # No escaping in field names: the first operator found splits the term.
    for index in range(len(term)):
        if term.startswith("!=", index):
            return term[:index], "!=", term[index + 2 :]
        if term.startswith("==", index):
            return term[:index], "=", term[index + 2 :]
        if term.startswith("=", index):
            return term[:index], "=", term[index + 1 :]
    return None


def _unescape_field_value(raw: str) -> str:
    if not any(char in raw for char in "\\,="):
        return raw
    out: list[str] = []
    escaped = False
    for char in raw:
        if escaped:
            if char not in "\\,=":
                raise BadRequest(f"invalid field selector: invalid escape sequence: \\{char}")
            out.append(char)
            escaped = False
        elif char == "\\":
            escaped = True
        elif char in ",=":
            raise BadRequest(f"invalid field selector: unescaped character in value: {char}")
        else:
            out.append(char)
    if escaped:
        raise BadRequest("invalid field selector: invalid escape sequence: \\")
    return "".join(out)
