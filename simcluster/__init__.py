"""simcluster: a sharded MongoDB cluster simulator that unmodified drivers talk to over real
sockets."""

from simcluster.cluster import SimCluster, open_cluster

__all__ = ["SimCluster", "open_cluster"]
