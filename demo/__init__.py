"""The demo and its embedded environment: source and target simclusters and the proxy running
in-process, replicated by Spark. It builds on every package (simcluster, the proxy, bucketspark);
nothing but the tests and the benchmarks imports it."""
