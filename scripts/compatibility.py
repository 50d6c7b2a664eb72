"""Write docs/compatibility.md from realapi test results: apiserver versions x clients x features.

Each run of the realapi tier on one kube-apiserver version leaves a JUnit XML file
(``pytest -m realapi tests/realapi --junitxml=FILE``); this script reads one per version and
fills the table from the tests that prove each row, so the page says what was run, not what
someone remembers:

    KUBETESTENV_VERSION=1.37 .venv/bin/pytest -n 3 -m realapi tests/realapi --junitxml=/tmp/r137.xml
    KUBETESTENV_VERSION=1.34 .venv/bin/pytest -n 3 -m realapi tests/realapi --junitxml=/tmp/r134.xml
    .venv/bin/python scripts/compatibility.py 1.37=/tmp/r137.xml 1.34=/tmp/r134.xml

The conformance tier's full run (Kubernetes' own e2e specs, direct and through watchproxy)
leaves a summary when asked to, which ``--conformance`` adds as a section of its own:

    CONFORMANCE=full CONFORMANCE_SUMMARY=/tmp/conformance.json \
        .venv/bin/pytest -n 0 tests/realapi/test_conformance.py
    .venv/bin/python scripts/compatibility.py 1.37=/tmp/r137.xml --conformance /tmp/conformance.json

or, to rewrite that section alone and keep the rest of the page,
``scripts/compatibility.py --conformance /tmp/conformance.json``.

A cell is ``pass`` when every test of its row passed on that version, ``FAIL`` when one failed,
``skipped`` when all were skipped (with the first reason), ``-`` when none ran.

With ``--merge``, a run of part of the tier (one new test module, say) updates only the rows
its tests prove: every other cell keeps what the page says, and the page says which rows came
from which partial run:

    KUBETESTENV_VERSION=1.37 .venv/bin/pytest -n 0 -m realapi tests/realapi/test_jvm_informers.py \
        --junitxml=/tmp/jvm137.xml
    .venv/bin/python scripts/compatibility.py --merge 1.37=/tmp/jvm137.xml
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent.parent / "docs" / "compatibility.md"


@dataclass(frozen=True)
class Row:
    client: str
    feature: str
    tests: tuple[str, ...]  # "module::name prefix": every test whose id starts with one


ROWS = (
    Row(
        "client-go v0.37.2 informers (WatchList)",
        "3 share one upstream watch, 1 joins it; record, end bookmark <= 1 s",
        ("test_watchlist_informers::test_watchlist_informers_share",),
    ),
    Row(
        "client-go v0.37.2 informers (WatchList)",
        "fall back to LIST + WATCH as direct when the apiserver refuses watch-lists",
        ("test_watchlist_fallback::",),
    ),
    Row(
        "client-go v0.37.2 informer (WatchList, gzip)",
        "quiet and busy collection: sync and each write as fast as direct (hub, pass-through)",
        ("test_informer_timing::",),
    ),
    Row(
        "client-go v0.34 informer (JSON, protobuf), Watch",
        "every change once across an outage / a compaction",
        ("test_real_clients::test_every_client_gets_every_change_once",),
    ),
    Row(
        "kube-rs watcher (with and without back-off)",
        "every change once across an outage / a compaction",
        ("test_real_clients::test_every_client_gets_every_change_once",),
    ),
    Row(
        "kube-rs 5.0 watcher, gzip feature on / off",
        "watch-list and LIST + WATCH: the record, direct and through the hub",
        ("test_kubers_gzip::",),
    ),
    Row(
        "kube-rs without back-off",
        "real apiserver restart: few reconnects, nothing lost",
        ("test_kubers_outage_real::",),
    ),
    Row(
        "@kubernetes/client-node informer",
        "every change once across an outage / a compaction",
        ("test_real_clients::test_every_client_gets_every_change_once",),
    ),
    Row(
        "Python: kubernetes, kubernetes_asyncio watch loops",
        "every change once, in order, direct and through watchproxy",
        ("test_python_watch_real::",),
    ),
    Row(
        "Python: kubernetes, kubernetes_asyncio",
        "LISTs in pages from the hub, one revision",
        ("test_list_batch::test_python_clients_list_in_pages",),
    ),
    Row("kubectl", "get -w (Table) as direct", ("test_real_apiserver::test_kubectl_get_watch",)),
    Row(
        "kubectl 1.37.2 (built from Go modules)",
        "apply (client- and server-side), diff, get, get -w, describe, label, delete as direct",
        ("test_kubectl_newest::",),
    ),
    Row(
        "kubectl 1.27 / 1.33 / 1.37",
        "exec refusals over SPDY and WebSocket as direct",
        ("test_upgrades::",),
    ),
    Row(
        "fabric8 kubernetes-client 7.9.0 informers, default config (WebSocket watches)",
        "10 in one program: sync, every change once and in order (per object)",
        (
            "test_jvm_informers::test_jvm_informers_sync_through_watchproxy[fabric8-default]",
            "test_jvm_informers::test_jvm_informers_get_every_change_once_in_order[fabric8-default]",
        ),
    ),
    Row(
        "fabric8 kubernetes-client 7.9.0 informers, default config (WebSocket watches)",
        "20 s outage: nothing lost, fewer upstream attempts than direct; one upstream watch",
        (
            "test_jvm_informers::test_jvm_informers_outage_costs_few_upstream_attempts[fabric8-default]",
            "test_jvm_informers::test_jvm_informers_of_one_program_share_one_upstream_watch[fabric8-default]",
        ),
    ),
    Row(
        "fabric8 kubernetes-client 7.9.0 informers, onlyHttpWatches",
        "10 in one program: sync, every change once and in order (per object)",
        (
            "test_jvm_informers::test_jvm_informers_sync_through_watchproxy[fabric8-http-only]",
            "test_jvm_informers::test_jvm_informers_get_every_change_once_in_order[fabric8-http-only]",
        ),
    ),
    Row(
        "fabric8 kubernetes-client 7.9.0 informers, onlyHttpWatches",
        "20 s outage: nothing lost, fewer upstream attempts than direct; one upstream watch",
        (
            "test_jvm_informers::test_jvm_informers_outage_costs_few_upstream_attempts[fabric8-http-only]",
            "test_jvm_informers::test_jvm_informers_of_one_program_share_one_upstream_watch[fabric8-http-only]",
        ),
    ),
    Row(
        "client-java 27.0.0 SharedInformerFactory informers",
        "10 in one program: sync, every change once and in order (per object)",
        (
            "test_jvm_informers::test_jvm_informers_sync_through_watchproxy[client-java]",
            "test_jvm_informers::test_jvm_informers_get_every_change_once_in_order[client-java]",
        ),
    ),
    Row(
        "client-java 27.0.0 SharedInformerFactory informers",
        "20 s outage: nothing lost, fewer upstream attempts than direct; one upstream watch",
        (
            "test_jvm_informers::test_jvm_informers_outage_costs_few_upstream_attempts[client-java]",
            "test_jvm_informers::test_jvm_informers_of_one_program_share_one_upstream_watch[client-java]",
        ),
    ),
    Row("HTTP", "request parity table (statuses as the apiserver's)", ("test_parity::",)),
    Row(
        "every client above, its default configuration",
        "each event through watchproxy <= 100 ms (p99) after direct, quiet and busy;"
        " watch-list sync <= 1 s",
        ("test_delivery_parity::",),
    ),
    Row(
        "HTTP",
        "watch, resume, bookmarks, sendInitialEvents as direct",
        (
            "test_real_apiserver::test_watch_matches_direct",
            "test_real_apiserver::test_resume_by_resource_version_matches_direct",
            "test_real_apiserver::test_bookmarks_are_valid_resume_points",
            "test_real_apiserver::test_send_initial_events_watch_list_matches_direct",
            "test_real_apiserver::test_a_later_watch_gets_the_initial_events",
        ),
    ),
    Row(
        "HTTP",
        'watch from "now" ("" or "0", with and without bookmarks) as the apiserver',
        ("test_watch_from_now::",),
    ),
    Row(
        "HTTP",
        "a watch from now joining a shared watch holds every earlier write",
        ("test_watch_from_now::test_a_watch_from_now_joining",),
    ),
    Row(
        "HTTP",
        "watch-list refusals (422) and forms: code and reason, hub and pass-through",
        ("test_parity::test_watch_list_refusals",),
    ),
    Row("HTTP", "protobuf watches and lists", ("test_protobuf::",)),
    Row(
        "WebSocket (fabric8's default watch)",
        "watch over WebSocket from the hub as direct: messages (JSON text, protobuf binary), "
        "close 1000 at timeoutSeconds, in-stream 410, handshake answers, ping and close",
        ("test_websocket_watch_real::",),
    ),
    Row(
        "HTTP",
        "CBOR lists and watches (CBORServingAndStorage on) as direct, beside shared JSON",
        ("test_cbor::test_cbor_lists_and_watches",),
    ),
    Row(
        "HTTP",
        "CBOR refused as direct (gate off, the default): 406, and 415 for a CBOR body",
        ("test_cbor::test_cbor_refusals",),
    ),
    Row(
        "HTTP",
        "Accept drop=metadata.managedFields as the apiserver (passed through)",
        ("test_cbor::test_a_managed_fields_drop",),
    ),
    Row(
        "HTTP",
        "gzip passes through byte for byte (LIST)",
        ("test_compression::test_passthrough_keeps_a_gzip_list",),
    ),
    Row(
        "HTTP",
        "gzip watch-list passes through, member by member",
        ("test_compression::test_passthrough_keeps_the_members",),
    ),
    Row(
        "HTTP",
        "gzip watch from the hub: encoding headers and events as the apiserver's",
        ("test_compression::test_the_hub_answers_gzip_watches",),
    ),
    Row(
        "HTTP",
        "no gzip for a client that does not ask (hub, pass-through)",
        ("test_compression::test_a_client_that_does_not_ask",),
    ),
    Row(
        "HTTP",
        "Table watch-list (default table convertor): bookmark and events as the apiserver's",
        ("test_table_bookmarks::",),
    ),
    Row("HTTP", "identical LISTs batched", ("test_list_batch::",)),
    Row("HTTP", "impersonation / forwarded identity", ("test_impersonation::",)),
)


@dataclass
class Outcome:
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    reason: str = ""


def results(path: Path) -> dict[str, str | tuple[str, str]]:
    """Test id ("module::name") -> "passed" / "failed" / ("skipped", reason)."""
    out: dict[str, str | tuple[str, str]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        module = case.get("classname", "").rsplit(".", 1)[-1]
        test_id = f"{module}::{case.get('name', '')}"
        if case.find("failure") is not None or case.find("error") is not None:
            out[test_id] = "failed"
        elif (skip := case.find("skipped")) is not None:
            out[test_id] = ("skipped", skip.get("message", ""))
        else:
            out[test_id] = "passed"
    return out


def cell(row: Row, run: dict[str, str | tuple[str, str]]) -> str:
    outcome = Outcome()
    for test_id, result in run.items():
        if not any(test_id.startswith(prefix) for prefix in row.tests):
            continue
        if result == "passed":
            outcome.passed += 1
        elif result == "failed":
            outcome.failed += 1
        else:
            outcome.skipped += 1
            outcome.reason = outcome.reason or result[1]
    if outcome.failed:
        return f"FAIL ({outcome.failed} of {outcome.passed + outcome.failed})"
    if outcome.passed:
        return "pass"
    if outcome.skipped:
        return f"skipped: {outcome.reason.removeprefix('Skipped: ')}"
    return "-"


def previous_cells(page: str) -> dict[tuple[str, str, str], str]:
    """(client, feature, version) -> cell, from a page this script wrote."""
    versions: list[str] = []
    cells: dict[tuple[str, str, str], str] = {}
    for line in page.splitlines():
        if line.startswith("| client | feature |"):
            versions = [c.strip().removeprefix("kube-apiserver ") for c in line.split("|")[3:-1]]
        elif line.startswith("| ") and versions and not line.startswith("| ---"):
            client, feature, *values = (c.strip() for c in line.split("|")[1:-1])
            for version, value in zip(versions, values, strict=False):
                cells[client, feature, version] = value
    return cells


CONFORMANCE_HEADING = "## Kubernetes' own conformance specs"


def render_conformance(summary: dict[str, Any]) -> list[str]:
    """The conformance section: counts direct and through watchproxy, and every spec that
    passed direct and not through watchproxy, with its reason."""
    lines = [
        CONFORMANCE_HEADING,
        "",
        f"The e2e specs of k8s.io/kubernetes {summary['kubernetes']} that need only an apiserver",
        "(`test/e2e/apimachinery`, `auth`, `instrumentation`), run by",
        "`tests/realapi/test_conformance.py` against kube-apiserver"
        f" {summary['kubernetes'].removeprefix('v')} (kubetestenv) straight and through",
        "watchproxy in its default configuration, side by side, each on an apiserver of its",
        f"own, with the same seed ({summary['seed']}): the {summary['mode']} set, {summary['date']}"
        + (" (`CONFORMANCE=full`)." if summary["mode"] == "full" else "."),
        "Left out are the specs that need a kubelet, a controller or a feature a default",
        "apiserver leaves off (`tests/conformance/specs.py` says which and why); skipped",
        "counts the specs that skipped themselves (a component they look for is absent).",
        "",
        "| run | passed | failed | skipped | wall time |",
        "| --- | --- | --- | --- | --- |",
    ]
    for key, label in (("direct", "direct"), ("watchproxy", "through watchproxy")):
        run = summary[key]
        lines.append(
            f"| {label} | {run['passed']} | {run['failed']} | {run['skipped']}"
            f" | {run['seconds'] // 60} min {run['seconds'] % 60} s |"
        )
    lines.append("")
    excused = summary["excused"]
    differences = summary["differences"]
    if not excused and not differences:
        lines.append("Every spec that passed direct passed through watchproxy.")
    else:
        lines.append(
            "Passed direct, failed through watchproxy (`specs.py` lists each with its reason):"
        )
        lines.append("")
        lines += [f"- {name}: {reason}" for name, reason in sorted(excused.items())]
        lines += [f"- {difference} (not listed: a bug)" for difference in differences]
    lines.append("")
    return lines


def replace_conformance(page: str, summary: dict[str, Any]) -> str:
    """``page`` with its conformance section (the page's last) replaced, or added at its end."""
    head, _, _ = page.partition(CONFORMANCE_HEADING)
    return head.rstrip("\n") + "\n\n" + "\n".join(render_conformance(summary))


def render(
    runs: dict[str, dict[str, str | tuple[str, str]]],
    when: str,
    previous: str | None = None,
    conformance: dict[str, Any] | None = None,
) -> str:
    """The page; with ``previous`` (the page as it was), rows that no test of ``runs`` proves
    keep their cells, its versions' columns stay, and its summary lines stay too; its
    conformance section stays unless ``conformance`` gives a new one."""
    kept_conformance: str | None = None
    if previous is not None and CONFORMANCE_HEADING in previous:
        previous, _, kept_section = previous.partition(CONFORMANCE_HEADING)
        previous = previous.rstrip("\n") + "\n"
        if conformance is None:
            kept_conformance = CONFORMANCE_HEADING + kept_section
    kept = previous_cells(previous) if previous is not None else {}
    versions = list(runs)
    for _client, _feature, version in kept:
        if version not in versions:
            versions.append(version)
    # A merge keeps the date of the whole tier's runs: its own date goes on its summary line.
    found = re.search(r"Runs of (.+?); kube-apiserver", previous or "")
    runs_of = found.group(1) if found is not None else when
    lines = [
        "# Compatibility",
        "",
        "Generated by `scripts/compatibility.py` from the realapi tier's JUnit results; do not",
        f"edit by hand. Runs of {runs_of}; kube-apiserver built from Go modules",
        "(`tests/realapi/build.sh`).",
        "The default test command runs the newest version; the others run with",
        '`KUBETESTENV_VERSIONS="1.37 1.34" scripts/test.sh` (docs/development.md says why).',
        "",
        "| client | feature | " + " | ".join(f"kube-apiserver {v}" for v in versions) + " |",
        "| --- | --- | " + " | ".join("---" for _ in versions) + " |",
    ]
    merged: list[str] = []
    for row in ROWS:
        values = []
        for version in versions:
            value = cell(row, runs[version]) if version in runs else "-"
            if previous is not None and value == "-":
                value = kept.get((row.client, row.feature, version), "-")
            elif previous is not None:
                merged.append(f"{row.client}: {row.feature}")
            values.append(value)
        lines.append(f"| {row.client} | {row.feature} | {' | '.join(values)} |")
    totals = []
    for version, run in runs.items():
        passed = sum(1 for r in run.values() if r == "passed")
        failed = sum(1 for r in run.values() if r == "failed")
        skipped = len(run) - passed - failed
        totals.append(f"{version}: {passed} passed, {failed} failed, {skipped} skipped")
    if previous is None:
        lines += ["", "Whole tier: " + "; ".join(totals) + ".", ""]
    else:
        # The summary lines of the page as it was (the whole tier's counts, earlier merges),
        # then this merge's: which rows it updated, from how many tests.
        summary = previous.split("\n\n")[-1].strip().splitlines() if previous.strip() else []
        summary = [line for line in summary if not line.startswith("|")]
        modules = sorted({test_id.partition("::")[0] for run in runs.values() for test_id in run})
        lines += ["", *summary]
        lines.append(
            f"Merged {when}: {len(set(merged))} rows from a run of {', '.join(modules)} alone"
            f" ({'; '.join(totals)})."
        )
        lines.append("")
    if conformance is not None:
        lines += render_conformance(conformance)
    elif kept_conformance is not None:
        lines += [*kept_conformance.rstrip("\n").split("\n"), ""]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "runs",
        nargs="*",
        help="VERSION=junit.xml, newest first; none: only the conformance section is rewritten",
    )
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--date", default=datetime.date.today().isoformat())
    parser.add_argument(
        "--merge",
        action="store_true",
        help="update only the rows the given runs prove; keep every other cell of --out",
    )
    parser.add_argument(
        "--conformance",
        type=Path,
        help="the summary of a conformance run (CONFORMANCE_SUMMARY)",
    )
    args = parser.parse_args(argv)
    if not args.runs:
        if args.conformance is None:
            parser.error("give VERSION=junit.xml runs, --conformance FILE, or both")
        summary = json.loads(args.conformance.read_text(encoding="utf-8"))
        page = replace_conformance(args.out.read_text(encoding="utf-8"), summary)
        args.out.write_text(page, encoding="utf-8")
        print(f"wrote the conformance section of {args.out}")
        return 0
    runs = {}
    for spec in args.runs:
        version, _, path = spec.partition("=")
        runs[version] = results(Path(path))
    previous = args.out.read_text(encoding="utf-8") if args.merge else None
    conformance = None
    if args.conformance is not None:
        conformance = json.loads(args.conformance.read_text(encoding="utf-8"))
    args.out.write_text(render(runs, args.date, previous, conformance), encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
