"""Label selectors: parsed and validated as the apiserver does, matched, canonicalized.

The grammar and checks follow k8s.io/apimachinery ``labels.Parse``, so a selector the apiserver
refuses is refused here with a message in the same words, and one it accepts is accepted.
:meth:`LabelSelector.canonical` gives one string per meaning (sorted, deduplicated, normalised
operators and spacing): the hub keys shared watches with it. Field selectors live in
:mod:`watchproxy.kube.fieldselectors`.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from watchproxy.errors import BadRequest

LabelOperator = Literal["=", "!=", "in", "notin", "exists", "!", ">", "<"]

_NAME_RE = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]", re.ASCII)
_DNS_SUBDOMAIN_RE = re.compile(
    r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*", re.ASCII
)
_INT64_RE = re.compile(r"[+-]?[0-9]+", re.ASCII)
_NAME_MAX = 63
_VALUE_MAX = 63
_PREFIX_MAX = 253
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

_WHITESPACE = " \t\r\n"
_SPECIAL = "=!(),><"
_TWO_CHAR_TOKENS = ("!=", "==")
_SYNONYMS: dict[str, LabelOperator] = {
    "=": "=",
    "==": "=",
    "!=": "!=",
    "in": "in",
    "notin": "notin",
    "exists": "exists",
    "!": "!",
    ">": ">",
    "<": "<",
}
_OPERATOR_RANK: dict[str, int] = {
    op: rank for rank, op in enumerate(("exists", "!", "=", "!=", "in", "notin", ">", "<"))
}


# --- label selectors -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LabelRequirement:
    """One requirement of a label selector, already validated.

    ``values`` is sorted and free of duplicates; ``=`` and ``!=`` have exactly one value,
    ``exists`` and ``!`` none, ``in``/``notin`` at least one, ``>``/``<`` one integer.
    """

    key: str
    operator: LabelOperator
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether ``labels`` satisfy this requirement (apimachinery ``Requirement.Matches``)."""
        present = self.key in labels
        if self.operator in ("=", "in"):
            return present and labels[self.key] in self.values
        if self.operator in ("!=", "notin"):
            return not present or labels[self.key] not in self.values
        if self.operator == "exists":
            return present
        if self.operator == "!":
            return not present
        if not present:
            return False
        actual = _parse_int64(labels[self.key])
        if actual is None:
            return False
        wanted = int(self.values[0])
        return actual > wanted if self.operator == ">" else actual < wanted

    def canonical(self) -> str:
        """The requirement in apiserver syntax with normalised spacing."""
        if self.operator == "exists":
            return self.key
        if self.operator == "!":
            return "!" + self.key
        if self.operator in ("in", "notin"):
            return f"{self.key} {self.operator} ({','.join(self.values)})"
        return f"{self.key}{self.operator}{self.values[0]}"

    def _sort_key(self) -> tuple[str, int, tuple[str, ...]]:
        return (self.key, _OPERATOR_RANK[self.operator], self.values)


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """A parsed label selector: the AND of its requirements (none = match everything).

    Guarantees: ``requirements`` is sorted and deduplicated, so two selectors with the same
    meaning up to ordering, spacing, ``==``/``=`` and single-value ``in``/``notin`` compare
    equal and have the same :meth:`canonical` string, which parses back to an equal selector.
    """

    requirements: tuple[LabelRequirement, ...] = ()

    @property
    def matches_everything(self) -> bool:
        """True for the empty selector."""
        return not self.requirements

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Whether an object with these labels is selected."""
        return all(requirement.matches(labels) for requirement in self.requirements)

    def canonical(self) -> str:
        """A stable normalised string for this selector ("" for the empty selector)."""
        return ",".join(requirement.canonical() for requirement in self.requirements)


# A selector parses to an immutable value, and a pod's programs send the same few selectors
# (most often none) with every list and watch: each is parsed once. Refusals are not kept.
@functools.lru_cache(maxsize=512)
def parse_label_selector(selector: str) -> LabelSelector:
    """Parse a ``labelSelector`` like the apiserver; raise BadRequest where it would refuse."""
    parser = _LabelParser(selector)
    requirements = parser.parse()
    unique = {requirement: None for requirement in requirements}
    return LabelSelector(tuple(sorted(unique, key=LabelRequirement._sort_key)))


def _normalised_requirement(key: str, operator: str, values: list[str]) -> LabelRequirement:
    """Validate like apimachinery ``NewRequirement`` and fold synonyms into one operator."""
    _validate_label_key(key)
    unique_values = tuple(sorted(set(values)))
    if operator in ("in", "notin") and not unique_values:
        raise _requirement_error("for 'in', 'notin' operators, values set can't be empty")
    if operator in (">", "<") and _parse_int64(unique_values[0]) is None:
        raise _requirement_error(
            f"values[0]: Invalid value: {values[0]!r}: "
            "for 'Gt', 'Lt' operators, the value must be an integer"
        )
    for value in unique_values:
        _validate_label_value(key, value)
    folded = _SYNONYMS[operator]
    if len(unique_values) == 1 and folded in ("in", "notin"):
        folded = "=" if folded == "in" else "!="
    return LabelRequirement(key, folded, unique_values)


class _LabelParser:
    """A recursive-descent parser over apimachinery's token stream (``labels/selector.go``)."""

    def __init__(self, selector: str) -> None:
        if "\x00" in selector:
            raise BadRequest("unable to parse requirement: found NUL character in selector")
        self._tokens = _lex_label_selector(selector)
        self._position = 0

    def parse(self) -> list[LabelRequirement]:
        requirements: list[LabelRequirement] = []
        while True:
            token = self._peek()
            if token == "":
                return requirements
            if token == "!" or _is_identifier(token, values_context=True):
                requirements.append(self._requirement())
                after = self._take()
                if after == "":
                    return requirements
                if after != ",":
                    raise BadRequest(f"found '{after}', expected: ',' or 'end of string'")
                following = self._peek()
                if following != "!" and not _is_identifier(following, values_context=True):
                    raise BadRequest(f"found '{following}', expected: identifier after ','")
                continue
            raise BadRequest(f"found '{token}', expected: !, identifier, or 'end of string'")

    def _requirement(self) -> LabelRequirement:
        negated = False
        key = self._take()
        if key == "!":
            negated = True
            key = self._take()
        if not _is_identifier(key, values_context=True):
            raise _requirement_error(f"found '{key}', expected: identifier")
        _validate_label_key(key)
        if negated or self._peek() in ("", ","):
            return _normalised_requirement(key, "!" if negated else "exists", [])
        operator = self._take()
        if operator not in ("=", "==", "!=", "in", "notin", ">", "<"):
            raise _requirement_error(f"found '{operator}', expected: in, notin, =, ==, !=, gt, lt")
        values = self._value_set() if operator in ("in", "notin") else [self._exact_value()]
        return _normalised_requirement(key, operator, values)

    def _exact_value(self) -> str:
        if self._peek() in ("", ","):
            return ""
        value = self._take()
        if not _is_identifier(value, values_context=True):
            raise _requirement_error(f"found '{value}', expected: identifier")
        return value

    def _value_set(self) -> list[str]:
        opening = self._take()
        if opening != "(":
            raise _requirement_error(f"found '{opening}' expected: '('")
        token = self._peek()
        if token == ")":
            self._take()
            return [""]
        if token != "," and not _is_identifier(token, values_context=True):
            raise _requirement_error(f"found '{token}', expected: ',', ')' or identifier")
        values = self._identifier_list()
        closing = self._take()
        if closing != ")":
            raise _requirement_error(f"found '{closing}', expected: ')'")
        return values

    def _identifier_list(self) -> list[str]:
        # Empty entries ("(,a)", "(a,,b)", "(a,)") mean the empty value, as in apimachinery.
        values: list[str] = []
        while True:
            token = self._take()
            if _is_identifier(token, values_context=True):
                values.append(token)
                following = self._peek()
                if following == ",":
                    continue
                if following == ")":
                    return values
                raise _requirement_error(f"found '{following}', expected: ',' or ')'")
            if token == ",":
                if not values:
                    values.append("")
                following = self._peek()
                if following == ")":
                    values.append("")
                    return values
                if following == ",":
                    self._take()
                    values.append("")
                continue
            raise _requirement_error(f"found '{token}', expected: ',', or identifier")

    def _peek(self) -> str:
        return self._tokens[self._position] if self._position < len(self._tokens) else ""

    def _take(self) -> str:
        token = self._peek()
        if self._position < len(self._tokens):
            self._position += 1
        return token


def _lex_label_selector(selector: str) -> list[str]:
    """Split into tokens; "" never occurs as a token (it marks the end of input)."""
    tokens: list[str] = []
    position, length = 0, len(selector)
    while position < length:
        char = selector[position]
        if char in _WHITESPACE:
            position += 1
        elif char in _SPECIAL:
            pair = selector[position : position + 2]
            width = 2 if pair in _TWO_CHAR_TOKENS else 1
            tokens.append(selector[position : position + width])
            position += width
        else:
            start = position
            while (
                position < length
                and selector[position] not in _WHITESPACE
                and selector[position] not in _SPECIAL
            ):
                position += 1
            tokens.append(selector[start:position])
    return tokens


def _is_identifier(token: str, *, values_context: bool) -> bool:
    if token == "" or token[0] in _SPECIAL:
        return False
    return values_context or token not in ("in", "notin")


def _requirement_error(detail: str) -> BadRequest:
    return BadRequest(f"unable to parse requirement: {detail}")


def _validate_label_key(key: str) -> None:
    problems: list[str] = []
    parts = key.split("/")
    if len(parts) > 2:
        problems.append(
            "a qualified name must consist of alphanumeric characters, '-', '_' or '.', "
            "with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        )
    else:
        name = parts[-1]
        if len(parts) == 2:
            prefix = parts[0]
            if not prefix:
                problems.append("prefix part must be non-empty")
            elif len(prefix) > _PREFIX_MAX:
                problems.append(f"prefix part must be no more than {_PREFIX_MAX} characters")
            elif not _DNS_SUBDOMAIN_RE.fullmatch(prefix):
                problems.append(
                    "prefix part a lowercase RFC 1123 subdomain must consist of lower case "
                    "alphanumeric characters, '-' or '.', and must start and end with an "
                    "alphanumeric character"
                )
        if not name:
            problems.append("name part must be non-empty")
        elif len(name) > _NAME_MAX:
            problems.append(f"name part must be no more than {_NAME_MAX} characters")
        elif not _NAME_RE.fullmatch(name):
            problems.append(
                "name part must consist of alphanumeric characters, '-', '_' or '.', and "
                "must start and end with an alphanumeric character"
            )
    if problems:
        raise _requirement_error(f"key: Invalid value: {key!r}: {'; '.join(problems)}")


def _validate_label_value(key: str, value: str) -> None:
    if value == "":
        return
    if len(value) > _VALUE_MAX:
        problem = f"must be no more than {_VALUE_MAX} characters"
    elif not _NAME_RE.fullmatch(value):
        problem = (
            "a valid label must be an empty string or consist of alphanumeric characters, "
            "'-', '_' or '.', and must start and end with an alphanumeric character"
        )
    else:
        return
    raise _requirement_error(f"values[0][{key}]: Invalid value: {value!r}: {problem}")


def _parse_int64(text: str) -> int | None:
    """Go's ``strconv.ParseInt(text, 10, 64)``: None where it would fail."""
    if not _INT64_RE.fullmatch(text):
        return None
    number = int(text)
    return number if _INT64_MIN <= number <= _INT64_MAX else None
