// Unmodified mongosh against the proxy: CRUD, bulkWrite, a cursor drained by getMore, a
// multi-shard transaction, retryable writes, watch() on a collection and on the cluster,
// killCursors (cursor close), and a parallelChangeStream bucket. Usage: mongosh <uri> --file shell.js
const sdb = db.getSiblingDB("shelldb");
if (db.adminCommand({ hello: 1 }).msg !== "isdbgrid") throw new Error("not a mongos");

sdb.c.insertMany(Array.from({ length: 250 }, (_, i) => ({ _id: i, v: i })));
const bulk = sdb.c.bulkWrite([
  { insertOne: { document: { _id: "b1" } } },
  { updateOne: { filter: { _id: 1 }, update: { $set: { touched: true } } } },
  { deleteOne: { filter: { _id: 2 } } },
]);
if (bulk.insertedCount !== 1 || bulk.modifiedCount !== 1 || bulk.deletedCount !== 1) throw new Error("bulkWrite");
const drained = sdb.c.find().batchSize(40).toArray();  // firstBatch + getMores
if (drained.length !== 250) throw new Error("find returned " + drained.length);
const partial = sdb.c.find().batchSize(10);
partial.next();
partial.close();  // killCursors

db.adminCommand({ shardCollection: "shelltx.h", key: { _id: "hashed" } });
const session = db.getMongo().startSession();
session.withTransaction(() => {
  session.getDatabase("shelltx").h.insertMany(Array.from({ length: 12 }, (_, i) => ({ _id: i })));
});
session.endSession();
const inTxn = db.getSiblingDB("shelltx").h.countDocuments({});
if (inTxn !== 12) throw new Error("transaction wrote " + inTxn);

const collStream = sdb.c.watch([], { maxAwaitTimeMS: 200 });
const clusterStream = db.getMongo().watch([], { maxAwaitTimeMS: 200 });
collStream.tryNext();
clusterStream.tryNext();
sdb.c.insertOne({ _id: "watched" });  // a retryable write (mongosh's default)
let seen = null, seenAll = null;
for (let i = 0; i < 50 && !(seen && seenAll); i++) {
  seen = seen || collStream.tryNext();
  seenAll = seenAll || clusterStream.tryNext();
}
if (!seen || seen.documentKey._id !== "watched") throw new Error("collection watch saw " + JSON.stringify(seen));
if (!seenAll) throw new Error("cluster watch saw nothing");
collStream.close();
clusterStream.close();

const opened = db.adminCommand({ parallelChangeStream: 1, nBuckets: 2, name: "shell" });
print(JSON.stringify({ ok: true, n: sdb.c.countDocuments({}), buckets: opened.cursors.length }));
