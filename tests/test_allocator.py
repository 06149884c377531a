"""The malloc settings of the proxy's processes (buckets/_columnar/allocator.py)."""

from __future__ import annotations

import platform

import pyarrow as pa
import pytest

from buckets._columnar.allocator import keep_large_allocations


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's settings are glibc's")
def test_glibc_keeps_large_allocations_unless_the_environment_says_otherwise(monkeypatch) -> None:
    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    before = pa.default_memory_pool()
    try:
        assert keep_large_allocations() is True
        # Arrow's arrays go through that malloc too (its own pool returns freed pages to the
        # system).
        assert pa.default_memory_pool().backend_name == "system"
    finally:
        pa.set_memory_pool(before)
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")  # the user's own choice stands
    assert keep_large_allocations() is False
