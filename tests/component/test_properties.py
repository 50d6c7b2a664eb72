"""Properties (hypothesis): parsing never fails in any way but BadRequest, canonical selector
forms are fixed points, and through the real proxy every client's stream is exact."""

from __future__ import annotations

import asyncio
import contextlib
import json
import string
import tempfile
from typing import Any

import aiohttp
from hypothesis import HealthCheck, given, settings
from hypothesis import event as note
from hypothesis import strategies as st

from tests.harness import running_proxy, wait_for
from watchproxy.errors import BadRequest
from watchproxy.kube.apipath import parse_api_path
from watchproxy.kube.fieldselectors import parse_field_selector
from watchproxy.kube.selectors import parse_label_selector
from watchproxy.kube.watchquery import KNOWN_PARAMETERS, parse_watch_query

# --- (a) parsing ------------------------------------------------------------------------------

spaces = st.sampled_from(["", " ", "  ", "\t"])
names = st.from_regex(r"[a-z0-9]([a-z0-9._-]{0,8}[a-z0-9])?", fullmatch=True)
prefixes = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,6}[a-z0-9])?(\.[a-z]{1,5}){0,2}", fullmatch=True)
label_keys = st.one_of(names, st.builds(lambda p, n: f"{p}/{n}", prefixes, names))
label_values = st.one_of(st.just(""), names)
# Gt/Lt values are integers that are also valid label values: no sign.
integers = st.integers(0, 2**63 - 1).map(str)


@st.composite
def label_requirement(draw: st.DrawFn) -> str:
    key = draw(label_keys)
    a, b = draw(spaces), draw(spaces)
    kind = draw(st.sampled_from(["exists", "!", "=", "==", "!=", "in", "notin", ">", "<"]))
    if kind == "exists":
        return key
    if kind == "!":
        return f"!{a}{key}"
    if kind in ("=", "==", "!="):
        return f"{key}{a}{kind}{b}{draw(label_values)}"
    if kind in (">", "<"):
        return f"{key}{a}{kind}{b}{draw(integers)}"
    values = draw(st.lists(names, min_size=1, max_size=4))
    sep = draw(st.sampled_from([",", ", ", " ,"]))
    return f"{key} {kind}{a}({b}{sep.join(values)}{a})"


label_selectors = st.lists(label_requirement(), max_size=5).map(",".join)

field_names = st.sampled_from(["metadata.name", "metadata.namespace", "status.phase", "spec.x"])
field_values = st.text(alphabet=string.ascii_letters + string.digits + "-.\\,= ", max_size=8)


@st.composite
def field_requirement(draw: st.DrawFn) -> str:
    value = draw(field_values).replace("\\", "\\\\").replace(",", "\\,").replace("=", "\\=")
    return f"{draw(field_names)}{draw(st.sampled_from(['=', '==', '!=']))}{value}"


field_selectors = st.lists(field_requirement(), max_size=4).map(",".join)
junk = st.text(alphabet=string.printable + "\x00é☃", max_size=40)
label_sets = st.dictionaries(names, label_values, max_size=4)


@given(label_selectors, st.lists(label_sets, max_size=5))
def test_valid_label_selectors_round_trip_through_their_canonical_form(
    selector: str, label_samples: list[dict[str, str]]
) -> None:
    parsed = parse_label_selector(selector)
    canonical = parsed.canonical()
    again = parse_label_selector(canonical)
    assert again == parsed
    assert again.canonical() == canonical
    for labels in label_samples:
        assert again.matches(labels) == parsed.matches(labels)


@given(st.lists(label_requirement(), min_size=1, max_size=4), st.randoms())
def test_label_canonical_form_ignores_order_and_repetition(parts: list[str], rng: Any) -> None:
    shuffled = [*parts, *parts]
    rng.shuffle(shuffled)
    assert (
        parse_label_selector(",".join(shuffled)).canonical()
        == parse_label_selector(",".join(parts)).canonical()
    )


@given(field_selectors)
def test_valid_field_selectors_round_trip_through_their_canonical_form(selector: str) -> None:
    parsed = parse_field_selector(selector)
    again = parse_field_selector(parsed.canonical())
    assert again == parsed
    assert again.canonical() == parsed.canonical()


@given(st.one_of(junk, label_selectors.map(lambda s: s + "(")))
def test_junk_label_selectors_raise_only_bad_request(text: str) -> None:
    try:
        parsed = parse_label_selector(text)
    except BadRequest:
        return
    assert parse_label_selector(parsed.canonical()) == parsed


@given(junk)
def test_junk_field_selectors_raise_only_bad_request(text: str) -> None:
    try:
        parsed = parse_field_selector(text)
    except BadRequest:
        return
    assert parse_field_selector(parsed.canonical()) == parsed


query_values = st.one_of(
    junk,
    st.sampled_from(["true", "false", "0", "1", "", "-1", "NotOlderThan", "Exact", "None"]),
    st.integers(-(2**65), 2**65).map(str),
    label_selectors,
)
query_keys = st.one_of(st.sampled_from(sorted(KNOWN_PARAMETERS)), junk)


@given(st.dictionaries(query_keys, query_values, max_size=8))
def test_parse_watch_query_raises_only_bad_request(query: dict[str, str]) -> None:
    try:
        parsed = parse_watch_query(query)
    except BadRequest as error:
        assert 400 <= error.code < 500
        assert error.status()["kind"] == "Status"
        return
    if parsed.resource_version:
        assert parsed.resource_version.isdigit()
    if parsed.timeout_seconds is not None:  # negative is valid: the watch ends at once
        assert -(2**63) <= parsed.timeout_seconds < 2**63


path_segments = st.one_of(
    st.sampled_from(["api", "apis", "v1", "namespaces", "default", "pods", "..", ".", "", "%2e"]),
    st.sampled_from(["%2F", "%5C", "%00", "%25", "%zz", "%ff", "watch", "log", "exec"]),
    junk,
)


@given(st.lists(path_segments, max_size=8).map(lambda s: "/" + "/".join(s)))
def test_api_paths_are_canonical_or_bad_request(path: str) -> None:
    try:
        parsed = parse_api_path(path)
    except BadRequest:
        return
    assert parsed.raw == path
    segments = path.split("/")[1:]
    assert ".." not in segments and "." not in segments
    assert "%2f" not in path.lower() and "%5c" not in path.lower() and "\\" not in path


# --- (b) end to end: every client's stream is exact ---------------------------------------------

PODS = "/api/v1/namespaces/default/pods"
NAMES = ["a", "b", "c", "d"]
SELECTORS = {
    "": lambda app: True,
    "app=x": lambda app: app == "x",
    "app!=x": lambda app: app != "x",
}

Snapshot = dict[str, tuple[int, str]]  # name -> (resourceVersion, app label)


class Client:
    def __init__(
        self, session: aiohttp.ClientSession, url: str, selector: str, start: Snapshot | None
    ) -> None:
        self.selector = selector
        self.start = start  # the state at its resourceVersion (None: it gets the current one)
        self.events: list[dict[str, Any]] = []
        self.ended = False
        self._task = asyncio.create_task(self._run(session, url))

    async def _run(self, session: aiohttp.ClientSession, url: str) -> None:
        timeout = aiohttp.ClientTimeout(total=None)
        try:
            async with session.get(url, timeout=timeout) as response:
                assert response.status == 200
                async for raw in response.content:
                    if raw.strip():
                        self.events.append(json.loads(raw))
        finally:
            self.ended = True

    def state(self) -> Snapshot:
        state = dict(self.start or {})
        for event in self.events:
            meta = event["object"]["metadata"]
            if event["type"] in ("ADDED", "MODIFIED"):
                state[meta["name"]] = (int(meta["resourceVersion"]), meta["labels"]["app"])
            elif event["type"] == "DELETED":
                state.pop(meta["name"], None)
        return state

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, aiohttp.ClientError):
            await self._task


def filtered(snapshot: Snapshot, selector: str) -> Snapshot:
    keep = SELECTORS[selector]
    return {name: value for name, value in snapshot.items() if keep(value[1])}


def rvs_of(events: list[dict[str, Any]]) -> list[int]:
    return [int(e["object"]["metadata"]["resourceVersion"]) for e in events]


def assert_ordered(client: Client) -> None:
    """Resumed: every event after its RV, strictly increasing. Fresh: synthetic ADDEDs of
    distinct objects, then strictly increasing live events all newer than those."""
    events = client.events
    if client.start is not None:
        rvs = rvs_of(events)
        assert rvs == sorted(set(rvs))
        return
    for split in range(len(events) + 1):
        initial, live = events[:split], events[split:]
        if any(e["type"] != "ADDED" for e in initial):
            break
        initial_names = [e["object"]["metadata"]["name"] for e in initial]
        live_rvs = rvs_of(live)
        if (
            len(set(initial_names)) == len(initial_names)
            and live_rvs == sorted(set(live_rvs))
            and (not live_rvs or not initial or live_rvs[0] > max(rvs_of(initial)))
        ):
            return
    raise AssertionError(f"not an initial state followed by ordered changes: {events}")


write_op = st.tuples(st.just("write"), st.sampled_from(NAMES), st.sampled_from(["x", "y"]))
join_op = st.tuples(
    st.just("join"),
    st.sampled_from(sorted(SELECTORS)),
    st.sampled_from(["fresh", "zero", "resume"]),
)
operations = st.tuples(
    join_op,
    st.lists(
        st.one_of(
            *[write_op] * 6,
            st.tuples(st.just("delete"), st.sampled_from(NAMES), st.just("")),
            join_op,
            st.tuples(st.just("pause"), st.just(""), st.just("")),
        ),
        min_size=8,
        max_size=30,
    ),
).map(lambda first_and_rest: [first_and_rest[0], *first_and_rest[1]])


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations, st.randoms(use_true_random=False))
async def test_every_client_stream_is_exact_through_the_proxy(
    ops: list[tuple[str, str, str]], rng: Any
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        async with running_proxy(tmp) as running, aiohttp.ClientSession() as session:
            store = running.fake.store
            current: Snapshot = {}
            history: list[tuple[int, Snapshot]] = []  # (rv, state after the write at rv)
            clients: list[Client] = []
            try:
                for op, a, b in ops:
                    if op == "write":
                        if a in current:
                            obj = store.patch_labels("pods", "default", a, {"app": b})
                        else:
                            obj = store.create(
                                "pods",
                                "default",
                                {
                                    "metadata": {"name": a, "labels": {"app": b}},
                                    "spec": {"containers": [{"name": "c", "image": "x"}]},
                                },
                            )
                        current[a] = (int(obj["metadata"]["resourceVersion"]), b)
                    elif op == "delete" and a in current:
                        store.delete("pods", "default", a)
                        del current[a]
                    elif op == "pause":
                        await asyncio.sleep(0.02)  # let the proxy catch up here
                        continue
                    elif op == "join":
                        query = f"?watch=true&labelSelector={a.replace('=', '%3D')}"
                        start: Snapshot | None = None
                        if b == "zero":
                            query += "&resourceVersion=0"
                        elif b == "resume" and history:
                            rv, snapshot = rng.choice(history)
                            query += f"&resourceVersion={rv}"
                            start = filtered(snapshot, a)
                        clients.append(Client(session, running.url + PODS + query, a, start))
                        await asyncio.sleep(0)
                        continue
                    else:
                        continue
                    history.append((store.resource_version, dict(current)))

                def caught_up(client: Client) -> bool:
                    if client.ended:
                        return True
                    return client.state() == filtered(current, client.selector)

                await wait_for(
                    lambda: all(caught_up(c) for c in clients), timeout=15, what="catch-up"
                )
                note(f"clients: {min(len(clients), 5)}+")
                note(f"events checked: {sum(len(c.events) for c in clients) // 10 * 10}+")
                for client in clients:
                    if client.ended:
                        # Only a resume older than the key's history may end: one 410.
                        assert client.start is not None
                        [expired] = client.events
                        assert expired["type"] == "ERROR" and expired["object"]["code"] == 410
                        note("a resume got 410 Expired")
                        continue
                    assert client.state() == filtered(current, client.selector)
                    assert_ordered(client)
            finally:
                for client in clients:
                    await client.close()
