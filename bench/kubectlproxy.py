"""Role: ``kubectl proxy`` in front of the fake apiserver, for side-by-side comparison.

Starts ``kubectl proxy --port=0`` with the fake's kubeconfig, answers ``{"port", "pid"}`` (the
orchestrator reads kubectl's own CPU from ``/proc/PID/stat``), and stops kubectl when stdin
closes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys

from bench.roles import emit, run, serve_commands


async def main() -> None:
    parser = argparse.ArgumentParser(prog="bench.kubectlproxy")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--kubectl", default="kubectl")
    args = parser.parse_args()
    process = await asyncio.create_subprocess_exec(
        args.kubectl,
        "proxy",
        "--port=0",
        f"--kubeconfig={args.kubeconfig}",
        stdout=asyncio.subprocess.PIPE,
        stderr=sys.stderr,
    )
    try:
        assert process.stdout is not None
        line = await asyncio.wait_for(process.stdout.readline(), 30)
        # "Starting to serve on 127.0.0.1:41235"
        if b"serve on" not in line:
            emit({"error": f"kubectl proxy said {line!r}"})
            return
        emit({"port": int(line.rsplit(b":", 1)[1]), "pid": process.pid})

        async def handle(words: list[str]) -> dict[str, object]:
            return {"error": f"unknown command {words[0]!r}"}

        await serve_commands(handle)
    finally:
        if process.returncode is None:
            process.terminate()
            try:
                await asyncio.wait_for(process.wait(), 5)
            except TimeoutError:
                process.kill()
                with contextlib.suppress(ProcessLookupError):
                    await process.wait()


if __name__ == "__main__":
    run(main)
