"""Pieces of a wire message that are not plain bytes: a part whose bytes are made as it is
sent, and a run of documents that writes itself into a BSON array. `mongoformats.wire` joins
and sends them; the engine's columnar blocks implement them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

__all__ = ["ArrayRun", "DeferredPiece", "joined"]


class DeferredPiece:
    """A piece of a message whose bytes are made as it is sent: a getMore reply's batch of
    events, gathered from the blocks they lie in (the engine's columnar event blocks).

    Why: a batch of megabytes gathered whole is written to memory once and read back by the
    socket's copy, past every cache; gathered a few hundred KB at a time into a buffer the
    sender reuses (`pieces`), each part is still in the cache when the kernel copies it. A
    sender that needs the whole message (compressed, over TLS) takes `materialize()`, and
    `joined` joins a list of pieces that may hold deferred ones."""

    __slots__ = ()

    def __len__(self) -> int:
        raise NotImplementedError

    def pieces(self, scratch: Any) -> Iterator[bytes | memoryview]:
        """The piece's bytes, in order, made one part at a time into `scratch` (a writable
        buffer, such as a bytearray, that the caller reuses): each part must be sent before the
        next is asked for."""
        raise NotImplementedError

    def materialize(self) -> bytes | memoryview:
        """The piece's bytes, all of them."""
        raise NotImplementedError

    def __bytes__(self) -> bytes:
        return bytes(self.materialize())


class ArrayRun:
    """A run of documents that writes itself as consecutive elements of a BSON array: what a
    reply's batch may hold besides encoded documents (the engine's columnar event blocks), so
    that a cursor document is assembled without knowing how the run keeps its documents."""

    __slots__ = ()

    def __len__(self) -> int:
        """How many documents (array elements) the run holds."""
        raise NotImplementedError

    def array_body(self, first_index: int) -> DeferredPiece:
        """The documents as array elements keyed from `first_index` on (type 3, the index in
        decimal, the document), as a piece made while it is sent."""
        raise NotImplementedError


def joined(pieces: Iterable[bytes | bytearray | memoryview | DeferredPiece]) -> bytes:
    """`b"".join(pieces)`, deferred pieces made whole first."""
    return b"".join(p.materialize() if isinstance(p, DeferredPiece) else p for p in pieces)
