"""Run the conformance program (``tests/conformance/bin/conformance``) against one apiserver
without blocking the event loop that may be serving watchproxy meanwhile."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import BinaryIO

from tests.conformance.results import Run, read_report
from tests.conformance.specs import Selection


class RunFailed(RuntimeError):
    """The program ended without a report (it could not start, or was killed)."""


def command(
    binary: Path,
    kubeconfig: str,
    selection: Selection,
    *,
    seed: int,
    report: Path,
    timeout: float,
    kubectl: str = "kubectl",
) -> list[str]:
    return [
        str(binary),
        f"-kubeconfig={kubeconfig}",
        # A few specs (CustomResourcePublishOpenAPI) run kubectl create, apply and explain.
        f"-kubectl-path={kubectl}",
        f"-report={report}",
        f"-ginkgo.focus={selection.focus}",
        f"-ginkgo.skip={selection.skip}",
        f"-ginkgo.seed={seed}",
        # The whole run's bound; each spec keeps the framework's own timeouts within it.
        f"-ginkgo.timeout={int(timeout)}s",
        "-ginkgo.no-color",
    ]


async def run_specs(
    binary: Path,
    kubeconfig: str,
    selection: Selection,
    *,
    seed: int,
    out_dir: Path,
    timeout: float,
    kubectl: str = "kubectl",
) -> Run:
    """Run the selected specs against the apiserver ``kubeconfig`` names; ginkgo's output goes
    to ``out_dir/output.log``, the report to ``out_dir/report.json``. A run in which specs
    failed is a result, not an error; a run that leaves no report raises :class:`RunFailed`."""
    report = out_dir / "report.json"
    log_path = out_dir / "output.log"
    argv = command(
        binary, kubeconfig, selection, seed=seed, report=report, timeout=timeout, kubectl=kubectl
    )
    with open_log(log_path) as log:
        process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=log,
            stderr=asyncio.subprocess.STDOUT,
            cwd=out_dir,
        )
        try:
            # ginkgo's own timeout ends the run first and still writes the report; this
            # bound is for a program that hangs anyway.
            async with asyncio.timeout(timeout + 60):
                await process.wait()
        finally:
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
    return finished(binary, process.returncode, report, log_path)


def open_log(path: Path) -> BinaryIO:
    path.parent.mkdir(parents=True, exist_ok=True)
    return open(path, "wb")


def finished(binary: Path, returncode: int | None, report: Path, log_path: Path) -> Run:
    """The run's report; a run that left none raises :class:`RunFailed`."""
    if not report.exists():
        tail = log_path.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise RunFailed(
            f"{binary.name} exited with {returncode} and no report; {log_path} ends:\n{tail}"
        )
    return read_report(report)
