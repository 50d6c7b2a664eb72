"""LIST semantics: resourceVersion(Match), limit and opaque continue tokens. Pure."""

from __future__ import annotations

import base64
import binascii
import bisect
import json
from dataclasses import dataclass

from .errors import BadRequest, Expired, Invalid
from .selectors import Filter
from .store import Key, Obj, Store, etcd_order


@dataclass(frozen=True)
class ListResult:
    items: list[Obj]
    resource_version: int
    continue_token: str | None = None
    remaining: int | None = None


def encode_continue(rv: int, last: Key, namespace: str | None) -> str:
    """The apiserver's token: its start key is relative to the LIST's etcd prefix, so a
    namespaced LIST's tokens carry the name only ("ns/name" cluster-wide, "name" when
    cluster-scoped)."""
    start = last[1] if namespace is not None else etcd_order(last)
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": start + "\x00"})
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_continue(token: str, namespace: str | None) -> tuple[int, Key]:
    try:
        padded = token + "=" * (-len(token) % 4)
        data = json.loads(base64.urlsafe_b64decode(padded.encode()))
        rv = int(data["rv"])
        start = str(data["start"]).rstrip("\x00")
        if namespace is not None:
            ns, name = namespace, start
        else:
            ns, _, name = start.rpartition("/")
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise BadRequest("continue key is not valid: " + str(exc)) from None
    if data.get("v") != "meta.k8s.io/v1" or rv <= 0:
        raise BadRequest("continue key is not valid: incorrect encoded start resourceVersion")
    return rv, (ns, name)


def parse_rv(value: str | None) -> int | None:
    """A client-sent resourceVersion: None when unset, else a decimal uint64 (Go ParseUint)."""
    if value is None or value == "":
        return None
    if not (value.isascii() and value.isdigit()) or int(value) >= 2**64:
        raise BadRequest(
            f'invalid resource version: resourceVersion: Invalid value: "{value}": '
            f'strconv.ParseUint: parsing "{value}": invalid syntax'
        )
    return int(value)


_EXPIRED_CONTINUE = (
    "The provided continue parameter is too old to display a consistent list result. You can "
    "start a new list without the continue parameter."
)


def list_objects(
    store: Store,
    resource: str,
    flt: Filter,
    *,
    limit: int | None = None,
    continue_token: str | None = None,
    resource_version: str | None = None,
    rv_match: str | None = None,
) -> ListResult:
    """One page of a LIST as the apiserver answers it (Expired when the RV is compacted)."""
    rv = parse_rv(resource_version)
    start: Key | None = None
    at: int | None = None
    if continue_token:
        at, start = decode_continue(continue_token, flt.namespace)
        if at < store.horizon(resource):
            raise Expired(_EXPIRED_CONTINUE)
    elif rv_match:
        if rv_match not in ("Exact", "NotOlderThan"):
            raise Invalid(f'resourceVersionMatch: Unsupported value: "{rv_match}"')
        if rv is None:
            raise Invalid("resourceVersionMatch is forbidden unless resourceVersion is provided")
        if rv_match == "Exact":
            if rv == 0:
                raise Invalid('resourceVersionMatch "exact" is forbidden for resourceVersion "0"')
            at = rv
    objects, snap_rv = store.snapshot(resource, at)
    ordered = sorted(objects, key=etcd_order)
    if start is not None:
        after = etcd_order(start)
        ordered = ordered[bisect.bisect_right([etcd_order(k) for k in ordered], after) :]
    if flt.labels.requirements or flt.fields.requirements:
        keys = [k for k in ordered if flt.matches(objects[k])]
    else:  # no selector: the key's namespace decides (the apiserver's cache lists in O(page))
        keys = [k for k in ordered if flt.namespace is None or k[0] == flt.namespace]
    if limit is not None and limit > 0 and len(keys) > limit:
        page = keys[:limit]
        token = encode_continue(snap_rv, page[-1], flt.namespace)
        return ListResult([objects[k] for k in page], snap_rv, token, len(keys) - limit)
    return ListResult([objects[k] for k in keys], snap_rv)
