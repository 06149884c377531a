"""Run every benchmark in turn (`make bench`); each prints its ratios and writes JSON + PNG.

    .venv/bin/python -m benchmarks.run_all [--out DIR]

All of one run's files go to one folder (default: a new `benchmarks/runs/<UTC time>/`).
"""

import argparse

from benchmarks import (
    bench_engine,
    bench_latency,
    bench_latency_load,
    bench_proxy,
    bench_replication,
    bench_simcluster,
    bench_soak,
    bench_stall,
    bench_watch_stages,
)
from benchmarks.common import add_out_option

if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_out_option(parser)
    out = ["--out", str(parser.parse_args().out)]
    bench_simcluster.main(out)
    bench_proxy.main(out)
    bench_engine.main(out)
    bench_stall.main(out)
    bench_watch_stages.main(out)
    bench_latency.main(out)
    bench_latency_load.main(out)
    bench_replication.main(out)
    bench_soak.main(out)
    bench_soak.main(["--stepdown-every", "6", *out])
