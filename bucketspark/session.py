"""The Spark session the replication job, the demo and the tests run in: Spark's own
configuration decides, with defaults for a run on one machine; the source is registered."""

from __future__ import annotations

import os
import sys
from typing import Any

# For a run on one machine (the demo, the tests, pcs-replicate without a cluster): no web UI,
# few shuffle partitions, the driver on loopback. Filled in only where the Spark configuration
# (spark-submit --conf, spark-defaults.conf, PYSPARK_SUBMIT_ARGS) says nothing, and never for a
# cluster master, whose executors must reach the driver.
LOCAL_DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.driver.host": "127.0.0.1",
    "spark.python.worker.reuse": "true",
}


def spark_session(app: str = "parallelchangestream-demo", master: str | None = None) -> Any:
    """The Spark session, with the master and settings Spark's own configuration gives: `master`
    if passed, else spark-submit's --master, spark.master (--conf, spark-defaults.conf,
    PYSPARK_SUBMIT_ARGS) or the MASTER environment variable (SPARK_MASTER is read as MASTER),
    else local[*]; the source is registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if os.environ.get("SPARK_MASTER"):
        os.environ.setdefault("MASTER", os.environ["SPARK_MASTER"])
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    # Starting the JVM (through spark-submit, as pyspark does) applies --master, --conf,
    # spark-defaults.conf and MASTER; SparkConf then holds what they set. spark-submit defaults
    # the master to local[*].
    SparkContext._ensure_initialized()
    given = SparkConf()
    chosen = master or given.get("spark.master", "local[*]")
    builder = SparkSession.builder.master(chosen)
    if not given.contains("spark.app.name"):
        builder = builder.appName(app)
    if chosen.startswith("local"):
        for key, value in LOCAL_DEFAULTS.items():
            if not given.contains(key):
                builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    from bucketspark.source import ParallelChangeStreamDataSource  # needs pyspark: imported here

    spark.dataSource.register(ParallelChangeStreamDataSource)
    return spark
