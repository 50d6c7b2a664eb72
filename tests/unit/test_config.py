"""Configuration: precedence, validation, and the one-line exit-2 errors of the CLI."""

from __future__ import annotations

import subprocess
import sys

import pytest

from watchproxy.config import ConfigError, build_config, load_file, read_env


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
        ({"security": {"rules": [{"path": "/"}]}}, "rules[0].action: required key"),
        ({"security": {"rules": [{"action": "deny", "path": "api"}]}}, "rules[0].path: must"),
        ({"security": {"rules": [{"action": "deny", "verb": ["get"]}]}}, "rules[0].verb: unknown"),
        (
            {"security": {"rules": [{"action": "deny", "verbs": ["get", "wacth"]}]}},
            "security.rules[0].verbs[1]: unknown verb 'wacth'",
        ),
        (
            {"security": {"rules": [{"action": "deny", "resources": ["Secrets"]}]}},
            "security.rules[0].resources[0]: expected 'pods', 'pods/exec', '*/scale' or '*'",
        ),
        (
            {"security": {"rules": [{"action": "deny", "resources": ["pods/*"]}]}},
            "security.rules[0].resources[0]: expected",
        ),
        (
            {"security": {"rules": [{"action": "allow", "api_groups": ["Apps"]}]}},
            "security.rules[0].api_groups[0]: expected",
        ),
        (
            {"security": {"rules": [{"action": "allow", "namespaces": ["a/b"]}]}},
            "security.rules[0].namespaces[0]: expected",
        ),
        (
            {"security": {"rules": [{"action": "allow", "methods": ["GET /x"]}]}},
            "security.rules[0].methods[0]: not an HTTP method",
        ),
        ({"security": {"rules": [{"action": "deny", "verbs": "get"}]}}, "verbs: expected a list"),
        ({"listen": []}, "c.yaml: listen: expected a mapping"),
        ({"ratelimit": {"qps": -1}}, "ratelimit.qps: must be >= 0"),
        ({"hub": {"fanout_cpu_share": 0}}, "hub.fanout_cpu_share: must be > 0 and <= 1"),
        ({"hub": {"fanout_cpu_share": 1.5}}, "hub.fanout_cpu_share: must be > 0 and <= 1"),
        ({"hub": {"fanout_max_delay_seconds": -1}}, "hub.fanout_max_delay_seconds: must be >= 0"),
        (
            {"limits": {"max_buffered_body_bytes": 1024}},
            "limits.max_buffered_body_bytes: must be 0 (no bound) or at least limits.max_body",
        ),
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
        (
            "security:\n  rules:\n    - {action: deny, verbs: [craete]}\n",
            "security.rules[0].verbs[0]: unknown verb 'craete'",
        ),
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


# --- Kubernetes service links ------------------------------------------------------------------
# What the kubelet puts into every container of the namespace (pkg/kubelet/envvars) for a Service
# named "watchproxy" with ports 8001/TCP "api" and 8081/TCP "admin", ClusterIP 10.96.0.12.
SERVICE_LINKS_WATCHPROXY = {
    "WATCHPROXY_SERVICE_HOST": "10.96.0.12",
    "WATCHPROXY_SERVICE_PORT": "8001",
    "WATCHPROXY_SERVICE_PORT_API": "8001",
    "WATCHPROXY_SERVICE_PORT_ADMIN": "8081",
    "WATCHPROXY_PORT": "tcp://10.96.0.12:8001",
    "WATCHPROXY_PORT_8001_TCP": "tcp://10.96.0.12:8001",
    "WATCHPROXY_PORT_8001_TCP_PROTO": "tcp",
    "WATCHPROXY_PORT_8001_TCP_PORT": "8001",
    "WATCHPROXY_PORT_8001_TCP_ADDR": "10.96.0.12",
    "WATCHPROXY_PORT_8081_TCP": "tcp://10.96.0.12:8081",
    "WATCHPROXY_PORT_8081_TCP_PROTO": "tcp",
    "WATCHPROXY_PORT_8081_TCP_PORT": "8081",
    "WATCHPROXY_PORT_8081_TCP_ADDR": "10.96.0.12",
}
# A Service "watchproxy-admin" (one unnamed UDP port, IPv6 ClusterIP): its "_PORT" variable has
# the very name of the admin.port setting, with a URL for a value.
SERVICE_LINKS_WATCHPROXY_ADMIN = {
    "WATCHPROXY_ADMIN_SERVICE_HOST": "fd00::12",
    "WATCHPROXY_ADMIN_SERVICE_PORT": "9000",
    "WATCHPROXY_ADMIN_PORT": "udp://[fd00::12]:9000",
    "WATCHPROXY_ADMIN_PORT_9000_UDP": "udp://[fd00::12]:9000",
    "WATCHPROXY_ADMIN_PORT_9000_UDP_PROTO": "udp",
    "WATCHPROXY_ADMIN_PORT_9000_UDP_PORT": "9000",
    "WATCHPROXY_ADMIN_PORT_9000_UDP_ADDR": "fd00::12",
}
# A Service "watchproxy-hub-metrics" (SCTP): names under a section that has no such keys.
SERVICE_LINKS_WATCHPROXY_HUB_METRICS = {
    "WATCHPROXY_HUB_METRICS_SERVICE_HOST": "10.96.0.13",
    "WATCHPROXY_HUB_METRICS_SERVICE_PORT": "7000",
    "WATCHPROXY_HUB_METRICS_SERVICE_PORT_SCRAPE_HTTP": "7000",
    "WATCHPROXY_HUB_METRICS_PORT": "sctp://10.96.0.13:7000",
    "WATCHPROXY_HUB_METRICS_PORT_7000_SCTP": "sctp://10.96.0.13:7000",
    "WATCHPROXY_HUB_METRICS_PORT_7000_SCTP_PROTO": "sctp",
    "WATCHPROXY_HUB_METRICS_PORT_7000_SCTP_PORT": "7000",
    "WATCHPROXY_HUB_METRICS_PORT_7000_SCTP_ADDR": "10.96.0.13",
}
ALL_SERVICE_LINKS = {
    **SERVICE_LINKS_WATCHPROXY,
    **SERVICE_LINKS_WATCHPROXY_ADMIN,
    **SERVICE_LINKS_WATCHPROXY_HUB_METRICS,
}


def test_service_link_variables_are_ignored() -> None:
    env = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", **ALL_SERVICE_LINKS}
    assert build_config({}, env=env) == build_config({})
    assert read_env(env).ignored == tuple(sorted(ALL_SERVICE_LINKS))


def test_settings_still_apply_beside_service_links() -> None:
    env = {
        **ALL_SERVICE_LINKS,
        "WATCHPROXY_HUB_LINGER_SECONDS": "7",
        "WATCHPROXY_LISTEN_PORT": "9001",
    }
    config = build_config({}, env=env)
    assert config.hub.linger_seconds == 7.0
    assert config.listen.port == 9001
    assert config.admin.port == 8081  # WATCHPROXY_ADMIN_PORT=udp://... is a link, not a port


def test_admin_port_setting_with_a_number_is_a_setting() -> None:
    assert build_config({}, env={"WATCHPROXY_ADMIN_PORT": "9090"}).admin.port == 9090


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("WATCHPROXY_FOO_BAR", "environment WATCHPROXY_FOO_BAR: unknown section 'foo'"),
        ("WATCHPROXY_HUB_LINGER_SECOND", "environment WATCHPROXY_HUB_LINGER_SECOND: unknown key"),
        ("WATCHPROXY_SERVICE_HOSTS", "unknown section 'service'"),
        ("WATCHPROXY_PORT_80_HTTP", "unknown section 'port'"),
        ("WATCHPROXY_PORT_X_TCP_ADDR", "unknown section 'port'"),
    ],
)
def test_other_watchproxy_variables_are_refused(name: str, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        build_config({}, env={name: "1"})
    assert message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_cli_starts_config_check_with_service_links(tmp_path: object) -> None:
    env = {**ALL_SERVICE_LINKS, "KUBECONFIG": _kubeconfig(tmp_path)}
    result = _run_cli_env(env, "check-config")
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    (line,) = result.stdout.splitlines()
    assert line.startswith("watchproxy: config ok")
    assert f"{len(ALL_SERVICE_LINKS)} Kubernetes service-link variables ignored" in line


def test_check_config_refuses_a_bad_setting_with_one_line(tmp_path: object) -> None:
    path = f"{tmp_path}/c.yaml"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("hub:\n  linger_seconds: 3\n")
    env = {"WATCHPROXY_CONFIG": path, "WATCHPROXY_BACKOFF_JITTER": "lots"}
    result = _run_cli_env(env, "check-config", "--listen-port", "8002")
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.strip() == (
        "watchproxy: environment WATCHPROXY_BACKOFF_JITTER: must be one of proportional, full, "
        "none, got 'lots'"
    )


def test_check_config_checks_flags_and_file(tmp_path: object) -> None:
    path = f"{tmp_path}/c.yaml"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("hub:\n  linger_seconds: 3\n")
    kubeconfig = {"KUBECONFIG": _kubeconfig(tmp_path)}
    good = _run_cli_env(kubeconfig, "check-config", "--config", path, "--set", "hub.enabled=false")
    assert good.returncode == 0, good.stderr
    assert good.stdout.strip() == f"watchproxy: config ok ({path}, 1 flag setting)"
    bad = _run_cli_env(kubeconfig, "check-config", "--config", path, "--listen-port", "99999")
    assert bad.returncode == 2
    assert bad.stderr.strip() == (
        f"watchproxy: {path}: listen.port: must be a port number 0-65535, got 99999"
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--listen-port", "8005", "--admin-port", "8005"],
            "watchproxy: config: admin.port: 8005 is also listen.port on an overlapping address; "
            "the API and the admin endpoints need a port each",
        ),
        (
            ["--kubeconfig", "/nonexistent/kubeconfig"],
            "watchproxy: cannot read kubeconfig /nonexistent/kubeconfig: No such file or directory",
        ),
        (["--context", "elsewhere"], "watchproxy: kubeconfig {path}: no context named 'elsewhere'"),
    ],
)
def test_check_config_refuses_what_run_refuses(
    tmp_path: object, args: list[str], expected: str
) -> None:
    """check-config and run agree: each refusal is one line and exit 2 from both."""
    path = _kubeconfig(tmp_path)
    for command in ("check-config", "run"):
        result = _run_cli_env({"KUBECONFIG": path}, command, *args)
        assert (result.returncode, result.stdout) == (2, ""), (command, result.stderr)
        assert result.stderr.strip() == expected.format(path=path), command


def test_different_hosts_may_share_a_port_number(tmp_path: object) -> None:
    env = {"KUBECONFIG": _kubeconfig(tmp_path)}
    args = ["--listen-port", "8005", "--admin-port", "8005", "--admin-host", "127.0.0.2"]
    result = _run_cli_env(env, "check-config", *args)
    assert result.returncode == 0, result.stderr


def _kubeconfig(tmp_path: object) -> str:
    path = f"{tmp_path}/kubeconfig"
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(
            "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
            "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
            "users: [{name: u, user: {token: t}}]\n"
            "contexts: [{name: x, context: {cluster: c, user: u}}]\n"
        )
    return path


def _run_cli_env(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "watchproxy", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", **env},
    )
