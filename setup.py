"""Compiles the per-request modules with mypyc when ``WATCHPROXY_COMPILE=1``; pure otherwise.

Everything else about the package is in ``pyproject.toml``. Why these modules: a busy
controller's requests spend most of the proxy's CPU in the Python of the request path (the API
port's protocol and handler, the upstream client, the limiter, the list-option parsers):
compiled, they cost about half the instructions a request that they cost as Python
(``bench/README.md``, "mypyc re-scoped after the rewrites" and "Instructions per request,
2026-12-07 (session 5)"). ``upstream/arrivals.py`` is left out: it holds the async generators
of an upstream answer's body, which mypyc does not compile. Each must stay compilable: ``python
-m tests.compiledtree`` builds them, and the suite's compiled tier runs against the result.
"""

import os

from setuptools import setup

# Kept in one place: tests/compiledtree.py and tests/unit/test_compiled.py read it from here.
COMPILED_MODULES = [
    "watchproxy/kube/fieldselectors.py",
    "watchproxy/kube/headers.py",
    "watchproxy/kube/selectors.py",
    "watchproxy/kube/watchquery.py",
    "watchproxy/lists/batch.py",
    "watchproxy/lists/consistent.py",
    "watchproxy/lists/cover.py",
    "watchproxy/metrics.py",
    "watchproxy/metricsbase.py",
    "watchproxy/policy/adaptive.py",
    "watchproxy/policy/clientlimits.py",
    "watchproxy/policy/fairqueue.py",
    "watchproxy/policy/ratelimit.py",
    "watchproxy/policy/retryafter.py",
    "watchproxy/policy/tokenbucket.py",
    "watchproxy/server/api.py",
    "watchproxy/server/clientgone.py",
    "watchproxy/server/deadlines.py",
    "watchproxy/server/http.py",
    "watchproxy/server/listener.py",
    "watchproxy/server/passthrough.py",
    "watchproxy/server/protocol.py",
    "watchproxy/server/routes.py",
    "watchproxy/upstream/client.py",
    "watchproxy/upstream/connection.py",
    "watchproxy/upstream/connectivity.py",
    "watchproxy/upstream/http1.py",
    "watchproxy/upstream/pool.py",
    "watchproxy/upstream/response.py",
    "watchproxy/upstream/target.py",
]

ext_modules = []
if os.environ.get("WATCHPROXY_COMPILE") == "1":
    from mypyc.build import mypycify

    ext_modules = mypycify(COMPILED_MODULES, opt_level="3")

setup(ext_modules=ext_modules)
