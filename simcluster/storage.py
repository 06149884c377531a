"""Collections of one node: documents keyed by `_id`, unique indexes, and the oplog entries
writes make."""

from __future__ import annotations

import uuid as uuidlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import bson
from bson import Binary, ObjectId

from mongoformats.errors import MongoError
from mongoformats.keystring import key_of
from mongoformats.mql import get_path

# Keys of the KeyString kind start with what no BSON document starts with (a length of 0), so they
# never meet the BSON-bytes kind in one dict.
_KEYSTRING_KIND = b"\x00\x00\x00\x00"


def id_key(value: Any) -> bytes:
    """A hashable key for an _id: equal for values the server's _id index holds equal.

    An index compares values, not types: 1, 1.0, NumberLong(1) and Decimal128("1") are one key,
    as are {a: 1} and {a: 1.0}, so a second of them is a duplicate key. The server's index keys are
    KeyStrings without type bits; those are used here. ObjectIds and strings (the usual _ids) equal
    only themselves, so their BSON bytes serve and cost less; ShardNode's insert path builds those
    bytes straight from the document it was sent.
    """
    if type(value) is ObjectId or type(value) is str:
        return bson.encode({"": value})
    return index_key([value])


def index_key(values: list[Any]) -> bytes:
    """The key of an index entry with these field values (see id_key)."""
    return _KEYSTRING_KIND + key_of(values)


@dataclass
class Index:
    name: str
    key: dict[str, Any]
    unique: bool = False
    spec: dict[str, Any] = field(default_factory=dict)
    # unique indexes: encoded key values -> _id key
    entries: dict[bytes, bytes] = field(default_factory=dict)

    def key_of(self, doc: dict[str, Any]) -> bytes:
        vals = []
        for f in self.key:
            got = get_path(doc, f)
            vals.append(got[0] if got else None)
        return index_key(vals)

    def key_value(self, doc: dict[str, Any]) -> dict[str, Any]:
        return {f: (get_path(doc, f) or [None])[0] for f in self.key}


@dataclass
class Collection:
    name: str
    uuid: uuidlib.UUID = field(default_factory=uuidlib.uuid4)
    options: dict[str, Any] = field(default_factory=dict)
    docs: dict[bytes, dict[str, Any]] = field(default_factory=dict)
    indexes: dict[str, Index] = field(default_factory=dict)
    # data_size's running figure: each document's BSON size, and the keys written since it last
    # ran, whose sizes it takes afresh.
    _sizes: dict[bytes, int] = field(default_factory=dict, repr=False)
    _size: int = field(default=0, repr=False)
    _unsized: set[bytes] = field(default_factory=set, repr=False)

    def __post_init__(self) -> None:
        if "_id_" not in self.indexes:
            self.indexes["_id_"] = Index(
                "_id_", {"_id": 1}, False, {"v": 2, "key": {"_id": 1}, "name": "_id_"}
            )

    @property
    def ui(self) -> Binary:
        # Every write logs it: built once per uuid (which a create with a given UUID may still set).
        cached = self.__dict__.get("_ui")
        if cached is None or cached[0] is not self.uuid:
            cached = self.__dict__["_ui"] = (self.uuid, Binary(self.uuid.bytes, 4))
        return cached[1]

    def data_size(self) -> int:
        """The BSON bytes of its documents (collStats' `size`). Kept as it goes, as the server's
        size storer does, rather than summed: the balancer asks every round, and encoding every
        document of a large collection stopped the whole cluster for a large part of a second."""
        for k in self._unsized:
            self._size -= self._sizes.pop(k, 0)
            doc = self.docs.get(k)
            if doc is not None:
                self._sizes[k] = n = len(bson.encode(doc))
                self._size += n
        self._unsized.clear()
        return self._size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(list(self.docs.values()))

    def check_unique(
        self, doc: dict[str, Any], ns: str, ignore: bytes | None = None, *, key: bytes | None = None
    ) -> None:
        k = key or id_key(doc["_id"])
        if k in self.docs and k != ignore:
            raise MongoError(
                "DuplicateKey",
                f"E11000 duplicate key error collection: {ns} index: _id_ dup key: "
                f"{{ _id: {doc['_id']!r} }}",
                keyPattern={"_id": 1},
                keyValue={"_id": doc["_id"]},
            )
        for ix in self.indexes.values():
            if ix.unique:
                _check_unique_index(ix, doc, ns, ignore or k)

    def put(
        self, doc: dict[str, Any], old: dict[str, Any] | None = None, *, key: bytes | None = None
    ) -> None:
        k = key or id_key(doc["_id"])
        for ix in self.indexes.values():
            if ix.unique:
                if old is not None:
                    ix.entries.pop(ix.key_of(old), None)
                ix.entries[ix.key_of(doc)] = k
        self.docs[k] = doc
        self._unsized.add(k)

    def remove(self, doc: dict[str, Any]) -> None:
        for ix in self.indexes.values():
            if ix.unique:
                ix.entries.pop(ix.key_of(doc), None)
        self.discard(id_key(doc["_id"]))

    def discard(self, key: bytes) -> None:
        """Forget the document under `key` (an id_key), if there is one; indexes aside."""
        if self.docs.pop(key, None) is not None:
            self._unsized.add(key)

    def add_index(self, spec: dict[str, Any], ns: str) -> bool:
        name = spec["name"]
        if name in self.indexes:
            return False
        ix = Index(name, dict(spec["key"]), bool(spec.get("unique")), spec)
        if ix.unique:
            for d in self.docs.values():
                kk = ix.key_of(d)
                if kk in ix.entries:
                    raise MongoError(
                        "DuplicateKey",
                        f"E11000 duplicate key error collection: {ns} index: {name}",
                        keyPattern=ix.key,
                        keyValue=ix.key_value(d),
                    )
                ix.entries[kk] = id_key(d["_id"])
        self.indexes[name] = ix
        return True


def _check_unique_index(ix: Index, doc: dict[str, object], ns: str, owner_allowed: bytes) -> None:
    """DuplicateKey when another document than `owner_allowed` holds `doc`'s key in the unique
    index `ix`."""
    owner = ix.entries.get(ix.key_of(doc))
    if owner is not None and owner != owner_allowed:
        kv = ix.key_value(doc)
        raise MongoError(
            "DuplicateKey",
            f"E11000 duplicate key error collection: {ns} index: {ix.name} dup key: {kv!r}",
            keyPattern=ix.key,
            keyValue=kv,
        )
