"""The Spark session the replication job, the demo and the tests run in: Spark's own
configuration decides, with defaults for a run on one machine; the source is registered."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
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


# The driver JVM's JIT on one machine: only the quick C1 compiler. In local mode the JVM runs
# the tasks' row and Arrow conversions, and its C2 compiler threads, busy for the first minutes of
# a job, take CPU from the Python workers, the proxy and the clusters on the same cores; C1's code
# is about as fast for these conversions. Given through JDK_JAVA_OPTIONS, which the JVM reads
# before its command line, so a JIT option spark-submit passes (spark.driver.extraJavaOptions)
# still wins.
LOCAL_JVM_OPTIONS = "-XX:TieredStopAtLevel=1"
_OPERATORS_JVM = ("JDK_JAVA_OPTIONS", "PYSPARK_SUBMIT_ARGS")  # the operator's say on the JVM


def jvm_environ(environ: Mapping[str, str], master: str | None) -> dict[str, str]:
    """The environment to start the driver JVM in: `environ`, with LOCAL_JVM_OPTIONS where the
    master known before the JVM starts (`master`, else MASTER) is local or unset and neither
    JDK_JAVA_OPTIONS nor PYSPARK_SUBMIT_ARGS is given (those belong to the operator)."""
    chosen = master or environ.get("MASTER", "local")
    local = chosen.startswith("local") and environ.keys().isdisjoint(_OPERATORS_JVM)
    return {**environ, "JDK_JAVA_OPTIONS": LOCAL_JVM_OPTIONS} if local else dict(environ)


def _start_jvm(master: str | None) -> None:
    """Start the driver JVM (if this process has none) in `jvm_environ`; this process's own
    environment is left as it was."""
    from pyspark import SparkContext

    saved = os.environ.get("JDK_JAVA_OPTIONS")
    os.environ.update(jvm_environ(os.environ, master))
    try:
        SparkContext._ensure_initialized()
    finally:
        if saved is None:
            os.environ.pop("JDK_JAVA_OPTIONS", None)


def spark_session(app: str = "parallelchangestream-demo", master: str | None = None) -> Any:
    """The Spark session, with the master and settings Spark's own configuration gives: `master`
    if passed, else spark-submit's --master, spark.master (--conf, spark-defaults.conf,
    PYSPARK_SUBMIT_ARGS) or the MASTER environment variable (SPARK_MASTER is read as MASTER),
    else local[*]; the source is registered."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if os.environ.get("SPARK_MASTER"):
        os.environ.setdefault("MASTER", os.environ["SPARK_MASTER"])
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    # Starting the JVM (through spark-submit, as pyspark does) applies --master, --conf,
    # spark-defaults.conf and MASTER; SparkConf then holds what they set. spark-submit defaults
    # the master to local[*].
    _start_jvm(master)
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
