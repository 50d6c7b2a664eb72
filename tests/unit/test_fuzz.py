"""The fuzz targets of tests/fuzz/targets.py, a short run each: the inputs that once were findings,
then a few hundred generated ones. ``scripts/fuzz.sh`` runs each under atheris to 1,000,000."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fuzz.targets import TARGETS

# Inputs the fuzzers found problems with (now fixed), and ones that reach deep branches. The first
# byte picks the decoding where a target reads text (odd: UTF-8, even: Latin-1).
SEEDS: dict[str, list[bytes]] = {
    "path": [b"\x00/version/", b"\x00/api//", b"\x01/api/v1/namespaces/caf%C3%A9/pods/"],
    "label_selector": [b"\x00a notin ()", b"\x00in in (in,,)", b"\x00!a,b>1,c=="],
    "field_selector": [b"\x00metadata.name=a\\,b,,", b"\x00=x", b"\x00a\\"],
    "query": [
        b"\x00watch=1&continue=x",
        b"\x00watch=maybe&timeoutSeconds=-5&limit=%2B1",
        b"\x00labelSelector=a%20in%20(&fieldSelector=a",
    ],
    "request": [
        b"\x00\x00/api/v1/namespaces/default/secrets/?watch=1",
        b"\x03\x00/apis/?limit=x",
        b"\x05\x00/api/v1/namespaces/default/configmaps?labelSelector=!",
    ],
    "watch_event": [
        b"[" * 100_000,
        b'{"type":"BOOKMARK","object":{"metadata":{"resourceVersion":5}}}',
        b'{"type":"ERROR","object":{"code":true}}',
        b"\xff\xfe",
    ],
    "kubeconfig": [
        b"\xb1",  # not UTF-8: was a UnicodeDecodeError
        b"contexts: 5\ncurrent-context: x\n",
        b"a: 2001-13-99\n",  # a YAML timestamp that is no date: was a ValueError
        b"[" * 5000,  # deeper than the YAML parser's recursion: was a RecursionError
        b"current-context: c\ncontexts: [{name: c, context: {cluster: k}}]\n"
        b"clusters: [{name: k, cluster: {server: 'https://x', certificate-authority-data: '%%'}}]",
    ],
    "config": [
        b"\xb1",  # not UTF-8: was a UnicodeDecodeError
        b"listen: {port: 99999}",
        b"limits: 2001-13-99",  # was a ValueError
        b"[" * 5000,  # was a RecursionError
        b"hub: {}\n---\nWATCHPROXY_HUB_LINGER_SECONDS=x\n---\nlisten.port=1e9",
    ],
}


@pytest.mark.parametrize(
    ("name", "data"),
    [(name, data) for name, seeds in SEEDS.items() for data in seeds],
    ids=[f"{name}-{i}" for name, seeds in SEEDS.items() for i in range(len(seeds))],
)
def test_seed(name: str, data: bytes) -> None:
    TARGETS[name](data)


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_every_target_has_seeds(name: str) -> None:
    assert SEEDS.get(name)


def _short_run(name: str) -> None:
    @settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow], deadline=None)
    @given(st.binary(max_size=400))
    def run(data: bytes) -> None:
        TARGETS[name](data)

    run()


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_generated_inputs(name: str) -> None:
    _short_run(name)
