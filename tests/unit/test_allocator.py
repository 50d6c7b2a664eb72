"""The allocator setting the command line applies (watchproxy/allocator.py says why)."""

from __future__ import annotations

import platform

import pytest

from watchproxy.allocator import fix_mmap_threshold


def test_the_mmap_threshold_is_pinned_on_glibc() -> None:
    libc, _version = platform.libc_ver()
    if libc != "glibc":
        pytest.skip(f"no glibc here ({libc or 'unknown'}): nothing to pin")
    assert fix_mmap_threshold() is True
