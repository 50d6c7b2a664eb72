"""Configuration: precedence, validation, and the one-line exit-2 errors of the CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest

from watchproxy.config import ConfigError, build_config, load_file


def test_example_config_is_the_defaults() -> None:
    assert build_config(load_file("config.example.yaml")) == build_config({})


def test_flags_beat_env_beat_file() -> None:
    file_data = {"listen": {"port": 1111}, "hub": {"linger_seconds": 3}}
    env = {"WATCHPROXY_LISTEN_PORT": "2222", "WATCHPROXY_HUB_LINGER_SECONDS": "4"}
    config = build_config(file_data, env=env, overrides={"listen.port": "3333"})
    assert config.listen.port == 3333
    assert config.hub.linger_seconds == 4.0


def test_env_parses_types_and_lists() -> None:
    env = {
        "WATCHPROXY_HUB_ENABLED": "false",
        "WATCHPROXY_LISTEN_ALLOWED_HOSTS": "localhost,proxy.local",
        "WATCHPROXY_LOGGING_JSON": "1",
    }
    config = build_config({}, env=env)
    assert config.hub.enabled is False
    assert config.listen.allowed_hosts == ("localhost", "proxy.local")
    assert config.logging.json is True


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"listen": {"port": "eighty"}}, "c.yaml: listen.port: expected an integer"),
        ({"listen": {"prot": 1}}, "c.yaml: listen.prot: unknown key"),
        ({"lisen": {}}, "c.yaml: lisen: unknown section"),
        ({"hub": {"enabled": "yes"}}, "c.yaml: hub.enabled: expected true or false"),
        ({"backoff": {"jitter": "lots"}}, "c.yaml: backoff.jitter: must be one of"),
        ({"backoff": {"initial_seconds": 0}}, "backoff.initial_seconds: must be > 0"),
        ({"listen": {"host": "0.0.0.0"}}, "listen.host: '0.0.0.0' is not a loopback address"),
        ({"listen": {"port": 70000}}, "listen.port: must be a port number"),
        ({"security": {"rules": [{"action": "drop", "path": "/"}]}}, "rules[0].action"),
        ({"security": {"rules": [{"action": "deny"}]}}, "rules[0].path: required key"),
        ({"listen": []}, "c.yaml: listen: expected a mapping"),
        ({"ratelimit": {"qps": -1}}, "ratelimit.qps: must be >= 0"),
    ],
)
def test_bad_config_names_the_key(data: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config(data, file_name="c.yaml")
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_unknown_env_key_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"WATCHPROXY_LISTEN_PROT: unknown key listen\.prot"):
        build_config({}, env={"WATCHPROXY_LISTEN_PROT": "1"})


def _run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "watchproxy", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin"},
    )


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ("listen:\n  port: abc\n", "listen.port: expected an integer, got 'abc'"),
        ("listen:\n  colour: blue\n", "listen.colour: unknown key"),
        ("listen: [1\n", "invalid YAML"),
    ],
)
def test_cli_bad_config_file_exits_2_with_one_line(
    tmp_path: object, content: str, expected: str
) -> None:
    path = f"{tmp_path}/bad.yaml"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(content)
    result = _run_cli("run", "--config", path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert path in lines[0] and expected in lines[0]


def test_cli_missing_config_file_exits_2() -> None:
    result = _run_cli("--config", "/nonexistent/watchproxy.yaml")
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "watchproxy: /nonexistent/watchproxy.yaml: config file not found"
    )


def test_cli_bad_flag_value_exits_2() -> None:
    result = _run_cli("run", "--set", "hub.history_size=many")
    assert result.returncode == 2
    assert "flag hub.history_size: expected an integer" in result.stderr


def test_cli_missing_kubeconfig_exits_2() -> None:
    result = _run_cli("run", "--kubeconfig", "/nonexistent/kubeconfig", "--listen-port", "0")
    assert result.returncode == 2
    assert "cannot read kubeconfig /nonexistent/kubeconfig" in result.stderr
