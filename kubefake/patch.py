"""PATCH bodies: JSON merge patch (RFC 7386) and JSON patch (RFC 6902). Pure.

Strategic merge and server-side apply are served as merge patches: lists are replaced whole.
"""

from __future__ import annotations

import copy
from typing import Any

from .errors import Invalid, UnsupportedMediaType

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"
JSON_PATCH = "application/json-patch+json"
APPLY = "application/apply-patch+yaml"
PATCH_TYPES = (JSON_PATCH, MERGE, STRATEGIC, APPLY)


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = copy.deepcopy(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if key == "$patch":
            continue
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _unescape(token: str) -> str:
    return token.replace("~1", "/").replace("~0", "~")


def _walk(doc: Any, path: str) -> tuple[Any, str]:
    """The container holding the last token of ``path``, and that token."""
    if not path.startswith("/"):
        raise Invalid(f"json patch: invalid path {path!r}")
    tokens = [_unescape(t) for t in path[1:].split("/")]
    cur = doc
    for t in tokens[:-1]:
        try:
            cur = cur[int(t)] if isinstance(cur, list) else cur[t]
        except (KeyError, IndexError, ValueError, TypeError):
            raise Invalid(f"json patch: path {path!r} does not exist") from None
    return cur, tokens[-1]


def _get(doc: Any, path: str) -> Any:
    if path == "":
        return doc
    parent, key = _walk(doc, path)
    try:
        return parent[int(key)] if isinstance(parent, list) else parent[key]
    except (KeyError, IndexError, ValueError, TypeError):
        raise Invalid(f"json patch: path {path!r} does not exist") from None


def _remove(doc: Any, path: str) -> Any:
    parent, key = _walk(doc, path)
    try:
        return parent.pop(int(key)) if isinstance(parent, list) else parent.pop(key)
    except (KeyError, IndexError, ValueError, TypeError):
        raise Invalid(f"json patch: cannot remove {path!r}: it does not exist") from None


def _add(doc: Any, path: str, value: Any, *, replace: bool = False) -> None:
    parent, key = _walk(doc, path)
    if isinstance(parent, list):
        if key == "-" and not replace:
            parent.append(value)
            return
        try:
            index = int(key)
        except ValueError:
            raise Invalid(f"json patch: bad array index in {path!r}") from None
        if not 0 <= index <= len(parent) - (1 if replace else 0):
            raise Invalid(f"json patch: index out of range in {path!r}")
        if replace:
            parent[index] = value
        else:
            parent.insert(index, value)
    elif isinstance(parent, dict):
        if replace and key not in parent:
            raise Invalid(f"json patch: cannot replace {path!r}: it does not exist")
        parent[key] = value
    else:
        raise Invalid(f"json patch: {path!r} is not inside an object or array")


def json_patch(target: Any, ops: Any) -> Any:
    """RFC 6902 (add, remove, replace, move, copy, test) applied to a copy of ``target``."""
    if not isinstance(ops, list):
        raise Invalid("json patch: the body must be a list of operations")
    doc = copy.deepcopy(target)
    for op in ops:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise Invalid(f"json patch: invalid operation {op!r}")
        name, path = op["op"], op["path"]
        if name == "add":
            _add(doc, path, copy.deepcopy(op.get("value")))
        elif name == "remove":
            _remove(doc, path)
        elif name == "replace":
            _add(doc, path, copy.deepcopy(op.get("value")), replace=True)
        elif name == "move":
            _add(doc, path, _remove(doc, op["from"]))
        elif name == "copy":
            _add(doc, path, copy.deepcopy(_get(doc, op["from"])))
        elif name == "test":
            if _get(doc, path) != op.get("value"):
                raise Invalid(f"json patch: test failed at {path!r}")
        else:
            raise Invalid(f"json patch: unknown operation {name!r}")
    return doc


def apply_patch(content_type: str, target: Any, patch: Any) -> Any:
    """Apply a parsed PATCH body of the given media type."""
    if content_type == JSON_PATCH:
        return json_patch(target, patch)
    if content_type in (MERGE, STRATEGIC, APPLY):
        if not isinstance(patch, dict):
            raise Invalid("the patch body must be a JSON object")
        return merge_patch(target, patch)
    raise UnsupportedMediaType(
        f"the body of the request was in an unknown format - accepted "
        f"media types include: {', '.join(PATCH_TYPES)}"
    )
