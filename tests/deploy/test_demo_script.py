"""scripts/demo.sh on an up-to-date venv: no pip, no network, nothing but the demo's own lines."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STAMP = ROOT / ".venv" / ".watchproxy-installed"


@pytest.mark.skipif(
    Path(sys.executable).parent != ROOT / ".venv" / "bin" or not STAMP.exists(),
    reason="the venv was not installed by scripts/venv.sh",
)
def test_the_demo_starts_offline_without_reinstalling(tmp_path: Path) -> None:
    # Every way pip could reach an index leads to a closed port: a pip run would fail loudly.
    dead = "http://127.0.0.1:9"
    env = {
        **os.environ,
        "PIP_INDEX_URL": f"{dead}/simple",
        "PIP_FIND_LINKS": "",
        "http_proxy": dead,
        "https_proxy": dead,
        "TMPDIR": str(tmp_path),
    }
    with subprocess.Popen(
        [str(ROOT / "scripts" / "demo.sh"), "--listen-port", "0", "--admin-port", "0"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    ) as demo:
        assert demo.stderr is not None
        lines = []
        try:
            for line in demo.stderr:
                lines.append(line)
                if "kubectl get pods -w -l app=web" in line or len(lines) > 100:
                    break
            demo.send_signal(signal.SIGTERM)
            assert demo.wait(timeout=20) == 0
        finally:
            if demo.poll() is None:
                demo.kill()
    text = "".join(lines)
    assert "watchproxy demo is running" in text, text
    assert not [line for line in lines if "pip" in line or "setuptools" in line], text
