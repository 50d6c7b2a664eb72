"""What one update of a per-request series costs: watchproxy's lock-free loop series
(``watchproxy.metricsbase``) beside prometheus_client's own Counter and Histogram.

    .venv/bin/python -m bench.metricupdates [--number 200000] [--repeat 7]

Prints nanoseconds per update, the minimum over ``--repeat`` runs of ``--number`` updates each,
for the updates a proxied request makes: a counter's ``inc()`` and a histogram's ``observe()``,
each on a series already looked up (as ``Metrics.requests_by`` hands them out), and the lookup
plus update that ``Metrics.request_done`` does. Under a second per case.
"""

from __future__ import annotations

import argparse
import timeit
from collections.abc import Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from watchproxy.metricsbase import LATENCY_BUCKETS, LoopCounter, LoopHistogram


def cases(
    counter: Callable[..., Any], histogram: Callable[..., Any]
) -> dict[str, Callable[[], Any]]:
    registry = CollectorRegistry()
    requests = counter("b_requests", "help", ["verb", "code"], registry=registry)
    latency = histogram("b_seconds", "help", ["verb"], registry=registry, buckets=LATENCY_BUCKETS)
    series, timing = requests.labels("get", "200"), latency.labels("get")
    return {
        "counter inc()": series.inc,
        "histogram observe(0.003)": lambda: timing.observe(0.003),
        "histogram observe(7.0)": lambda: timing.observe(7.0),
        "labels() + inc()": lambda: requests.labels("get", "200").inc(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=7)
    a = parser.parse_args()
    builds = {
        "loop series": cases(LoopCounter, LoopHistogram),
        "prometheus_client": cases(Counter, Histogram),
    }
    print("| update | " + " | ".join(f"{name} (ns)" for name in builds) + " |")
    print("| --- |" + " --- |" * len(builds))
    for case in builds["loop series"]:
        cells = []
        for build in builds.values():
            best = min(timeit.repeat(build[case], number=a.number, repeat=a.repeat))
            cells.append(f"{best / a.number * 1e9:.0f}")
        print(f"| {case} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
