"""exec, attach, port-forward and ``logs -f`` through watchproxy to a real kubelet, with kubectl
1.37 (WebSocket) and kubectl 1.27 (SPDY, the oldest the suite has).

watchproxy runs in this process, in front of the node's apiserver (through the relay), with
the admin's credential as a sidecar would with its pod's; kubectl talks to it on loopback. The
apiserver relays each stream to the kubelet inside the node's namespace, which runs it in a
container of containerd.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import re
import secrets
import signal
import struct
import termios
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import (
    RunningProxy,
    kubectl,
    proxy_for_upstream,
    versioned_kubectl_or_skip,
)
from tests.realnode.cluster import KUBECTL, Cluster
from tests.realnode.node import Node

CLIENTS = [
    pytest.param(KUBECTL, {}, id="1.37-websocket"),
    pytest.param(27, {}, id="1.27-spdy"),
]
BLOB_BYTES = 4 * 1024 * 1024


def restricted(name: str, command: list[str], **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "automountServiceAccountToken": False,
            "terminationGracePeriodSeconds": 1,
            "restartPolicy": container.pop("restartPolicy", "Always"),
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": 1000,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [
                {
                    "name": name,
                    "image": "wprn-app:1",
                    "imagePullPolicy": "Never",
                    "command": command,
                    "securityContext": {
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                    },
                    **container,
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def pods(node: Node) -> Iterator[str]:
    """A namespace with the pods the streams reach; its name."""
    cluster = Cluster(node)
    namespace = f"st-{secrets.token_hex(3)}"
    cluster.create_namespace(namespace)
    web = (
        f"head -c {BLOB_BYTES} /dev/urandom > /tmp/blob && cd /tmp && "
        "exec python3 -m http.server 8080 --bind 127.0.0.1"
    )
    ticker = 'i=0; while true; do echo "tick $i"; i=$((i+1)); sleep 0.2; done'
    cluster.apply(
        [
            restricted("shell", ["sleep", "infinity"]),
            restricted("web", ["sh", "-c", web], ports=[{"containerPort": 8080}]),
            restricted("ticker", ["sh", "-c", ticker]),
        ],
        namespace=namespace,
    )
    cluster.kubectl(
        "wait", "-n", namespace, "--for=condition=Ready", "pod/shell", "pod/web", "pod/ticker",
        "--timeout=90s", timeout=95,
    )  # fmt: skip
    yield namespace
    cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@contextlib.asynccontextmanager
async def watchproxy(
    tmp_path: Path, node: Node, overrides: dict[str, Any] | None = None
) -> AsyncIterator[RunningProxy]:
    async with proxy_for_upstream(tmp_path, node.admin_kubeconfig, overrides) as running:
        yield running


def binary_of(client: str | int) -> str:
    return client if isinstance(client, str) else versioned_kubectl_or_skip(client)


@pytest.mark.parametrize(("client", "env"), CLIENTS)
async def test_exec_carries_stdin_the_exit_code_and_the_apiservers_and_kubelets_refusals(
    tmp_path: Path, node: Node, pods: str, client: str | int, env: dict[str, str]
) -> None:
    binary = binary_of(client)
    async with watchproxy(tmp_path, node) as proxy:
        run = ("exec", "-n", pods, "shell")
        data = b"".join(b"line %d of the client's stdin\n" % i for i in range(20000))
        code, out, err = await kubectl(
            proxy.kubeconfig, *run, "-i", "--", "sh", "-c", "cat; exit 3",
            stdin=data, binary=binary, env=env, timeout=60,
        )  # fmt: skip
        assert (code, out.encode()) == (3, data), err[-500:]
        assert "command terminated with exit code 3" in err
        # The apiserver's refusals reach kubectl through the proxy: no such container (the
        # upgrade's answer), no such pod (the GET kubectl sends first).
        code, _, err = await kubectl(
            proxy.kubeconfig, *run, "-c", "nope", "--", "true", binary=binary, env=env
        )
        assert code != 0 and "container nope is not valid for pod shell" in err, err
        code, _, err = await kubectl(
            proxy.kubeconfig, "exec", "-n", pods, "nope", "--", "true", binary=binary, env=env
        )
        assert code != 0 and 'pods "nope" not found' in err, err
        # The kubelet's, after the upgrade: its runtime cannot start the command (the error
        # channel's Status).
        code, _, err = await kubectl(
            proxy.kubeconfig, *run, "--", "/no/such/command", binary=binary, env=env
        )
        assert code != 0 and "no such file or directory" in err.lower(), err


@pytest.mark.parametrize(("client", "env"), CLIENTS)
async def test_exec_carries_a_large_output_whole(
    tmp_path: Path, node: Node, pods: str, client: str | int, env: dict[str, str]
) -> None:
    """400,000 lines (2.9 MB), three sessions: the bytes kubectl prints are the command's."""
    binary = binary_of(client)
    expected = "".join(f"{i}\n" for i in range(1, 400001))
    async with watchproxy(tmp_path, node) as proxy:
        for _ in range(3):
            code, out, err = await kubectl(
                proxy.kubeconfig, "exec", "-n", pods, "shell", "--", "seq", "1", "400000",
                binary=binary, env=env, timeout=60,
            )  # fmt: skip
            assert code == 0, err[-500:]
            assert len(out) == len(expected) and out == expected, (len(out), err[-300:])


@pytest.mark.slow
@pytest.mark.parametrize(("client", "env"), CLIENTS)
async def test_exec_large_outputs_stay_whole_over_many_sessions(
    tmp_path: Path, node: Node, pods: str, client: str | int, env: dict[str, str]
) -> None:
    """30 sessions of the 2.9 MB output (about 15 s per client), run on demand (``-m slow``):
    the loop that found the lost tails (8 of 57 sessions with kubectl 1.27 before the fix,
    docs/development.md, "The real-node tier"), kept to check the fix again."""
    binary = binary_of(client)
    expected = "".join(f"{i}\n" for i in range(1, 400001))
    cut = []
    async with watchproxy(tmp_path, node) as proxy:
        for session in range(30):
            code, out, err = await kubectl(
                proxy.kubeconfig, "exec", "-n", pods, "shell", "--", "seq", "1", "400000",
                binary=binary, env=env, timeout=60,
            )  # fmt: skip
            if code != 0 or out != expected:
                cut.append((session, code, len(out), err[-200:]))
    assert not cut, f"{len(cut)} of 30 sessions lost bytes: {cut}"


class Terminal:
    """A pseudo-terminal whose other side is a program's terminal (stdin, stdout, stderr):
    what the program writes is read here; its size is set as a terminal emulator sets it."""

    def __init__(self, rows: int, cols: int) -> None:
        self.master, self.slave = os.openpty()
        self.output = bytearray()
        self.closed = False
        self._changed = asyncio.Event()
        self.resize(rows, cols)
        os.set_blocking(self.master, False)
        asyncio.get_running_loop().add_reader(self.master, self._readable)

    def resize(self, rows: int, cols: int) -> None:
        fcntl.ioctl(self.master, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))

    def _readable(self) -> None:
        try:
            data = os.read(self.master, 65536)
        except BlockingIOError:
            return
        except OSError:  # EIO: the program's side is closed
            data = b""
        if not data:
            self.closed = True
            asyncio.get_running_loop().remove_reader(self.master)
        self.output += data
        self._changed.set()

    def sizes(self) -> list[tuple[int, int]]:
        """Every ``stty size`` line the program printed (rows, columns)."""
        found = re.findall(rb"(?m)^(\d+) (\d+)\r?$", bytes(self.output))
        return [(int(rows), int(cols)) for rows, cols in found]

    async def next_size(self, timeout: float) -> None:
        """Until the program prints one more size than now, or ``timeout`` seconds."""
        known = len(self.sizes())
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while len(self.sizes()) == known and not self.closed:
                    self._changed.clear()
                    await self._changed.wait()

    def handed_over(self) -> None:
        """The program has its side: ours is closed, so that its end closes the terminal."""
        if self.slave >= 0:
            os.close(self.slave)
            self.slave = -1

    def close(self) -> None:
        if not self.closed:
            asyncio.get_running_loop().remove_reader(self.master)
        os.close(self.master)
        self.handed_over()


@pytest.mark.parametrize(("client", "env"), CLIENTS)
async def test_exec_with_a_terminal_passes_its_new_size_to_the_container(
    tmp_path: Path, node: Node, pods: str, client: str | int, env: dict[str, str]
) -> None:
    """``kubectl exec -it`` in a terminal that is resized (SIGWINCH): the container's terminal
    takes the new size (kubectl 1.37: the resize channel of v5.channel.k8s.io over WebSocket;
    1.27: the resize stream over SPDY)."""
    binary = binary_of(client)
    # One `stty size` at the start, and one per line typed, until the terminal's end (^D).
    script = "stty size; while read -r line; do stty size; done; echo bye"
    async with watchproxy(tmp_path, node) as proxy:
        terminal = Terminal(24, 80)
        try:
            process = await asyncio.create_subprocess_exec(
                binary, "--kubeconfig", proxy.kubeconfig,
                "exec", "-it", "-n", pods, "shell", "--", "sh", "-c", script,
                stdin=terminal.slave, stdout=terminal.slave, stderr=terminal.slave,
                start_new_session=True, env={**os.environ, **env},
            )  # fmt: skip
            terminal.handed_over()
            try:
                # kubectl sends the terminal's size on the resize channel and the typed lines
                # on stdin: separate channels, no order between them (the first `stty size`
                # may run before the first size arrives). Type a line until the container
                # reports the size wanted.
                async def until_the_container_has(size: tuple[int, int]) -> None:
                    while size not in terminal.sizes():
                        assert not terminal.closed, terminal.output
                        os.write(terminal.master, b"\r")
                        await terminal.next_size(0.5)

                try:
                    async with asyncio.timeout(30):
                        await until_the_container_has((24, 80))
                        terminal.resize(40, 132)
                        os.kill(process.pid, signal.SIGWINCH)
                        await until_the_container_has((40, 132))
                        os.write(terminal.master, b"\x04")  # ^D: the shell's read ends
                        assert await process.wait() == 0, terminal.output
                except TimeoutError:
                    pytest.fail(f"the terminal showed: {bytes(terminal.output)!r}")
            finally:
                if process.returncode is None:
                    process.kill()
                    await process.wait()
        finally:
            terminal.close()
    sizes = terminal.sizes()
    # 24x80 until the resize, 40x132 from then on.
    first_new = sizes.index((40, 132))
    assert (24, 80) in sizes[:first_new] and set(sizes[first_new:]) == {(40, 132)}, sizes


@pytest.mark.parametrize(("client", "env"), CLIENTS)
async def test_attach_sends_stdin_to_the_running_process(
    tmp_path: Path, node: Node, pods: str, client: str | int, env: dict[str, str]
) -> None:
    binary = binary_of(client)
    cluster = Cluster(node)
    name = f"talker-{secrets.token_hex(2)}"
    # stdinOnce: the container's stdin closes when the attach session's does, so the process
    # ends and so does kubectl attach.
    script = 'while read -r line; do echo "got:$line"; done; echo "stdin closed"'
    cluster.apply(
        [restricted(name, ["sh", "-c", script], stdin=True, stdinOnce=True, restartPolicy="Never")],
        namespace=pods,
    )
    cluster.kubectl("wait", "-n", pods, "--for=condition=Ready", f"pod/{name}", "--timeout=60s")
    async with watchproxy(tmp_path, node) as proxy:
        code, out, err = await kubectl(
            proxy.kubeconfig, "attach", "-n", pods, name, "-i", "-c", name,
            stdin=b"alpha\nbeta\n", binary=binary, env=env, timeout=60,
        )  # fmt: skip
    assert code == 0, err[-500:]
    assert out.splitlines()[-3:] == ["got:alpha", "got:beta", "stdin closed"], (out, err)


@pytest.mark.parametrize(("client", "env"), CLIENTS)
async def test_port_forward_carries_a_large_download(
    tmp_path: Path, node: Node, pods: str, client: str | int, env: dict[str, str]
) -> None:
    binary = binary_of(client)
    cluster = Cluster(node)
    digest = cluster.kubectl("exec", "-n", pods, "web", "--", "sha256sum", "/tmp/blob").stdout
    async with watchproxy(tmp_path, node) as proxy:
        process = await asyncio.create_subprocess_exec(
            binary, "--kubeconfig", proxy.kubeconfig,
            "port-forward", "-n", pods, "pod/web", ":8080",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, **env},
        )  # fmt: skip
        try:
            assert process.stdout is not None
            line = await asyncio.wait_for(process.stdout.readline(), 20)
            found = re.search(rb"127\.0\.0\.1:(\d+)", line)
            assert found, line
            url = f"http://127.0.0.1:{int(found.group(1))}/blob"
            for _ in range(2):  # two connections over the same forwarding session
                body = await asyncio.to_thread(
                    lambda: urllib.request.urlopen(url, timeout=30).read()
                )
                assert len(body) == BLOB_BYTES
                assert hashlib.sha256(body).hexdigest() == digest.split()[0].decode()
        finally:
            process.terminate()
            await asyncio.wait_for(process.wait(), 10)


@pytest.mark.parametrize(("client", "env"), CLIENTS)
async def test_logs_follow_streams_new_lines_as_the_container_writes_them(
    tmp_path: Path, node: Node, pods: str, client: str | int, env: dict[str, str]
) -> None:
    binary = binary_of(client)
    async with watchproxy(tmp_path, node) as proxy:
        process = await asyncio.create_subprocess_exec(
            binary, "--kubeconfig", proxy.kubeconfig,
            "logs", "-f", "--tail=1", "-n", pods, "ticker",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        try:
            assert process.stdout is not None
            ticks = []
            async with asyncio.timeout(20):
                while len(ticks) < 6:
                    line = await process.stdout.readline()
                    assert line, "logs -f ended"
                    ticks.append(int(line.split()[1]))
            # Consecutive lines, each delivered as the container wrote it (0.2 s apart).
            assert ticks == list(range(ticks[0], ticks[0] + 6))
        finally:
            process.terminate()
            await asyncio.wait_for(process.wait(), 10)


@pytest.mark.parametrize(("client", "env"), CLIENTS)
async def test_read_only_mode_refuses_exec_attach_and_port_forward_before_the_kubelet(
    tmp_path: Path, node: Node, pods: str, client: str | int, env: dict[str, str]
) -> None:
    binary = binary_of(client)
    async with watchproxy(tmp_path, node, {"security.read_only": True}) as proxy:
        code, out, err = await kubectl(
            proxy.kubeconfig, "exec", "-n", pods, "shell", "--", "echo", "ran",
            binary=binary, env=env,
        )  # fmt: skip
        assert code != 0 and "ran" not in out
        assert "forbidden" in err.lower() or "read-only" in err.lower(), err
        for refused in (
            ("attach", "-n", pods, "ticker"),
            ("port-forward", "-n", pods, "pod/web", ":8080"),
        ):
            code, out, err = await kubectl(
                proxy.kubeconfig, *refused, binary=binary, env=env, timeout=20
            )
            assert code != 0 and "tick" not in out and "Forwarding" not in out, (refused, out)
            assert "forbidden" in err.lower() or "read-only" in err.lower(), (refused, err)
        # Reading stays open: the logs still come through.
        code, out, err = await kubectl(
            proxy.kubeconfig, "logs", "--tail=1", "-n", pods, "ticker", binary=binary
        )
        assert code == 0 and out.startswith("tick "), err
