// Unmodified Node.js driver directly against one shard replica set (replicaSet=<name> in the URI):
// topology discovery of its members, CRUD, an index, a transaction and watch().
// Usage: node replset.js <uri>
const { MongoClient } = require("mongodb");

async function main() {
  const client = new MongoClient(process.argv[2], { serverSelectionTimeoutMS: 5000 });
  await client.connect();
  const hello = await client.db("admin").command({ hello: 1 });
  if (!hello.setName || !hello.isWritablePrimary) throw new Error("not a replica set primary: " + JSON.stringify(hello));

  const coll = client.db("rsdb").collection("c");
  const stream = coll.watch([], { maxAwaitTimeMS: 200 });
  await stream.tryNext(); // opens the cursor
  await coll.insertMany(Array.from({ length: 100 }, (_, i) => ({ _id: i, v: i })));
  await coll.updateOne({ _id: 1 }, { $set: { touched: true } });
  await coll.deleteOne({ _id: 2 });
  await coll.createIndex({ v: 1 });
  const indexes = await coll.indexes();
  if (!indexes.some((ix) => ix.name === "v_1")) throw new Error("index missing: " + JSON.stringify(indexes));

  const session = client.startSession();
  await session.withTransaction(async () => {
    await coll.insertOne({ _id: "t1" }, { session });
    await client.db("rsdb").collection("other").insertOne({ _id: "t2" }, { session });
  });
  await session.endSession();

  const seen = [];
  for (let i = 0; i < 400 && seen.length < 103; i++) {
    const change = await stream.tryNext();
    if (change) seen.push(change.operationType);
  }
  await stream.close();
  const count = await coll.countDocuments({});
  // A read the driver may send to a secondary (found through hello.hosts) must not fail.
  const fromSecondary = await coll.find({}, { readPreference: "secondaryPreferred" }).toArray();
  console.log(JSON.stringify({ ok: true, count, events: seen.length, kinds: [...new Set(seen)].sort(),
                               members: hello.hosts.length, secondaryRead: fromSecondary.length }));
  await client.close();
}

main().catch((err) => { console.error(err); process.exit(1); });
