"""watchproxy-demo: its outage schedule, and a run with an outage as a new user would see it."""

from __future__ import annotations

import asyncio
import re
import signal
import sys
import time

import aiohttp
import pytest

from kubefake.outages import Outage, check_schedule, parse_duration, parse_outage

DEMO = [sys.executable, "-m", "kubefake.demo"]  # what scripts/demo.sh runs


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("30s", 30), ("90", 90), ("1.5m", 90), ("1m30s", 90), ("2h", 7200), ("0.5s", 0.5)],
)
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "s", "30x", "-5s", "1m-3s", "soon"])
def test_bad_durations(text: str) -> None:
    with pytest.raises(ValueError, match="is not a duration"):
        parse_duration(text)


def test_outage_is_duration_at_start() -> None:
    assert parse_outage("30s@60s") == Outage(start=60, duration=30)
    assert parse_outage("1m@0") == Outage(start=0, duration=60)
    with pytest.raises(ValueError, match="DURATION@START"):
        parse_outage("30s")
    with pytest.raises(ValueError, match="must be > 0"):
        parse_outage("0s@10s")


def test_schedule_is_sorted_and_refuses_overlaps() -> None:
    late, early = Outage(100, 10), Outage(10, 20)
    assert check_schedule([late, early]) == [early, late]
    with pytest.raises(ValueError, match="outages overlap: 20s@10s and 10s@25s"):
        check_schedule([early, Outage(25, 10)])


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--outage", "30s"], "argument --outage: '30s' must be DURATION@START"),
        (["--outage", "10s@5s", "--outage", "10s@10s"], "argument --outage: outages overlap"),
        (["--outage-mode", "flaky"], "argument --outage-mode: invalid choice: 'flaky'"),
    ],
)
def test_bad_outage_flags_are_one_line(args: list[str], expected: str) -> None:
    import subprocess

    result = subprocess.run([*DEMO, *args], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    (line,) = result.stderr.splitlines()
    assert line.startswith(f"watchproxy-demo: {expected}"), line


async def test_demo_outage_is_announced_and_seen_in_the_metrics() -> None:
    process = await asyncio.create_subprocess_exec(
        *DEMO, "--listen-port", "0", "--admin-host", "127.0.0.1", "--admin-port", "0",
        "--log-level", "warning", "--rate", "5", "--outage", "2s@1s",
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    assert process.stderr is not None
    lines: list[str] = []

    async def line_matching(pattern: str, timeout: float = 20) -> re.Match[str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            raw = await asyncio.wait_for(process.stderr.readline(), deadline - time.monotonic())
            if not raw:
                break
            lines.append(raw.decode().rstrip())
            found = re.search(pattern, lines[-1])
            if found:
                return found
        raise AssertionError(f"no line matching {pattern!r} in:\n" + "\n".join(lines))

    async def upstream_up(session: aiohttp.ClientSession, metrics: str) -> float:
        async with session.get(metrics) as response:
            text = await response.text()
        (value,) = re.findall(r"^watchproxy_upstream_up (\S+)$", text, re.M)
        return float(value)

    try:
        api = (await line_matching(r"proxy API:\s+(\S+)"))[1]
        metrics = (await line_matching(r"metrics:\s+(\S+/metrics)"))[1]
        await line_matching(r"outages \(refuse\):\s+2s at 1s after start")
        async with aiohttp.ClientSession() as session:
            # A client watch through the proxy, so that the outage cuts something.
            watch = asyncio.ensure_future(
                session.get(f"{api}/api/v1/namespaces/default/pods?watch=true")
            )
            down = await line_matching(r"apiserver DOWN for 2s \(connections refused\): (.*)")
            assert "/debug/watches" in down[1] and "watchproxy_upstream_up" in down[1]
            deadline = time.monotonic() + 10
            while await upstream_up(session, metrics) != 0:
                assert time.monotonic() < deadline, "the proxy never saw the outage"
                await asyncio.sleep(0.1)
            await line_matching(r"apiserver back")
            deadline = time.monotonic() + 15
            while await upstream_up(session, metrics) != 1:
                assert time.monotonic() < deadline, "the proxy never saw the recovery"
                await asyncio.sleep(0.1)
            response = await watch
            assert response.status == 200
            response.close()
        process.send_signal(signal.SIGINT)
        assert await asyncio.wait_for(process.wait(), 15) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert not [line for line in lines if "Traceback" in line], lines
