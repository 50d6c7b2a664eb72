"""How a shared watch's state compares with a watch-list probe of its key (hub/freshwatch.py).

The probe holds the key's objects at its initial-events-end bookmark's resourceVersion B; the
state is served to a watch from now only once it holds every change the probe shows. (A key
too large to probe is replayed instead: tests/component/test_fresh_watch.py.)
"""

from __future__ import annotations

from typing import Any

from tests.unit.test_watchcache import make_cache, pod
from watchproxy.hub.freshwatch import Difference, probe_difference, reached
from watchproxy.hub.watchcache import WatchCache

B = 50  # the probe's bookmark: later than every object below


def synced(*objects: Any, rv: int = 10) -> WatchCache:
    cache = make_cache()
    cache.replace(list(objects), str(rv))
    return cache


def test_a_state_with_the_probes_objects_at_their_resource_versions_differs_in_nothing() -> None:
    cache = synced(pod("a", 3), pod("b", 7))
    difference = probe_difference(cache.state, B, {"ns/a": 3, "ns/b": 7})
    assert difference.none
    assert reached(cache.state, cache.resource_version, difference)


def test_an_empty_state_and_an_empty_probe_differ_in_nothing() -> None:
    cache = synced()
    assert probe_difference(cache.state, B, {}).none


def test_an_object_the_probe_holds_newer_is_waited_for_up_to_its_resource_version() -> None:
    cache = synced(pod("a", 3), pod("b", 7))
    difference = probe_difference(cache.state, B, {"ns/a": 12, "ns/b": 7})
    assert difference == Difference(B, 12, ())
    assert not reached(cache.state, cache.resource_version, difference)
    cache.apply("MODIFIED", pod("a", 12))
    assert reached(cache.state, cache.resource_version, difference)


def test_an_object_the_state_lacks_is_waited_for() -> None:
    cache = synced(pod("a", 3))
    difference = probe_difference(cache.state, B, {"ns/a": 3, "ns/new": 11})
    assert difference == Difference(B, 11, ())
    assert not reached(cache.state, cache.resource_version, difference)
    cache.apply("ADDED", pod("new", 11))
    assert reached(cache.state, cache.resource_version, difference)


def test_the_newest_of_several_changes_is_waited_for() -> None:
    cache = synced(pod("a", 3), pod("b", 7))
    difference = probe_difference(cache.state, B, {"ns/a": 14, "ns/b": 12, "ns/c": 13})
    assert difference.newest == 14
    cache.apply("MODIFIED", pod("b", 12))
    cache.apply("ADDED", pod("c", 13))
    assert not reached(cache.state, cache.resource_version, difference)
    cache.apply("MODIFIED", pod("a", 14))
    assert reached(cache.state, cache.resource_version, difference)


def test_an_object_the_probe_lacks_is_current_only_once_the_state_dropped_it() -> None:
    """Its delete's resourceVersion is unknown: reaching the other changes is not enough."""
    cache = synced(pod("a", 3), pod("gone", 7))
    difference = probe_difference(cache.state, B, {"ns/a": 3})
    assert difference == Difference(B, None, (("ns/gone", 7),))
    assert not difference.none
    assert not reached(cache.state, cache.resource_version, difference)
    cache.apply("MODIFIED", pod("a", 20))  # a later change of another object does not do
    assert not reached(cache.state, cache.resource_version, difference)
    cache.apply("DELETED", pod("gone", 21))
    assert reached(cache.state, cache.resource_version, difference)


def test_a_state_at_the_probes_resource_version_is_current_whatever_it_holds() -> None:
    """An object created after the probe's bookmark is in the state only: not a delete."""
    cache = synced(pod("a", 3))
    cache.apply("ADDED", pod("later", B + 1))
    difference = probe_difference(cache.state, B, {"ns/a": 3})
    assert difference.gone == (("ns/later", B + 1),)
    assert reached(cache.state, cache.resource_version, difference)
