"""A fake Kubernetes apiserver for watchproxy's tests, demo and benchmarks.

It serves a handful of resources (pods, configmaps, secrets, services, namespaces, deployments)
over TLS with bearer-token auth, with the list/watch semantics clients rely on: one global
resourceVersion, a history ring per resource (410 Expired beyond it), selectors, pagination,
bookmarks, sendInitialEvents, Table and PartialObjectMetadata representations, and faults that
tests switch on and off (outages, throttling, cut, hung or garbled watches).
"""

from .churn import Churner
from .errors import ApiError
from .faults import Faults
from .server import FakeApiServer
from .stats import RequestRecord, Stats
from .store import Change, Store

__all__ = [
    "ApiError",
    "Change",
    "Churner",
    "FakeApiServer",
    "Faults",
    "RequestRecord",
    "Stats",
    "Store",
]
