"""Run every benchmark in turn (`make bench`); each prints its ratios and writes JSON + PNG."""

from benchmarks import (
    bench_engine,
    bench_latency,
    bench_proxy,
    bench_replication,
    bench_simcluster,
    bench_soak,
    bench_watch_stages,
)

if __name__ == "__main__":
    bench_simcluster.main([])
    bench_proxy.main([])
    bench_engine.main([])
    bench_watch_stages.main([])
    bench_latency.main([])
    bench_replication.main([])
    bench_soak.main([])
    bench_soak.main(["--stepdown-every", "6"])
