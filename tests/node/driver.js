// Unmodified Node.js driver against the proxy: CRUD, cursors, watch(), a transaction, and one bucket of a
// parallelChangeStream iterated with plain commands. Usage: node driver.js <uri>
const { MongoClient } = require("mongodb");

async function main() {
  const client = new MongoClient(process.argv[2], { serverSelectionTimeoutMS: 5000 });
  await client.connect();
  const admin = client.db("admin");
  const hello = await admin.command({ hello: 1 });
  if (hello.msg !== "isdbgrid") throw new Error("not a mongos: " + JSON.stringify(hello));

  const opened = await admin.command({ parallelChangeStream: 1, nBuckets: 1, name: "node" });
  const cursorId = opened.cursors[0].id;

  const coll = client.db("nodedb").collection("c");
  await coll.insertMany(Array.from({ length: 300 }, (_, i) => ({ _id: i, v: i })));
  await coll.updateOne({ _id: 1 }, { $set: { touched: true } });
  const all = await coll.find({}).batchSize(50).toArray();
  if (all.length !== 300) throw new Error("find returned " + all.length);

  const stream = coll.watch([], { maxAwaitTimeMS: 200 });
  await stream.tryNext(); // opens the cursor
  await coll.insertOne({ _id: "watched" });
  let change = null;
  for (let i = 0; i < 50 && !change; i++) change = await stream.tryNext();
  if (!change || change.operationType !== "insert") throw new Error("watch() saw " + JSON.stringify(change));
  await stream.close();

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
  for (let i = 0; i < 50 && events < 302; i++) {
    const more = await admin.command({ getMore: cursorId, collection: "$cmd.parallelChangeStream", maxTimeMS: 300 });
    events += more.cursor.nextBatch.length;
  }
  if (events < 302) throw new Error("bucket delivered " + events + " events");
  console.log(JSON.stringify({ ok: true, events, watched: change.documentKey._id }));
  await client.close();
}

main().catch((err) => { console.error(err); process.exit(1); });
