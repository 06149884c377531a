// Unmodified mongosh's sharding helpers against the proxy (pass-through to mongos): they read the
// config database (sh.status, sh.getBalancerState) and run the balancer commands.
// Usage: mongosh <uri> --file sharding.js
sh.enableSharding("shst");
sh.shardCollection("shst.c", { k: 1 });
db.getSiblingDB("shst").c.insertMany(Array.from({ length: 20 }, (_, i) => ({ _id: i, k: i })));
sh.splitAt("shst.c", { k: 10 });
const home = db.getSiblingDB("config").chunks.findOne({}).shard;
const other = db.getSiblingDB("config").shards.find({ _id: { $ne: home } }).sort({ _id: 1 }).next()._id;
sh.moveChunk("shst.c", { k: 15 }, other);

sh.stopBalancer();
const stopped = sh.getBalancerState();
sh.startBalancer();
const started = sh.getBalancerState();

const status = sh.status();  // a ShellResult: its value is what mongosh prints
const value = status.value;
const coll = value.databases.find((d) => d.database._id === "shst").collections["shst.c"];
print(JSON.stringify({
  ok: true, stopped, started,
  shards: value.shards.length,
  balancer: value.balancer,
  chunks: coll.chunks.map((c) => [c.min.k === 10 || c.max.k === 10, c["on shard"]]),
  chunkMetadata: coll.chunkMetadata,
  distribution: value.shardedDataDistribution.find((d) => d.ns === "shst.c").shards
    .map((s) => [s.shardName, s.numOwnedDocuments]),
}));
