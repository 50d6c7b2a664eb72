"""The container image, built and run as a sidecar runs it (slow: `pytest -m slow`).

scripts/image.sh builds the Dockerfile with buildah (chroot isolation) on a Debian bookworm base
made by mmdebstrap, and runs it as uid 65532 with a read-only root, the ServiceAccount files
mounted where in-cluster clients look, and KUBERNETES_SERVICE_HOST/PORT pointing at the fake
apiserver on loopback (TLS, bearer token). Needs root, buildah, podman and mmdebstrap.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from kubefake.server import FakeApiServer

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = str(ROOT / "scripts" / "image.sh")
PODS = "/api/v1/namespaces/default/pods"
SERVING = re.compile(
    r"serving the Kubernetes API on 127\.0\.0\.1:(\d+) .* admin on 127\.0\.0\.1:(\d+)"
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="buildah with chroot isolation needs root"),
    pytest.mark.skipif(
        not all(shutil.which(tool) for tool in ("buildah", "podman", "mmdebstrap")),
        reason="needs buildah, podman and mmdebstrap (apt-get install buildah podman mmdebstrap)",
    ),
]


def pod(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name}, "spec": {"containers": [{"name": "c", "image": "x"}]}}


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            parent = int(stat.rpartition(")")[2].split()[1])
            children.setdefault(parent, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def watchproxy_process(script_pid: int) -> int:
    for pid in descendants(script_pid):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        # The console script under the venv's interpreter: python /opt/venv/bin/watchproxy run
        if cmdline[0].startswith(b"/opt/venv/bin/python") and cmdline[1:3] == [
            b"/opt/venv/bin/watchproxy",
            b"run",
        ]:
            return pid
    raise AssertionError("no watchproxy process under the container")


def proc_view(pid: int) -> tuple[str, list[str]]:
    """A process's /proc status and its mount table, as the process sees them."""
    status = Path(f"/proc/{pid}/status").read_text()
    return status, Path(f"/proc/{pid}/mountinfo").read_text().splitlines()


@pytest.fixture(scope="module")
def image() -> str:
    built = subprocess.run(
        [SCRIPT, "build"], capture_output=True, text=True, timeout=1500, check=False
    )
    assert built.returncode == 0, built.stderr[-3000:]
    name, size, _ = built.stdout.split()
    print(f"\nimage {name}: {int(size) / 1e6:.1f} MB")
    return name


@pytest.mark.timeout(1800)
async def test_the_image_serves_as_a_sidecar_and_stops_on_sigterm(
    image: str, tmp_path: Path
) -> None:
    async with FakeApiServer(token="sa-token") as fake, aiohttp.ClientSession() as session:
        fake.store.create("pods", "default", pod("a"))
        sa = tmp_path / "serviceaccount"
        sa.mkdir(mode=0o755)
        (sa / "token").write_text("sa-token")
        (sa / "namespace").write_text("default")
        shutil.copy(fake.ca_path, sa / "ca.crt")
        for path in (sa, *sa.iterdir()):
            path.chmod(0o755 if path.is_dir() else 0o644)
        env = {
            **os.environ,
            "IMAGE": image,
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(fake.port),
        }
        args = ["--listen-port", "0", "--admin-host", "127.0.0.1", "--admin-port", "0"]
        container = await asyncio.create_subprocess_exec(
            SCRIPT, "run", str(sa), "--", "run", *args,
            env=env, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        assert container.stderr is not None
        log: list[str] = []
        try:
            async with asyncio.timeout(60):
                while not (match := SERVING.search(log[-1] if log else "")):
                    line = await container.stderr.readline()
                    assert line, "\n".join(log)
                    log.append(line.decode())
            api = f"http://127.0.0.1:{match.group(1)}"
            admin = f"http://127.0.0.1:{match.group(2)}"

            # As a sidecar: uid 65532, every directory of the image read-only (/tmp is an
            # emptyDir in the manifests, a fresh directory here).
            status, mounts = proc_view(watchproxy_process(container.pid))
            assert re.search(r"^Uid:\s+65532\s+65532", status, re.M), status
            for directory in ("/usr", "/etc", "/opt", "/var"):
                (entry,) = [m for m in mounts if m.split()[4] == directory]
                assert "ro" in entry.split()[5].split(","), entry

            # Ready once the first probe of the apiserver succeeded: bounded, 100 tries.
            for _ in range(100):
                async with session.get(admin + "/readyz") as response:
                    if response.status == 200:
                        break
                await asyncio.sleep(0.1)
            assert response.status == 200, await response.text()
            async with session.get(api + PODS) as response:
                assert response.status == 200
                listed = await response.json()
            assert [p["metadata"]["name"] for p in listed["items"]] == ["a"]

            # Two clients, one upstream watch, every event to both.
            url = f"{api}{PODS}?watch=true&resourceVersion={listed['metadata']['resourceVersion']}"
            first, second = await session.get(url), await session.get(url)
            assert (first.status, second.status) == (200, 200)
            await fake.stats.wait_until(lambda s: s.active_watches >= 1, within=10)
            fake.store.create("pods", "default", pod("b"))
            for response in (first, second):
                event = json.loads(await response.content.readline())
                assert (event["type"], event["object"]["metadata"]["name"]) == ("ADDED", "b")
            assert fake.stats.active_watches == 1

            async with session.get(admin + "/metrics") as response:
                metrics = await response.text()
            assert re.search(r"^watchproxy_shared_watches 1\.0$", metrics, re.M), metrics
            assert re.search(r"^watchproxy_upstream_up 1\.0$", metrics, re.M)

            # SIGTERM, as the kubelet sends it: open watches end cleanly, exit 0.
            container.send_signal(signal.SIGTERM)
            for response in (first, second):
                async with asyncio.timeout(15):
                    rest = await response.content.read()
                assert rest == b"", rest
                response.release()
            async with asyncio.timeout(30):
                tail = (await container.stderr.read()).decode()
                code = await container.wait()
            assert code == 0, "".join(log) + tail
            assert "stopped" in tail, tail
        finally:
            if container.returncode is None:
                # SIGTERM lets the script remove its working container; SIGKILL if it hangs.
                container.send_signal(signal.SIGTERM)
                try:
                    async with asyncio.timeout(30):
                        await container.wait()
                except TimeoutError:
                    os.killpg(container.pid, signal.SIGKILL)
                    await container.wait()
