"""Source versus target, document by document: what a replication must leave equal.

Documents are compared as BSON bytes, matched by `_id`: field names exactly (a field named
`hosts.example.com` is not a subdocument `hosts` holding `example`), field order, value types
(an int32 is not a double) and array lengths all count.
"""

from __future__ import annotations

from typing import Any

import bson
import pymongo
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

_RAW: CodecOptions[RawBSONDocument] = CodecOptions(document_class=RawBSONDocument)
_SYSTEM_DBS = ("admin", "config", "local")


def collections(
    client: pymongo.MongoClient[Any], dbs: tuple[str, ...] | None = None
) -> list[tuple[str, str]]:
    """The user collections behind `client` (of `dbs`, if given), sorted."""
    out = []
    for db in client.list_database_names():
        if db in _SYSTEM_DBS or (dbs is not None and db not in dbs):
            continue
        out += [(db, c) for c in client[db].list_collection_names() if not c.startswith("system.")]
    return sorted(out)


def _documents(client: pymongo.MongoClient[Any], db: str, coll: str) -> dict[bytes, bytes]:
    """The collection's documents by the BSON of their _id."""
    docs = client[db].get_collection(coll, codec_options=_RAW).find()
    return {bson.encode({"_id": d["_id"]}): bytes(d.raw) for d in docs}


def _show(raw: bytes | None) -> str:
    return "missing" if raw is None else repr(bson.decode(raw))


def document_differences(
    source: pymongo.MongoClient[Any],
    target: pymongo.MongoClient[Any],
    dbs: tuple[str, ...] | None = None,
    limit: int = 10,
) -> list[str]:
    """Up to `limit` descriptions of documents that differ between the two (missing on one side,
    or not byte-equal); empty when every collection holds the same documents."""
    out: list[str] = []
    for db, coll in sorted(set(collections(source, dbs)) | set(collections(target, dbs))):
        mine, theirs = _documents(source, db, coll), _documents(target, db, coll)
        for key in sorted(mine.keys() | theirs.keys()):
            if mine.get(key) != theirs.get(key):
                out.append(
                    f"{db}.{coll} {_show(key)}: source {_show(mine.get(key))}, "
                    f"target {_show(theirs.get(key))}"
                )
                if len(out) >= limit:
                    return out
    return out
