// Unmodified Node.js driver against the proxy: CRUD, bulkWrite, cursors (getMore, killCursors), watch()
// on a collection and on the cluster, a transaction, and one bucket of a
// parallelChangeStream iterated with plain commands. Usage: node driver.js <uri>
const { MongoClient } = require("mongodb");

async function main() {
  const client = new MongoClient(process.argv[2], { serverSelectionTimeoutMS: 5000 });
  await client.connect();
  const admin = client.db("admin");
  const hello = await admin.command({ hello: 1 });
  if (hello.msg !== "isdbgrid") throw new Error("not a mongos: " + JSON.stringify(hello));

  // Like the server, the proxy ties a cursor to the session that opened it: keep one for the bucket.
  const bucketSession = client.startSession();
  const opened = await admin.command({ parallelChangeStream: 1, nBuckets: 1, name: "node" }, { session: bucketSession });
  const cursorId = opened.cursors[0].id;

  const coll = client.db("nodedb").collection("c");
  await coll.insertMany(Array.from({ length: 300 }, (_, i) => ({ _id: i, v: i })));
  await coll.updateOne({ _id: 1 }, { $set: { touched: true } });
  const all = await coll.find({}).batchSize(50).toArray();
  if (all.length !== 300) throw new Error("find returned " + all.length);

  const bulk = await coll.bulkWrite([
    { insertOne: { document: { _id: "b1" } } },
    { updateOne: { filter: { _id: 2 }, update: { $inc: { v: 1 } } } },
    { deleteOne: { filter: { _id: "b1" } } },
  ]);
  if (bulk.insertedCount !== 1 || bulk.modifiedCount !== 1 || bulk.deletedCount !== 1) throw new Error("bulkWrite");
  const partial = coll.find({}).batchSize(10);
  await partial.next();
  await partial.close(); // killCursors

  const stream = coll.watch([], { maxAwaitTimeMS: 200 });
  const clusterStream = client.watch([], { maxAwaitTimeMS: 200 });
  await stream.tryNext(); // opens the cursors
  await clusterStream.tryNext();
  await coll.insertOne({ _id: "watched" });
  let change = null, clusterChange = null;
  for (let i = 0; i < 50 && !(change && clusterChange); i++) {
    change = change || await stream.tryNext();
    clusterChange = clusterChange || await clusterStream.tryNext();
  }
  if (!change || change.operationType !== "insert") throw new Error("watch() saw " + JSON.stringify(change));
  if (!clusterChange) throw new Error("cluster watch() saw nothing");
  await stream.close();
  await clusterStream.close();

  // A transaction across shards through the proxy.
  await admin.command({ shardCollection: "nodetx.h", key: { _id: "hashed" } });
  const session = client.startSession();
  await session.withTransaction(async () => {
    await client.db("nodetx").collection("h").insertMany(Array.from({ length: 10 }, (_, i) => ({ _id: i })), { session });
  });
  await session.endSession();
  const inTxn = await client.db("nodetx").collection("h").countDocuments({});
  if (inTxn !== 10) throw new Error("transaction wrote " + inTxn);

  let events = 0;
  for (let i = 0; i < 50 && events < 305; i++) {
    const more = await admin.command({ getMore: cursorId, collection: "$cmd.parallelChangeStream", maxTimeMS: 300 },
                                     { session: bucketSession });
    events += more.cursor.nextBatch.length;
  }
  if (events < 305) throw new Error("bucket delivered " + events + " events");
  await bucketSession.endSession();
  console.log(JSON.stringify({ ok: true, events, watched: change.documentKey._id }));
  await client.close();
}

main().catch((err) => { console.error(err); process.exit(1); });
