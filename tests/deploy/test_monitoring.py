"""The Grafana dashboard and the alerts in deploy/monitoring, against a real watchproxy.

- Every metric the dashboard and the alerts name is exported by a running watchproxy (scraped
  from `/metrics`: watchproxy's own and its process_* metrics), or listed in PLANNED below
  under the name the code will give it.
- The alert rules pass `promtool check rules` and the unit tests in prometheus/alerts_test.yaml.
- The alerts are evaluated on real scrapes: a healthy proxy fires nothing; a proxy whose
  apiserver went away fires exactly WatchproxyUpstreamDown, after 5 minutes.
- Every dashboard query parses as PromQL (promtool checks them as recording rules).
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import uvloop
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.deploy.test_deploy import DEPLOY
from tests.deploy.tools import require_tool
from tests.harness import running_proxy, wait_for

MONITORING = DEPLOY / "monitoring"
RULES = MONITORING / "prometheusrule.yaml"
DASHBOARD = MONITORING / "watchproxy-dashboard.json"
UNIT_TESTS = Path(__file__).parent / "prometheus" / "alerts_test.yaml"

# Metrics the dashboard or the alerts use before watchproxy exports them, under the name and
# type the code is to give them: {"watchproxy_example_bytes": "gauge"}. Each one leaves this
# list when watchproxy/metrics.py adds it (test_planned_metrics_are_not_exported_yet says when).
PLANNED: dict[str, str] = {}

# What a PodMonitor scrape adds to every series (the alerts group by these).
TARGET_LABELS = {"namespace": "demo", "pod": "demo-0"}
# Words in PromQL that are not metric names (keywords; function names are followed by "(").
PROMQL_KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool"}
PROMQL_KEYWORDS |= {"and", "or", "unless", "offset", "inf", "nan"}

Scrapes = dict[str, str]


# --------------------------------------------------------------------------------------------
# A real watchproxy, scraped healthy and during an outage


async def _scrape_scenarios() -> Scrapes:
    with tempfile.TemporaryDirectory() as tmp:
        overrides = {"backoff.initial_seconds": 0.05}
        async with running_proxy(tmp, overrides) as running, aiohttp.ClientSession() as session:

            async def get(url: str) -> str:
                async with session.get(url) as response:
                    assert response.status == 200, url
                    return await response.text()

            # Some traffic, so that the labelled metrics have series.
            await get(f"{running.url}/api/v1/namespaces/default/pods")
            await get(f"{running.url}/api/v1/namespaces/default/pods?watch=1&timeoutSeconds=1")
            healthy = await get(f"{running.admin_url}/metrics")
            await running.fake.faults.outage("refuse")
            # A request that fails upstream is what tells the proxy (besides its prober).
            async with session.get(f"{running.url}/api/v1/namespaces/default/pods") as response:
                await response.read()
            proxy = running.proxy
            await wait_for(lambda: not proxy.connectivity.up, what="the outage to be seen")
            outage = await get(f"{running.admin_url}/metrics")
            await running.fake.faults.recover()
    return {"healthy": healthy, "outage": outage}


@functools.cache
def scrapes() -> Scrapes:
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_scrape_scenarios())


def exported_types(exposition: str) -> dict[str, str]:
    """Metric family -> type, from the `# TYPE` lines (present even before a first sample)."""
    types = {}
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", exposition, flags=re.MULTILINE):
        if kind == "counter":
            name = name.removesuffix("_total")
        if not (name.endswith("_created") and kind == "gauge"):
            types[name] = kind
    return types


def sample_names(family: str, kind: str) -> set[str]:
    """The series names a family of this type puts in an exposition."""
    if kind == "counter":
        return {f"{family}_total", f"{family}_created"}
    if kind == "histogram":
        return {f"{family}_bucket", f"{family}_sum", f"{family}_count", f"{family}_created"}
    if kind == "summary":
        return {family, f"{family}_sum", f"{family}_count", f"{family}_created"}
    return {family}


def known_series_names() -> dict[str, str]:
    """Every series name the dashboard and alerts may use -> 'exported' or 'planned'."""
    known = {}
    for family, kind in PLANNED.items():
        known |= dict.fromkeys(sample_names(family, kind), "planned")
    for family, kind in exported_types(scrapes()["healthy"]).items():
        known |= dict.fromkeys(sample_names(family, kind), "exported")
    return known


# --------------------------------------------------------------------------------------------
# PromQL, just enough to find metric names


def metric_names(expr: str) -> set[str]:
    """The metric names an expression selects (not labels, functions, keywords)."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    expr = re.sub(r"\{[^}]*\}", " ", expr)  # label matchers
    expr = re.sub(r"\[[^\]]*\]", " ", expr)  # range and subquery durations
    expr = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", expr)
    expr = re.sub(r"(?<![A-Za-z0-9_:])[0-9][A-Za-z0-9_.]*", " ", expr)  # numbers, durations
    names = set()
    for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*", expr):
        if expr[match.end() :].lstrip().startswith("("):
            continue  # a function or an aggregation
        if match.group(0).lower() not in PROMQL_KEYWORDS:
            names.add(match.group(0))
    return names


def test_metric_names_finds_metrics_only() -> None:
    expr = (
        'sum by (namespace, pod) (rate(a_total{x="b_c", y=~"$pod"}[$__rate_interval])) '
        "/ on (pod) group_left (z) max without (le) (c_bucket offset 5m) > bool 0.5 "
        "and d unless histogram_quantile(0.99, e[5m:1m])"
    )
    assert metric_names(expr) == {"a_total", "c_bucket", "d", "e"}


def rule_groups() -> list[dict[str, Any]]:
    (rule,) = yaml.safe_load_all(RULES.read_text(encoding="utf-8"))
    groups: list[dict[str, Any]] = rule["spec"]["groups"]
    return groups


def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    return loaded


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, expr) for every panel target."""
    return [
        (panel["title"], target["expr"])
        for panel in dashboard()["panels"]
        for target in panel.get("targets", [])
    ]


def variable_selectors() -> list[tuple[str, str]]:
    """(variable, the metric selector of its label_values query)."""
    found = []
    for variable in dashboard()["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]["query"]
            match = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", query)
            assert match, f"${variable['name']}: {query}"
            found.append((variable["name"], match.group(1)))
    return found


def every_expression() -> list[tuple[str, str]]:
    rules = [
        (rule.get("alert") or rule["record"], rule["expr"])
        for group in rule_groups()
        for rule in group["rules"]
    ]
    return rules + dashboard_queries() + variable_selectors()


def test_every_metric_used_is_exported_or_planned() -> None:
    known = known_series_names()
    used: dict[str, set[str]] = {}
    for where, expr in every_expression():
        for name in metric_names(expr):
            assert name in known, f"{where}: {name} is neither exported nor in PLANNED"
            used.setdefault(name, set()).add(where)
    # What is planned is planned for a reason: something uses it.
    for family, kind in PLANNED.items():
        assert sample_names(family, kind) & used.keys(), f"{family} is planned but unused"


def test_planned_metrics_are_not_exported_yet() -> None:
    """When watchproxy exports one, it leaves PLANNED (with the type the queries assume)."""
    exported = exported_types(scrapes()["healthy"])
    for family, kind in PLANNED.items():
        assert family not in exported, (
            f"{family} is exported now ({exported[family]}, planned {kind}): remove it from "
            "PLANNED in tests/deploy/test_monitoring.py"
        )


# --------------------------------------------------------------------------------------------
# The alerts, with promtool


def write_rules(directory: Path, groups: list[dict[str, Any]] | None = None) -> Path:
    path = directory / "watchproxy-rules.yaml"
    path.write_text(yaml.safe_dump({"groups": groups or rule_groups()}, sort_keys=False))
    return path


def promtool(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [require_tool("promtool"), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
    )


def test_alert_rules_have_what_the_operator_and_runbooks_need() -> None:
    (rule,) = yaml.safe_load_all(RULES.read_text(encoding="utf-8"))
    assert rule["apiVersion"] == "monitoring.coreos.com/v1" and rule["kind"] == "PrometheusRule"
    alerts = [r for group in rule_groups() for r in group["rules"]]
    names = [a["alert"] for a in alerts]
    assert len(set(names)) == len(names)
    for alert in alerts:
        assert re.fullmatch(r"Watchproxy[A-Za-z]+", alert["alert"])
        assert alert["labels"]["severity"] in ("critical", "warning", "info")
        assert {"summary", "description"} <= alert["annotations"].keys()
        assert re.fullmatch(r"[0-9]+[smh]", alert.get("for", "0s"))
    docs = (DEPLOY.parent / "docs" / "deploying.md").read_text(encoding="utf-8")
    for name in names:
        assert name in docs, f"docs/deploying.md does not explain {name}"


def test_alert_rules_pass_promtool_check(tmp_path: Path) -> None:
    result = promtool("check", "rules", str(write_rules(tmp_path)))
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_unit_tests_pass(tmp_path: Path) -> None:
    write_rules(tmp_path)
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    result = promtool("test", "rules", UNIT_TESTS.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def series_selector(name: str, labels: dict[str, str]) -> str:
    def escape(value: str) -> str:
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    pairs = ", ".join(f'{k}="{escape(v)}"' for k, v in sorted(labels.items()))
    return f"{name}{{{pairs}}}"


def held_for(exposition: str, minutes: int) -> list[dict[str, str]]:
    """promtool input series: every sample of a scrape, unchanged for `minutes` minutes."""
    series = []
    for family in text_string_to_metric_families(exposition):
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            labels = {**sample.labels, **TARGET_LABELS}
            series.append(
                {
                    "series": series_selector(sample.name, labels),
                    # Fixed-point: promtool's series notation reads "1e-05x30" badly.
                    "values": f"{sample.value:f}x{minutes}",
                }
            )
    return series


@pytest.mark.parametrize(
    ("scenario", "firing"),
    [("healthy", []), ("outage", ["WatchproxyUpstreamDown"])],
)
def test_alerts_on_real_scrapes(tmp_path: Path, scenario: str, firing: list[str]) -> None:
    exposition = scrapes()[scenario]
    expected = [
        {
            "labels": series_selector(
                "ALERTS",
                {"alertname": name, "alertstate": "firing", "severity": "warning", **TARGET_LABELS},
            ),
            "value": 1,
        }
        for name in firing
    ]
    tests = {
        "rule_files": [write_rules(tmp_path).name],
        "evaluation_interval": "1m",
        "tests": [
            {
                "name": f"{scenario} watchproxy, as scraped, for 30 minutes",
                "interval": "1m",
                "input_series": held_for(exposition, 30),
                "promql_expr_test": [
                    {"expr": 'ALERTS{alertstate="firing"}', "eval_time": "4m", "exp_samples": []},
                    {
                        "expr": 'ALERTS{alertstate="firing"}',
                        "eval_time": "30m",
                        "exp_samples": expected,
                    },
                ],
            }
        ],
    }
    (tmp_path / "scrape_test.yaml").write_text(yaml.safe_dump(tests, sort_keys=False))
    result = promtool("test", "rules", "scrape_test.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


# --------------------------------------------------------------------------------------------
# The dashboard


def test_dashboard_queries_parse_as_promql(tmp_path: Path) -> None:
    """Grafana's variables replaced by what they stand for, each query checked by promtool."""
    substitutions = {"$__rate_interval": "2m", "$namespace": ".*", "$pod": ".*"}
    rules = []
    for index, (title, expr) in enumerate(dashboard_queries()):
        for variable, value in substitutions.items():
            expr = expr.replace(variable, value)
        assert "$" not in expr, f"{title}: unknown variable in {expr}"
        rules.append({"record": f"dashboard:query_{index}", "expr": expr})
    path = write_rules(tmp_path, [{"name": "dashboard", "rules": rules}])
    result = promtool("check", "rules", str(path))
    assert result.returncode == 0, result.stdout + result.stderr


def test_dashboard_is_importable_and_laid_out() -> None:
    board = dashboard()
    assert board["uid"] == "watchproxy" and board["title"]
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [panel["id"] for panel in board["panels"]]
    assert len(set(ids)) == len(ids)
    occupied: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        cells = {
            (x, y)
            for x in range(pos["x"], pos["x"] + pos["w"])
            for y in range(pos["y"], pos["y"] + pos["h"])
        }
        assert not cells & occupied, f"{panel['title']} overlaps another panel"
        occupied |= cells
        if panel["type"] == "row":
            continue
        assert panel.get("description"), f"{panel['title']} says what it shows"
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        for target in panel["targets"]:
            assert target["datasource"] == panel["datasource"]
            assert 'namespace=~"$namespace", pod=~"$pod"' in target["expr"], panel["title"]
