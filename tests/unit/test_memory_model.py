"""The memory model: budgets derived from the container's memory limit, or a refusal to start
with one line when the configured ones exceed it (cgroup v2 and v1 files read as they are)."""

from __future__ import annotations

import pytest

from watchproxy.config import ConfigError, build_config
from watchproxy.config.build import memory_budgets
from watchproxy.config.memory import (
    BASE_BYTES,
    BUDGETS,
    MIB,
    container_limit,
    describe,
    parse_limit,
)


def files(mapping: dict[str, str]) -> object:
    return lambda path: mapping.get(path)


def model_bytes(config: object) -> float:
    """What the model says the process holds at most with these budgets."""
    total = float(BASE_BYTES)
    for budget in BUDGETS:
        section, key = budget.key.split(".")
        total += budget.factor * getattr(getattr(config, section), key)
    return total


def test_cgroup_v2_limit_is_read_and_max_means_none() -> None:
    v2 = "/sys/fs/cgroup/memory.max"
    assert container_limit(files({v2: "268435456\n"})) == 256 * MIB  # type: ignore[arg-type]
    assert container_limit(files({v2: "max\n"})) is None  # type: ignore[arg-type]


def test_cgroup_v1_limit_is_read_and_its_unlimited_value_means_none() -> None:
    v1 = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
    assert container_limit(files({v1: "536870912\n"})) == 512 * MIB  # type: ignore[arg-type]
    assert container_limit(files({v1: "9223372036854771712\n"})) is None  # type: ignore[arg-type]
    assert container_limit(files({})) is None  # type: ignore[arg-type]
    assert parse_limit("garbage") is None


@pytest.mark.parametrize("limit_mib", [128, 256, 512, 2048])
def test_unset_budgets_are_derived_so_that_the_model_fits_the_limit(limit_mib: int) -> None:
    config = build_config({}, memory_limit=limit_mib * MIB)
    assert model_bytes(config) <= limit_mib * MIB
    assert model_bytes(config) > 0.95 * limit_mib * MIB  # and uses what there is
    assert config.hub.cache_max_bytes > config.hub.history_max_bytes > 0


def test_the_shipped_sidecar_budgets_fit_its_limit_and_the_rest_is_derived() -> None:
    sidecar = {"hub": {"cache_max_bytes": 96 * MIB, "history_max_bytes": 32 * MIB}}
    config = build_config(sidecar, memory_limit=256 * MIB)
    assert (config.hub.cache_max_bytes, config.hub.history_max_bytes) == (96 * MIB, 32 * MIB)
    assert 8 * MIB < config.limits.max_buffered_list_bytes < 32 * MIB
    assert model_bytes(config) <= 256 * MIB


def test_configured_budgets_over_the_limit_refuse_to_start_in_one_line_naming_them() -> None:
    data = {"hub": {"cache_max_bytes": 512 * MIB}}
    with pytest.raises(ConfigError) as raised:
        build_config(data, file_name="w.yaml", memory_limit=256 * MIB)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("w.yaml: ")
    assert "hub.cache_max_bytes=536870912" in message and "256 MiB" in message


def test_without_a_limit_the_defaults_stand() -> None:
    assert build_config({}, memory_limit=None) == build_config({})


def test_the_start_up_line_names_the_limit_read_and_every_budget_in_force() -> None:
    sidecar = {"hub": {"cache_max_bytes": 96 * MIB, "history_max_bytes": 32 * MIB}}
    config = build_config(sidecar, memory_limit=256 * MIB)
    line = describe(256 * MIB, memory_budgets(config))
    assert line.startswith("memory: container limit 256 MiB; budgets ")
    assert "hub.cache_max_bytes=96.0 MiB" in line and "hub.history_max_bytes=32.0 MiB" in line
    list_mib = config.limits.max_buffered_list_bytes / MIB
    assert f"limits.max_buffered_list_bytes={list_mib:.1f} MiB" in line
    assert "\n" not in line
    unbounded = build_config({"hub": {"cache_max_bytes": 0}})
    line = describe(None, memory_budgets(unbounded))
    assert line.startswith("memory: no container memory limit found; budgets ")
    assert "hub.cache_max_bytes=unbounded" in line
