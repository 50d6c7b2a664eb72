"""The command lines as a user runs them: every bad flag or path is one line and exit code 2."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

BIN = Path(sys.executable).parent
DEMO = [sys.executable, "-m", "kubefake.demo"]
# The installed scripts import the package from where PYTHONPATH says (a git worktree), as the
# tests themselves do, and not from where it was installed in editable mode.
SOURCE = {"PYTHONPATH": os.environ["PYTHONPATH"]} if "PYTHONPATH" in os.environ else {}


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run the installed ``watchproxy``, the demo (as scripts/demo.sh does) or ``python``."""
    if args[0] == "python":
        command = [sys.executable, *args[1:]]
    elif args[0] == "watchproxy-demo":
        command = [*DEMO, *args[1:]]
    else:
        command = [str(BIN / args[0]), *args[1:]]
    return subprocess.run(
        command,
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": "/nonexistent", **SOURCE, **(env or {})},
    )


def one_line_exit_2(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in lines[0]
    return lines[0]


def write_kubeconfig(tmp_path: Path, cluster: dict[str, object], user: dict[str, object]) -> str:
    path = tmp_path / "kubeconfig"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1", **cluster}}],
        "users": [{"name": "u", "user": user}],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path.write_text(yaml.safe_dump(doc), encoding="utf-8")
    return str(path)


@pytest.fixture
def busy_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_version() -> None:
    result = run("watchproxy", "--version")
    assert result.returncode == 0
    assert result.stdout.strip() == "watchproxy 0.2.0"


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--bogus"], "watchproxy run: unknown flag --bogus (see watchproxy run --help)"),
        (["run", "--bogus=1"], "watchproxy run: unknown flag --bogus (see watchproxy run --help)"),
        (
            ["check-config", "extra"],
            "watchproxy check-config: unexpected argument extra (see watchproxy check-config",
        ),
        (["run", "--listen-port"], "watchproxy run: argument --listen-port: expected one argument"),
        (["frobnicate"], "watchproxy: argument command: invalid choice: 'frobnicate'"),
        (
            ["kubeconfig", "--listen-port", "x"],
            "watchproxy kubeconfig: argument --listen-port: invalid int value: 'x'",
        ),
    ],
)
def test_argument_errors_are_one_line(args: list[str], expected: str) -> None:
    line = one_line_exit_2(run("watchproxy", *args))
    assert line.startswith(expected), line
    assert "--help" in line


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--listen-port", "99999"], "listen.port: must be a port number 0-65535, got 99999"),
        (["run", "--admin-port", "-1"], "admin.port: must be a port number 0-65535, got -1"),
    ],
)
def test_bad_port_flags(args: list[str], expected: str) -> None:
    assert expected in one_line_exit_2(run("watchproxy", *args))


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["--server", "foo"],
            "watchproxy kubeconfig: server 'foo' must be an absolute http:// or https:// URL",
        ),
        (
            ["--server", "http://127.0.0.1:8001/api"],
            "watchproxy kubeconfig: server 'http://127.0.0.1:8001/api' must be "
            "scheme://host[:port] with nothing after it",
        ),
        (
            ["--listen-port", "99999"],
            "watchproxy kubeconfig: --listen-port: must be a port number 1-65535, got 99999",
        ),
        (
            ["--namespace", "Not_A_Namespace"],
            "watchproxy kubeconfig: namespace 'Not_A_Namespace' is not a valid Kubernetes "
            "namespace name",
        ),
        (
            ["--token-file", "token"],
            "watchproxy kubeconfig: token file 'token' must be an absolute path",
        ),
    ],
)
def test_kubeconfig_command_bad_values(args: list[str], expected: str) -> None:
    assert one_line_exit_2(run("watchproxy", "kubeconfig", *args)) == expected


def test_kubeconfig_command_writes_a_token_file_user_for_forward_identity() -> None:
    """A node-local tenant under ``security.identity: forward`` presents its own token
    (docs/deploying.md): the kubeconfig's user reads the pod's ServiceAccount token file."""
    token = "/var/run/secrets/kubernetes.io/serviceaccount/token"
    server = "http://watchproxy.watchproxy-system.svc:8001"
    result = run("watchproxy", "kubeconfig", "--server", server, "--token-file", token)
    assert result.returncode == 0, result.stderr
    document = yaml.safe_load(result.stdout)
    assert document["users"] == [{"name": "watchproxy", "user": {"tokenFile": token}}]
    assert document["clusters"][0]["cluster"] == {"server": server}


def test_port_in_use_names_the_port(tmp_path: Path, busy_port: int) -> None:
    kubeconfig = write_kubeconfig(tmp_path, {}, {"token": "t"})
    common = ["run", "--kubeconfig", kubeconfig, "--admin-host", "127.0.0.1"]
    line = one_line_exit_2(
        run("watchproxy", *common, "--listen-port", str(busy_port), "--admin-port", "0")
    )
    assert line == f"watchproxy: cannot listen on 127.0.0.1:{busy_port}: address already in use"
    line = one_line_exit_2(
        run("watchproxy", *common, "--listen-port", "0", "--admin-port", str(busy_port))
    )
    assert line == f"watchproxy: cannot listen on 127.0.0.1:{busy_port}: address already in use"


@pytest.mark.parametrize(
    ("cluster", "user", "named"),
    [
        ({"certificate-authority": "/nonexistent/ca.crt"}, {}, "certificate-authority"),
        ({}, {"client-certificate": "missing.crt", "client-key": "k.key"}, "client-certificate"),
        ({}, {"tokenFile": "/nonexistent/token"}, "token file"),
    ],
)
def test_missing_credential_files_are_named(
    tmp_path: Path, cluster: dict[str, object], user: dict[str, object], named: str
) -> None:
    kubeconfig = write_kubeconfig(tmp_path, cluster, user)
    line = one_line_exit_2(run("watchproxy", "run", "--kubeconfig", kubeconfig))
    missing = next(
        str(v)
        for v in [*cluster.values(), *user.values()]
        if "missing" in str(v) or "/non" in str(v)
    )
    path = missing if os.path.isabs(missing) else str(tmp_path / missing)
    assert line.startswith("watchproxy: "), line
    assert named in line and path in line and "No such file or directory" in line, line


@pytest.mark.parametrize("rate", ["0", "-1", "inf", "nan"])
def test_demo_bad_rate(rate: str) -> None:
    line = one_line_exit_2(run("watchproxy-demo", "--rate", rate))
    assert line.startswith("watchproxy-demo: argument --rate: must be a number > 0"), line


def test_demo_without_its_extra_says_so_in_one_line() -> None:
    # A plain `pip install watchproxy` has no trustme: make its import fail as it would there.
    code = (
        "import sys; sys.modules['trustme'] = None; "
        "from kubefake.demo import main; sys.exit(main())"
    )
    line = one_line_exit_2(run("python", "-c", code))
    assert line == (
        "watchproxy-demo: the demo needs trustme (scripts/demo.sh installs it: "
        "pip install -e '.[demo]' in a checkout)"
    )


@pytest.mark.parametrize(
    ("cluster", "user", "expected"),
    [
        ({"certificate-authority-data": "bm90IGEgY2VydA=="}, {}, "certificate-authority-data"),
        ({}, {"client-certificate-data": "a2V5", "client-key-data": "a"}, "client-key-data: not"),
        ({}, {"client-certificate-data": "a2V5", "client-key-data": "a2V5"}, "client-certificate"),
    ],
)
def test_bad_inline_credentials_are_named(
    tmp_path: Path, cluster: dict[str, object], user: dict[str, object], expected: str
) -> None:
    kubeconfig = write_kubeconfig(tmp_path, cluster, user)
    line = one_line_exit_2(run("watchproxy", "run", "--kubeconfig", kubeconfig))
    assert line.startswith(f"watchproxy: kubeconfig {kubeconfig}: {expected}"), line


def test_demo_on_a_busy_port_says_so_in_one_line(busy_port: int) -> None:
    line = one_line_exit_2(run("watchproxy-demo", "--listen-port", str(busy_port)))
    assert line == (
        f"watchproxy-demo: cannot listen on 127.0.0.1:{busy_port}: address already in use "
        "(--listen-port/--admin-port choose others, 0 any free one)"
    )


@pytest.mark.parametrize("stop", [signal.SIGINT, signal.SIGTERM])
def test_demo_listens_on_loopback_and_leaves_no_temporary_directory(
    tmp_path: Path, stop: signal.Signals
) -> None:
    with subprocess.Popen(
        [*DEMO, "--listen-port", "0", "--admin-port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": "/nonexistent", "TMPDIR": str(tmp_path)},
    ) as demo:
        _stop_demo(demo, tmp_path, stop)
    assert list(tmp_path.iterdir()) == [], "the demo left files behind"


def _stop_demo(demo: subprocess.Popen[str], tmp_path: Path, stop: signal.Signals) -> None:
    try:
        assert demo.stderr is not None
        lines: list[str] = []
        for line in demo.stderr:  # the banner ends with the kubectl hints
            lines.append(line)
            if "kubectl get pods -w -l app=web" in line or len(lines) > 200:
                break
        banner = "".join(lines)
        kubeconfig = next(
            line.split("=", 1)[1].strip() for line in lines if "export KUBECONFIG=" in line
        )
        assert os.path.dirname(kubeconfig).startswith(str(tmp_path)), banner
        assert os.path.exists(kubeconfig)
        admin = next(line.split()[-1] for line in lines if "metrics:" in line)
        port = int(admin.rsplit(":", 1)[1].split("/")[0])
        assert ("0.0.0.0", port) not in listening_tcp(), "admin port open to the network"
        assert ("127.0.0.1", port) in listening_tcp()
        demo.send_signal(stop)
        assert demo.wait(timeout=15) == 0
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()


def listening_tcp() -> set[tuple[str, int]]:
    """(address, port) of every IPv4 TCP socket in LISTEN state, from /proc/net/tcp."""
    found = set()
    with open("/proc/net/tcp", encoding="ascii") as table:
        next(table)
        for row in table:
            local, state = row.split()[1], row.split()[3]
            if state == "0A":
                address, port = local.split(":")
                octets = [str(int(address[i : i + 2], 16)) for i in (6, 4, 2, 0)]
                found.add((".".join(octets), int(port, 16)))
    return found
