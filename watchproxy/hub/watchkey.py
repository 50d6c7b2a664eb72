"""What makes two client watches the same: the key a shared upstream watch is filed under."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from watchproxy.kube.apipath import ApiPath, encode_segment
from watchproxy.kube.negotiation import representation_for
from watchproxy.kube.representation import Representation
from watchproxy.kube.watchquery import WatchQuery


@dataclass(frozen=True, slots=True)
class WatchKey:
    """Everything that changes what a watch client sees. Equal keys share one upstream watch."""

    collection_path: str
    resource_label: str
    label_selector: str
    field_selector: str
    representation: str
    include_object: str
    identity: str

    def describe(self) -> dict[str, str]:
        return {
            "path": self.collection_path,
            "labelSelector": self.label_selector,
            "fieldSelector": self.field_selector,
            "representation": self.representation,
            "includeObject": self.include_object,
            "identity": self.identity,
        }


@dataclass(frozen=True, slots=True)
class Unservable:
    """Why the hub passes a watch through instead of sharing it."""

    reason: str


def identity_of(authorization: str | None, forward: bool) -> str:
    """The identity a watch runs as: the proxy's own, or a digest of the client's credential."""
    if not forward:
        return "proxy"
    if not authorization:
        return "anonymous"
    # The digest is of the client's bytes: a header value the server parsed holds obs-text bytes
    # as surrogate escapes, which a plain encode() refuses (it crashed the request with a 500).
    raw = authorization.encode("utf-8", "surrogateescape")
    return "sha256:" + hashlib.sha256(raw).hexdigest()[:16]


def _is_decimal(rv: str) -> bool:
    return rv.isascii() and rv.isdigit()


def watch_key(
    api_path: ApiPath,
    query: WatchQuery,
    *,
    accept: str | None,
    identity: str,
) -> tuple[WatchKey, Representation] | Unservable:
    """The key of a client watch, or why it cannot be shared faithfully."""
    if api_path.legacy_watch:
        return Unservable("legacy-path")
    if api_path.resource is None or api_path.name is not None or api_path.subresource:
        return Unservable("not-a-collection")
    if query.unknown:
        # A parameter the hub does not understand might change the stream: do not guess.
        return Unservable("unknown-parameter")
    if query.resource_version and not _is_decimal(query.resource_version):
        return Unservable("opaque-resource-version")
    representation = representation_for(accept, query.include_object)
    if representation is None:
        return Unservable("representation")
    # The fields are decoded text: the path sent upstream encodes them again (canonically).
    version, resource = encode_segment(api_path.version), encode_segment(api_path.resource)
    if api_path.kind == "core":
        prefix = f"/api/{version}"
        label = f"{api_path.version}/{api_path.resource}"
    else:
        prefix = f"/apis/{encode_segment(api_path.group)}/{version}"
        label = f"{api_path.group}/{api_path.version}/{api_path.resource}"
    if api_path.namespace is not None:
        path = f"{prefix}/namespaces/{encode_segment(api_path.namespace)}/{resource}"
    else:
        path = f"{prefix}/{resource}"
    key = WatchKey(
        collection_path=path,
        resource_label=label,
        label_selector=query.label_selector_canonical,
        field_selector=query.field_selector_canonical,
        representation=representation.identity,
        include_object=query.include_object or "",
        identity=identity,
    )
    return key, representation
