"""The object store: current objects, one global resourceVersion, a history ring per resource.

Pure (no I/O): every write bumps the global counter like etcd's revision, records the change in
the resource's ring and tells the subscribers synchronously, so a subscriber that registers and
snapshots in the same step never misses or repeats a change.
"""

from __future__ import annotations

import builtins
import copy
import random
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from .errors import AlreadyExists, BadRequest, Conflict, Expired, Invalid, NotFound
from .resources import RESOURCES, ResourceType

Obj = dict[str, Any]
Key = tuple[str, str]  # (namespace or "", name)


def etcd_order(key: Key) -> str:
    """The key as etcd sorts it: the bytes of "namespace/name" ("name" when cluster-scoped).
    Not the tuple's order: "a-b/x" comes before "a/x", because "-" sorts before "/"."""
    return f"{key[0]}/{key[1]}" if key[0] else key[1]


_NAME_CHARS = "bcdfghjklmnpqrstvwxz2456789"


@dataclass(frozen=True)
class Change:
    """One write as the watch cache sees it: ``obj`` is the new state (for DELETED the last
    state stamped with the deletion's resourceVersion), ``prev`` the state before."""

    type: str
    rv: int
    obj: Obj
    prev: Obj | None


Subscriber = Callable[[Change], None]


class History:
    """The last ``size`` changes of one resource. Watches from any RV >= ``horizon`` can be
    served from it; older ones are Expired."""

    def __init__(self, size: int) -> None:
        self._ring: deque[Change] = deque(maxlen=max(1, size))
        self.horizon = 0

    def append(self, change: Change) -> None:
        if len(self._ring) == self._ring.maxlen:
            self.horizon = self._ring[0].rv
        self._ring.append(change)

    def since(self, rv: int) -> list[Change]:
        """The changes after ``rv``, oldest first (Expired if some may have been forgotten)."""
        if rv < self.horizon:
            raise Expired(f"too old resource version: {rv} ({self.horizon})")
        return [c for c in self._ring if c.rv > rv]

    def compact(self, keep_last: int, current_rv: int) -> None:
        if keep_last <= 0:
            self._ring.clear()
            self.horizon = max(self.horizon, current_rv)
            return
        while len(self._ring) > keep_last:
            self.horizon = self._ring.popleft().rv

    def __len__(self) -> int:
        return len(self._ring)


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _key(obj: Mapping[str, Any]) -> Key:
    meta = obj["metadata"]
    return (meta.get("namespace") or "", meta["name"])


def _rt(resource: str) -> ResourceType:
    rt = RESOURCES.get(resource)
    if rt is None:
        raise NotFound("the server could not find the requested resource")
    return rt


def _details(rt: ResourceType, name: str) -> dict[str, Any]:
    return {"name": name, "group": rt.group or None, "kind": rt.name}


def _comparable(obj: Obj) -> Obj:
    out = copy.deepcopy(obj)
    meta = out.get("metadata", {})
    for k in ("resourceVersion", "generation", "managedFields"):
        meta.pop(k, None)
    return out


class Store:
    """Objects of every served resource, keyed by (namespace, name), with etcd-like RVs.

    Every method returns deep copies: callers never hold the store's own dicts.
    """

    def __init__(
        self,
        history_size: int = 1000,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
    ) -> None:
        self._clock = clock
        self._rng = rng or random.Random()
        self._rv = 0
        self._history_size = history_size
        self._objects: dict[str, dict[Key, Obj]] = {name: {} for name in RESOURCES}
        self._history: dict[str, History] = {name: History(history_size) for name in RESOURCES}
        self._subscribers: dict[str, list[Subscriber]] = {name: [] for name in RESOURCES}
        for ns in ("default", "kube-system"):
            self.create("namespaces", None, {"metadata": {"name": ns}})

    # -- reading ---------------------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def horizon(self, resource: str) -> int:
        """The oldest RV a watch or consistent list of ``resource`` can still start from."""
        return self._history[_rt(resource).name].horizon

    def get(self, resource: str, namespace: str | None, name: str) -> Obj:
        rt = _rt(resource)
        obj = self._objects[rt.name].get((namespace or "" if rt.namespaced else "", name))
        if obj is None:
            raise NotFound(f'{rt.name} "{name}" not found', **_details(rt, name))
        return copy.deepcopy(obj)

    def list(self, resource: str, namespace: str | None = None) -> list[Obj]:
        """Current objects of a resource (in one namespace if given), sorted by key."""
        return [copy.deepcopy(o) for _, o in self._sorted(resource, namespace)]

    def _sorted(self, resource: str, namespace: str | None) -> Iterator[tuple[Key, Obj]]:
        objects = self._objects[_rt(resource).name]
        for key in sorted(objects, key=etcd_order):
            if namespace is None or key[0] == namespace:
                yield key, objects[key]

    def snapshot(self, resource: str, rv: int | None = None) -> tuple[dict[Key, Obj], int]:
        """All objects of ``resource`` as they were at ``rv`` (now if None), and that RV.

        Rebuilt from the ring by undoing newer changes; Expired if the ring no longer covers it.
        The objects are the store's own (read-only for the caller).
        """
        rt = _rt(resource)
        current = dict(self._objects[rt.name])
        if rv is None or rv >= self._rv:
            return current, self._rv
        for change in reversed(self._history[rt.name].since(rv)):
            key = _key(change.obj)
            if change.prev is None:
                current.pop(key, None)
            else:
                current[key] = change.prev
        return current, rv

    def changes_since(self, resource: str, rv: int) -> builtins.list[Change]:
        """Changes of ``resource`` after ``rv`` (Expired if older than the ring)."""
        return self._history[_rt(resource).name].since(rv)

    # -- watching --------------------------------------------------------------------------

    def subscribe(self, resource: str, fn: Subscriber) -> Callable[[], None]:
        """Call ``fn`` with every later change of ``resource``; returns the unsubscribe."""
        subs = self._subscribers[_rt(resource).name]
        subs.append(fn)

        def unsubscribe() -> None:
            if fn in subs:
                subs.remove(fn)

        return unsubscribe

    # -- writing ---------------------------------------------------------------------------

    def create(self, resource: str, namespace: str | None, obj: Mapping[str, Any]) -> Obj:
        rt = _rt(resource)
        new = copy.deepcopy(dict(obj))
        meta = new.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise BadRequest("metadata must be an object")
        self._check_namespace(rt, namespace, meta)
        if not meta.get("name"):
            prefix = meta.get("generateName")
            if not prefix:
                raise Invalid(
                    f'{rt.kind} "" is invalid: metadata.name: Required value: name or '
                    "generateName is required",
                    kind=rt.kind,
                )
            meta["name"] = prefix + "".join(self._rng.choice(_NAME_CHARS) for _ in range(5))
        key = _key(new)
        if key in self._objects[rt.name]:
            raise AlreadyExists(f'{rt.name} "{key[1]}" already exists', **_details(rt, key[1]))
        new = {"apiVersion": rt.api_version, "kind": rt.kind, **new}
        meta["uid"] = str(uuid.UUID(int=self._rng.getrandbits(128), version=4))
        meta["creationTimestamp"] = rfc3339(self._clock())
        meta.pop("deletionTimestamp", None)
        if rt.has_generation:
            meta["generation"] = 1
        if rt.name == "namespaces":
            new.setdefault("spec", {"finalizers": ["kubernetes"]})
            new.setdefault("status", {"phase": "Active"})
        return self._write(rt, "ADDED", key, new, None)

    def update(self, resource: str, namespace: str | None, obj: Mapping[str, Any]) -> Obj:
        """Replace an object; a stale ``metadata.resourceVersion`` is a Conflict."""
        rt = _rt(resource)
        new = copy.deepcopy(dict(obj))
        meta = new.setdefault("metadata", {})
        self._check_namespace(rt, namespace, meta)
        name = meta.get("name")
        if not name:
            raise Invalid(f'{rt.kind} "" is invalid: metadata.name: Required value', kind=rt.kind)
        key = _key(new)
        old = self._objects[rt.name].get(key)
        if old is None:
            raise NotFound(f'{rt.name} "{name}" not found', **_details(rt, name))
        sent_rv = meta.get("resourceVersion")
        if sent_rv and sent_rv != old["metadata"]["resourceVersion"]:
            raise Conflict(
                f'Operation cannot be fulfilled on {rt.name} "{name}": the object has been '
                "modified; please apply your changes to the latest version and try again",
                **_details(rt, name),
            )
        new = {"apiVersion": rt.api_version, "kind": rt.kind, **new}
        for k in ("uid", "creationTimestamp", "generation"):
            if k in old["metadata"]:
                meta[k] = old["metadata"][k]
        if rt.has_generation and new.get("spec") != old.get("spec"):
            meta["generation"] = int(old["metadata"].get("generation", 0)) + 1
        if _comparable(new) == _comparable(old):
            return copy.deepcopy(old)  # a no-op write changes nothing, as in the apiserver
        return self._write(rt, "MODIFIED", key, new, old)

    def modify(
        self, resource: str, namespace: str | None, name: str, fn: Callable[[Obj], Obj | None]
    ) -> Obj:
        """Read-modify-write: ``fn`` gets a copy and mutates it (or returns a replacement)."""
        current = self.get(resource, namespace, name)
        result = fn(current)
        new = current if result is None else result
        new.setdefault("metadata", {})["resourceVersion"] = current["metadata"]["resourceVersion"]
        return self.update(resource, namespace, new)

    def patch_labels(
        self, resource: str, namespace: str | None, name: str, labels: Mapping[str, str | None]
    ) -> Obj:
        """Set labels (a None value removes the label)."""

        def apply(obj: Obj) -> None:
            current = obj["metadata"].setdefault("labels", {})
            for k, v in labels.items():
                if v is None:
                    current.pop(k, None)
                else:
                    current[k] = v

        return self.modify(resource, namespace, name, apply)

    def delete(self, resource: str, namespace: str | None, name: str) -> Obj:
        """Remove an object; returns its last state stamped with the deletion's RV."""
        rt = _rt(resource)
        key = (namespace or "" if rt.namespaced else "", name)
        old = self._objects[rt.name].get(key)
        if old is None:
            raise NotFound(f'{rt.name} "{name}" not found', **_details(rt, name))
        return self._write(rt, "DELETED", key, copy.deepcopy(old), old)

    def compact(self, keep_last: int = 0) -> None:
        """Forget history like an etcd compaction: older RVs then answer 410 Expired."""
        for history in self._history.values():
            history.compact(keep_last, self._rv)

    # -- internals -------------------------------------------------------------------------

    def _check_namespace(self, rt: ResourceType, namespace: str | None, meta: Obj) -> None:
        if not rt.namespaced:
            meta.pop("namespace", None)
            return
        body_ns = meta.get("namespace")
        if namespace and body_ns and body_ns != namespace:
            raise BadRequest(
                "the namespace of the provided object does not match the namespace sent on "
                "the request"
            )
        ns = namespace or body_ns
        if not ns:
            raise BadRequest("a namespace is required for namespaced resources")
        if ("", ns) not in self._objects["namespaces"]:
            raise NotFound(f'namespaces "{ns}" not found', name=ns, kind="namespaces")
        meta["namespace"] = ns

    def _write(self, rt: ResourceType, kind: str, key: Key, new: Obj, prev: Obj | None) -> Obj:
        self._rv += 1
        new["metadata"]["resourceVersion"] = str(self._rv)
        objects = self._objects[rt.name]
        if kind == "DELETED":
            objects.pop(key, None)
        else:
            objects[key] = new
        change = Change(kind, self._rv, new, prev)
        self._history[rt.name].append(change)
        for fn in list(self._subscribers[rt.name]):
            fn(change)
        return copy.deepcopy(new)
