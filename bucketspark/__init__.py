"""The Spark side: a data source reading a parallelChangeStream through the proxy (one partition
per bucket) and a sink replicating its events into another cluster. It talks to the proxy over
the wire only: pymongo, pyspark and `mongoformats`.

    spark.dataSource.register(bucketspark.ParallelChangeStreamDataSource)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bucketspark.source import ParallelChangeStreamDataSource

__all__ = ["ParallelChangeStreamDataSource"]


def __getattr__(name: str) -> Any:
    # The source needs pyspark; importing it on first use keeps `import bucketspark.replicate`
    # working without the [spark] extra, so that the command can say which extra to install.
    if name == "ParallelChangeStreamDataSource":
        from bucketspark.source import ParallelChangeStreamDataSource

        return ParallelChangeStreamDataSource
    raise AttributeError(f"module 'bucketspark' has no attribute {name!r}")
