"""EventBlock.merge's kinds (buckets/_columnar/block_merge.py): however the blocks' kind tables
are shared (one splice's blocks hold one table object), equal or repeat kinds, the joined kinds
and table are those of mapping every block's table kind by kind."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from buckets._columnar.block_merge import joined_kinds

_KINDS = [("insert", "db", f"c{i}", (f"db.c{i}",), b"") for i in range(4)]


def _plain(blocks: list[Any]) -> tuple[np.ndarray, tuple[Any, ...]]:
    table: dict[Any, int] = {}
    kinds = []
    for block in blocks:
        remap = np.array([table.setdefault(kind, len(table)) for kind in block.kind_table])
        kinds.append(remap[block.kinds].astype(np.int32))
    return np.concatenate(kinds), tuple(table)


@st.composite
def _blocks(draw: st.DrawFn) -> list[Any]:
    tables = [
        tuple(draw(st.lists(st.sampled_from(_KINDS), min_size=1, max_size=5)))
        for _ in range(draw(st.integers(1, 3)))
    ]
    tables += [tuple(t) for t in tables]  # equal tables, other objects (tuple() of one is it)
    tables += [tuple(list(t)) for t in tables]
    out = []
    for _ in range(draw(st.integers(1, 6))):
        table = draw(st.sampled_from(tables))
        n = draw(st.integers(0, 8))
        kinds = draw(st.lists(st.integers(0, len(table) - 1), min_size=n, max_size=n))
        out.append(SimpleNamespace(kind_table=table, kinds=np.array(kinds, np.int32)))
    return out


@given(_blocks())
def test_joined_kinds_are_those_of_mapping_each_blocks_table(blocks: list[Any]) -> None:
    kinds, table = joined_kinds(blocks)
    want_kinds, want_table = _plain(blocks)
    assert table == want_table
    assert kinds.dtype == np.int32 and kinds.tolist() == want_kinds.tolist()
