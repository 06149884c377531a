"""What EventBlock.merge (event_block.py) does besides ordering the keys: its blocks' kinds as
indices into one table, their key rows at one width, and where their sorted runs start. (The
blocks are typed Any: event_block.py imports this module.)"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["MERGED_RUNS", "joined_kinds", "run_starts", "widened"]

# More sorted runs than this are sorted by numpy (the merge loop scans every run's head per event).
MERGED_RUNS = 16


def joined_kinds(blocks: Sequence[Any]) -> tuple[npt.NDArray[np.int32], tuple[Any, ...]]:
    """The blocks' events' kinds, one after the other, as indices into one table (each kind
    once), and the table. The blocks a splice makes of one batch share their table (the same
    object): its indices are mapped once, and those of the first table are already the joined
    table's."""
    table: dict[Any, int] = {}
    remaps: dict[int, npt.NDArray[np.int32] | None] = {}  # by id of a table the blocks hold
    kinds = []
    for block in blocks:
        seen = id(block.kind_table)
        if seen not in remaps:
            remaps[seen] = _remap(table, block.kind_table)
        remap = remaps[seen]
        kinds.append(
            block.kinds.astype(np.int32, copy=False) if remap is None else remap[block.kinds]
        )
    return np.concatenate(kinds), tuple(table)


def _remap(table: dict[Any, int], kinds: tuple[Any, ...]) -> npt.NDArray[np.int32] | None:
    """Each of `kinds`' index in `table` (adding those it lacks); None where that is its own."""
    remap = np.fromiter(
        (table.setdefault(kind, len(table)) for kind in kinds), np.int32, len(kinds)
    )
    return None if np.array_equal(remap, np.arange(len(kinds))) else remap


def widened(keys: npt.NDArray[np.uint8], width: int) -> npt.NDArray[np.uint8]:
    """Key rows padded with zero bytes to `width` (see event_block.py's docstring)."""
    if keys.shape[1] == width:
        return keys
    out = np.zeros((len(keys), width), np.uint8)
    out[:, : keys.shape[1]] = keys
    return out


def run_starts(blocks: Sequence[Any]) -> list[int]:
    """Where each sorted run of the blocks' events starts, a run being blocks each of whose
    first key is at or past the last key before it."""
    starts, at = [0], 0
    for before, block in zip(blocks, blocks[1:], strict=False):
        at += len(before)
        if block.first_key < before.last_key:
            starts.append(at)
    return starts
