"""A sharded collection's config metadata (shard key, chunks) and moving a range of it to another
shard.

A migration has the server's phases (the router, simcluster/mongos_migrate.py, runs them and holds
the collection's writes meanwhile, as the donor's critical section does):
- `clone_range`: the recipient inserts the range's documents, logged with `fromMigrate: true` as the
  server's cloner logs them (change streams hide them);
- the router waits until the recipient's copies are majority-committed, so a failover on the
  recipient cannot roll back documents the donor has given away;
- `commit_migration`: the chunk changes hands and the donor deletes its copies (`fromMigrate`, as
  the range deleter logs them); or `delete_orphans` on the recipient if the migration failed.
When the recipient owns no chunk of the collection yet, the donor first logs the
`migrateChunkToNewShard` noop, which 6.0+ change streams turn into that event so a stream starts
reading the new shard; when the donor is left with none, it logs `migrateLastChunkFromShard`
(an event only with showSystemEvents). Both name the collection (ns, ui), as
migration_util.cpp writes them (shared/reference/mongodb-formats.md C.7).
"""

from __future__ import annotations

import datetime
import uuid as uuidlib
from dataclasses import dataclass, field
from typing import Any

from bson import Binary, MaxKey, MinKey, ObjectId, Timestamp

from mongoformats.bson_order import compare, sort_key
from mongoformats.hashed_key import hashed_value
from mongoformats.mql import get_path
from simcluster.catalog import create_entry_o, fix_index_spec
from simcluster.roles import ShardMember
from simcluster.storage import Collection


@dataclass
class Chunk:
    min: Any
    max: Any
    shard: str
    # config.chunks' bookkeeping: the chunk version (major, minor) that routers compare, and the
    # shards it has been on, newest first, each from when (`history` [{validAfter, shard}]).
    version: tuple[int, int] = (1, 0)
    history: list[tuple[Timestamp, str]] = field(default_factory=list)
    id: ObjectId = field(default_factory=ObjectId)

    def holds(self, point: Any) -> bool:
        """min <= point < max, MinKey and MaxKey being open ends."""
        return (isinstance(self.min, MinKey) or compare(point, self.min) >= 0) and (
            isinstance(self.max, MaxKey) or compare(point, self.max) < 0
        )


def key_text(value: Any) -> str:
    """A shard key or bound as BSONObj::toString prints it in an error message: `{ a: 1, b: "x" }`,
    the ends as MinKey and MaxKey (values of other types in their Python form)."""
    if isinstance(value, dict):
        return (
            "{ " + ", ".join(f"{k}: {key_text(v)}" for k, v in value.items()) + " }"
            if value
            else "{}"
        )
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, MinKey | MaxKey):
        return type(value).__name__
    return str(value)


@dataclass
class ShardedCollection:
    ns: str
    key: dict[str, Any]
    uuid: uuidlib.UUID
    unique: bool = False
    chunks: list[Chunk] = field(default_factory=list)
    # configureCollectionBalancing's chunkSize, in bytes; None: the cluster's (config.settings
    # chunksize).
    chunk_bytes: int | None = None
    # config.collections' incarnation fields: set when the collection is sharded, never changed here
    # (they change on drop and re-create, or a refined shard key).
    timestamp: Timestamp = field(default_factory=lambda: Timestamp(0, 0))
    epoch: ObjectId = field(default_factory=ObjectId)
    sharded_at: datetime.datetime = field(
        default_factory=lambda: datetime.datetime.now(datetime.UTC)
    )

    @property
    def presplit(self) -> bool:
        """Whether an empty collection starts with a chunk per shard: when the key's first field is
        hashed (InitialSplitPolicy; a hashed field after a range prefix starts with one chunk)."""
        return next(iter(self.key.values())) == "hashed"

    def as_point(self, values: list[Any]) -> Any:
        """The key-space point of the shard key fields' positions (in key order, hash values for a
        hashed field). One field: the value itself. Several: the list of them, which compares
        field by field, as the server compares key documents (sort_key of a list)."""
        return values[0] if len(values) == 1 else values

    def values_of(self, point: Any) -> list[Any]:
        """The fields' positions of a point (the inverse of as_point)."""
        return point if len(self.key) > 1 else [point]

    def point(self, values: list[Any]) -> Any:
        """The key-space point of the shard key fields' values (in key order), a hashed field's
        value hashed."""
        return self.as_point(
            [
                hashed_value(v) if kind == "hashed" else v
                for v, kind in zip(values, self.key.values(), strict=True)
            ]
        )

    def edge(self, end: type[MinKey] | type[MaxKey]) -> Any:
        """The point below (MinKey) or above (MaxKey) every key: each field at that end."""
        return self.as_point([end() for _ in self.key])

    def key_point(self, doc: dict[str, Any]) -> Any:
        """Where a document sits in the key space (a missing field counts as null)."""
        values = []
        for name in self.key:
            got = get_path(doc, name)
            values.append(got[0] if got else None)
        return self.point(values)

    def chunk_at(self, point: Any) -> Chunk:
        """The chunk whose range holds `point`.

        A binary search: the chunks cover the key space in order, from MinKey to MaxKey, with no
        gap (shardCollection makes them so, a split cuts one in two in place). Every document a
        scatter-gather find returns is checked against its shard's ranges (the orphan filter),
        so a scan cost the collection's chunk count in comparisons per document (330 us each
        with 200 chunks, against 7.5 us now)."""
        chunks = self.chunks
        key = sort_key(point)
        lo, hi = (
            0,
            len(chunks) - 1,
        )  # the last chunk ends at MaxKey: it holds whatever is past the others
        while lo < hi:
            mid = (lo + hi) // 2
            if key < sort_key(chunks[mid].max):
                hi = mid
            else:
                lo = mid + 1
        return chunks[lo]

    def owner(self, point: Any) -> str:
        return self.chunk_at(point).shard

    @property
    def version(self) -> tuple[int, int]:
        """The collection version: the highest of its chunks' versions."""
        return max(c.version for c in self.chunks)

    def split(self, chunk: Chunk, point: Any) -> Chunk:
        """Cut `chunk` at `point` (strictly inside it); both halves stay on its shard. Returns the
        upper half.

        As the config server commits a split, both halves take the next minor versions of the
        collection version; the lower half keeps the chunk's identity."""
        major, minor = self.version
        upper = Chunk(point, chunk.max, chunk.shard, (major, minor + 2), list(chunk.history))
        self.chunks.insert(self.chunks.index(chunk) + 1, upper)
        chunk.max, chunk.version = point, (major, minor + 1)
        return upper

    def documents_in(self, shard: ShardMember, chunk: Chunk) -> list[tuple[Any, dict[str, Any]]]:
        """The shard's documents in the chunk's range as (key point, document), in key order."""
        found = [(self.key_point(doc), doc) for doc in shard.select(self.ns, {})]
        return sorted(((p, d) for p, d in found if chunk.holds(p)), key=lambda pd: sort_key(pd[0]))


def _delete_range(sc: ShardedCollection, shard: ShardMember, docs: list[dict[str, Any]]) -> None:
    """Delete these documents of `shard`'s, logged `fromMigrate` as the range deleter logs them."""
    for doc in docs:
        shard.delete_docs(sc.ns, {"_id": doc["_id"]}, 1, {}, from_migrate=True)


def delete_orphans(sc: ShardedCollection, chunk: Chunk, shard: ShardMember) -> int:
    """Delete `shard`'s documents in the chunk's range, which it does not own (what a failed
    migration left there); how many."""
    found = [doc for _, doc in sc.documents_in(shard, chunk)]
    _delete_range(sc, shard, found)
    return len(found)


def clone_range(
    sc: ShardedCollection, chunk: Chunk, donor: ShardMember, recipient: ShardMember
) -> list[dict[str, Any]]:
    """Copy the chunk's documents from donor to recipient (the chunk stays the donor's); returns
    them.

    Orphans a failed migration left on the recipient go first, as the recipient waits for the
    range deletions overlapping the range it is to receive."""
    delete_orphans(sc, chunk, recipient)
    if recipient.coll(sc.ns) is None:
        _create_on_recipient(sc.ns, donor, recipient)
    if not any(c.shard == recipient.set_name for c in sc.chunks):
        ui = Binary(sc.uuid.bytes, 4)
        donor.append_noop(
            {
                "msg": f"Migrating chunk from shard {donor.set_name} to shard {recipient.set_name} "
                "with no chunks for this collection"
            },
            {
                "migrateChunkToNewShard": sc.ns,
                "fromShardId": donor.set_name,
                "toShardId": recipient.set_name,
            },
            ui,
            sc.ns,
        )
    moving = [doc for _, doc in sc.documents_in(donor, chunk)]
    for doc in moving:
        recipient.insert_one(sc.ns, doc, {}, from_migrate=True)
    return moving


def _create_on_recipient(ns: str, donor: ShardMember, recipient: ShardMember) -> None:
    """A shard receiving a collection it does not have creates it with the donor's UUID, options
    and indexes, each logged with fromMigrate (MigrationDestinationManager::
    cloneCollectionIndexesAndOptions): change streams show that create and those createIndexes
    only with showSystemEvents (jstests/change_streams/create_event_from_chunk_migration.js;
    change_stream_filter_helpers.cpp, buildFromMigrateSystemOpFilter)."""
    source = donor.coll(ns)
    if source is None:
        return
    db, _, name = ns.partition(".")
    coll = Collection(name, uuid=source.uuid, options=dict(source.options))
    recipient.dbs.setdefault(db, {})[name] = coll
    recipient.oplog.append(
        {
            "op": "c",
            "ns": f"{db}.$cmd",
            "ui": coll.ui,
            "o": create_entry_o(name, coll.options, None),
            "fromMigrate": True,
        }
    )
    for index in source.indexes.values():
        if index.name == "_id_":
            continue
        spec = fix_index_spec(index.spec)
        coll.add_index(spec, ns)
        recipient.oplog.append(
            {
                "op": "c",
                "ns": f"{db}.$cmd",
                "ui": coll.ui,
                "o": {"createIndexes": name, **spec},
                "fromMigrate": True,
            }
        )


def commit_migration(
    sc: ShardedCollection,
    chunk: Chunk,
    donor: ShardMember,
    recipient: ShardMember,
    moved: list[dict[str, Any]],
) -> None:
    """Give the chunk to the recipient and delete the donor's copies of `moved`.

    The commit bumps the collection's major version: the moved chunk takes (major + 1, 0) and, if
    the donor keeps any chunk, its first one takes (major + 1, 1), so the donor's shard version
    changes too (commitChunkMigration's "control chunk")."""
    _delete_range(sc, donor, moved)
    major = sc.version[0] + 1
    chunk.shard, chunk.version = recipient.set_name, (major, 0)
    chunk.history.insert(0, (donor.clock.now(), recipient.set_name))
    control = next((c for c in sc.chunks if c.shard == donor.set_name), None)
    if control is not None:
        control.version = (major, 1)
    else:
        donor.append_noop(
            {"msg": f"Migrate the last chunk for {sc.ns} off shard {donor.set_name}"},
            {"migrateLastChunkFromShard": sc.ns, "shardId": donor.set_name},
            Binary(sc.uuid.bytes, 4),
            sc.ns,
        )
