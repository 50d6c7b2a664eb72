"""setuptools' build backend, plus mypy when the build compiles (``WATCHPROXY_COMPILE=1``).

A plain ``pip install .`` or ``pip install -e .`` builds pure Python and needs nothing but
setuptools. With ``WATCHPROXY_COMPILE=1`` (the container image sets it), ``setup.py`` compiles
the modules every proxied request runs through with mypyc, which needs mypy (and a C compiler)
at build time only: the compiled modules import nothing that the pure ones do not. mypyc
type-checks what it compiles, so the build also needs the runtime dependencies (their types)
and the stubs the type check uses; set ``PIP_CONSTRAINT`` to build against the versions that
will run.
"""

from __future__ import annotations

import os
import tomllib

from setuptools import build_meta as _setuptools
from setuptools.build_meta import *  # noqa: F403  (the hooks this backend does not change)

# mypyc's output is C that this exact version generates and checks: pinned, like a compiler.
MYPYC_REQUIREMENT = "mypy==2.4.1"
STUBS = ["types-PyYAML"]


def _dependencies() -> list[str]:
    with open("pyproject.toml", "rb") as project:
        dependencies: list[str] = tomllib.load(project)["project"]["dependencies"]
    return dependencies


def _requires(hook, config_settings):  # type: ignore[no-untyped-def]
    """setuptools' requirements (it runs setup.py to find them, before mypy is installed: so
    without compiling), plus mypy when this build compiles."""
    compiling = os.environ.pop("WATCHPROXY_COMPILE", None)
    try:
        requires = hook(config_settings)
    finally:
        if compiling is not None:
            os.environ["WATCHPROXY_COMPILE"] = compiling
    if compiling != "1":
        return requires
    return [*requires, MYPYC_REQUIREMENT, *STUBS, *_dependencies()]


def get_requires_for_build_wheel(config_settings=None):  # type: ignore[no-untyped-def]
    return _requires(_setuptools.get_requires_for_build_wheel, config_settings)


def get_requires_for_build_editable(config_settings=None):  # type: ignore[no-untyped-def]
    return _requires(_setuptools.get_requires_for_build_editable, config_settings)
