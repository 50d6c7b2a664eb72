"""Fuzz targets: raw bytes in, one parser run, its promises checked. No I/O but a scratch file.

Each target turns the bytes into the input its parser takes (a path, a query, a selector, a
watch-stream line, a kubeconfig or config file) and accepts exactly two outcomes: a result that
keeps the parser's documented guarantees, or the parser's own error (a 4xx Status for what
clients send; ``CredentialsError`` / ``ConfigError`` / ``WatchEventError`` for the rest). Any
other exception, a broken guarantee or a 5xx is a finding.

The same targets run under hypothesis in the default suite (tests/unit/test_fuzz.py) and under
atheris, coverage-guided, for a million inputs each (``scripts/fuzz.sh``).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
from collections.abc import Callable

from multidict import MultiDict

from watchproxy.config import AccessRule, ConfigError, build_config, load_file
from watchproxy.errors import BadRequest, ProxyError
from watchproxy.kube.apipath import parse_api_path
from watchproxy.kube.fieldselectors import escape_field_value, parse_field_selector
from watchproxy.kube.selectors import parse_label_selector
from watchproxy.kube.watchevent import WatchEventError, decode_watch_line
from watchproxy.kube.watchquery import InvalidListOptions, parse_watch_query
from watchproxy.policy.access import AccessPolicy
from watchproxy.server.routes import reads_list_options, resolve, verb_of
from watchproxy.upstream.credentials import CredentialsError, from_kubeconfig

METHODS = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PROPFIND")
# Kubernetes verbs, and the lower-cased method where a path names no resource (discovery).
VERBS = frozenset(
    {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection", "connect"}
    | {method.lower() for method in METHODS}
)
POLICY = AccessPolicy(
    (AccessRule("deny", "/api/v1/namespaces/*/secrets*"), AccessRule("allow", "/*")),
    read_only=False,
)


def _text(data: bytes) -> str:
    """Latin-1 reaches every byte value; UTF-8 (when the first byte is odd) every code point."""
    if data[:1] and data[0] & 1:
        return data[1:].decode("utf-8", "replace")
    return data[1:].decode("latin-1")


def _query(text: str) -> MultiDict[str]:
    pairs: MultiDict[str] = MultiDict()
    for part in text.split("&"):
        name, _, value = part.partition("=")
        pairs.add(name, value)
    return pairs


def _check_status(error: ProxyError) -> None:
    assert 400 <= error.code < 500, error.code
    status = error.status()
    assert status["kind"] == "Status" and status["code"] == error.code
    json.dumps(status)  # it must be sendable


def path(data: bytes) -> None:
    text = _text(data)
    try:
        parsed = parse_api_path(text)
    except BadRequest as error:
        _check_status(error)
        return
    assert parsed.raw == text
    assert parse_api_path(text) == parsed  # deterministic
    # What goes upstream is a fixed point that decodes to the same segments.
    forwarded = parse_api_path(parsed.canonical)
    assert forwarded.canonical == parsed.canonical and forwarded.segments == parsed.segments
    named = (parsed.group, parsed.version, parsed.namespace, parsed.resource, parsed.name)
    for value in (*named, parsed.subresource, *parsed.tail):
        if value is None:
            continue
        assert value not in (".", ".."), text
        assert not any(ch in value for ch in "/\\%"), text
        assert all(ord(ch) >= 0x20 and not 0x7F <= ord(ch) <= 0x9F for ch in value), text
    assert parsed.trailing_slash == (len(text) > 1 and text.endswith("/"))
    assert "//" not in text


def label_selector(data: bytes) -> None:
    text = _text(data)
    try:
        selector = parse_label_selector(text)
    except BadRequest as error:
        _check_status(error)
        return
    canonical = selector.canonical()
    assert parse_label_selector(canonical).canonical() == canonical, (text, canonical)
    selector.matches({"a": "b", "app": text[:20]})


def field_selector(data: bytes) -> None:
    text = _text(data)
    try:
        selector = parse_field_selector(text)
    except BadRequest as error:
        _check_status(error)
        return
    canonical = selector.canonical()
    assert parse_field_selector(canonical).canonical() == canonical, (text, canonical)
    # Any value survives escaping: what kubectl sends for `--field-selector` values.
    [requirement] = parse_field_selector(f"metadata.name={escape_field_value(text)}").requirements
    assert requirement.value == text


def query(data: bytes) -> None:
    try:
        parsed = parse_watch_query(_query(_text(data)))
    except BadRequest as error:
        _check_status(error)
        assert isinstance(error, InvalidListOptions) == (error.code == 422)
        return
    if parsed.resource_version:
        assert parsed.resource_version.isascii() and parsed.resource_version.isdigit()
        assert parsed.resource_version_number is not None
    for number in (parsed.timeout_seconds, parsed.limit):
        assert number is None or -(2**63) <= number < 2**63
    assert parsed.resource_version_match in ("", "NotOlderThan", "Exact")


def request(data: bytes) -> None:
    """What the API port decides before routing: path, list options, verb, access rules."""
    method = METHODS[data[0] % len(METHODS)] if data else "GET"
    raw_path, _, raw_query = _text(data[1:]).partition("?")
    try:
        api_path = parse_api_path(raw_path)
        options = None
        if reads_list_options(method, api_path):
            options = parse_watch_query(_query(raw_query))
        verb = verb_of(method, api_path, options is not None and options.watch)
        POLICY.check(method, resolve(method, api_path, options))
    except ProxyError as error:  # every refusal at the edge is a client error
        _check_status(error)
        return
    assert verb in VERBS, verb
    if verb == "watch":
        assert method in ("GET", "HEAD") and api_path.resource is not None


def watch_event(data: bytes) -> None:
    line = data if not data[:1] or data[0] & 1 else data.decode("latin-1")
    try:
        event = decode_watch_line(line)
    except WatchEventError:
        return
    assert event.type in ("ADDED", "MODIFIED", "DELETED", "BOOKMARK", "ERROR")
    assert isinstance(event.object, dict)
    if event.type == "BOOKMARK":
        assert event.resource_version
    assert event.code is None or isinstance(event.code, int)


_scratch: str | None = None


def _scratch_file(name: str, data: bytes) -> str:
    """One file per name in a directory of this process, removed at exit."""
    global _scratch
    if _scratch is None:
        _scratch = tempfile.mkdtemp(prefix="watchproxy-fuzz-")
        atexit.register(shutil.rmtree, _scratch, True)
    file = os.path.join(_scratch, name)
    with open(file, "wb") as handle:
        handle.write(data)
    return file


def kubeconfig(data: bytes) -> None:
    file = _scratch_file("kubeconfig", data)
    try:
        target = from_kubeconfig(file)
    except CredentialsError as error:
        message = str(error)
        assert message and "\n" not in message.strip(), message
        return
    try:
        assert target.server and not target.server.endswith("/")
        assert target.server.startswith("https://") == (target.ssl_context is not None)
    finally:
        target.close()


def config(data: bytes) -> None:
    """The YAML file (raw bytes), then environment variables and ``--set`` flags, separated by
    ``\n---\n`` lines."""
    file_part, _, rest = data.partition(b"\n---\n")
    env_part, _, set_part = _text(b"\x00" + rest).partition("\n---\n")
    env = dict(line.partition("=")[::2] for line in env_part.splitlines() if "=" in line)
    overrides = dict(line.partition("=")[::2] for line in set_part.splitlines() if "=" in line)
    file = _scratch_file("config.yaml", file_part)
    try:
        built = build_config(load_file(file), file_name=file, env=env, overrides=overrides)
    except ConfigError as error:
        message = str(error)
        assert message and "\n" not in message.strip(), message
        return
    assert 0 <= built.listen.port <= 65535


TARGETS: dict[str, Callable[[bytes], None]] = {
    "path": path,
    "label_selector": label_selector,
    "field_selector": field_selector,
    "query": query,
    "request": request,
    "watch_event": watch_event,
    "kubeconfig": kubeconfig,
    "config": config,
}
