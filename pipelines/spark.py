"""The one place a SparkSession is built: Delta, the Kafka source, and sane local defaults.

Works the same from a script, a notebook and `spark-submit`: under `spark-submit`, settings given
on its command line win over the ones set here.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from pyspark.sql import SparkSession

from pipelines.config import LakehouseConf
from pipelines.jars import spark_jars

LOG4J2 = Path(__file__).parent / "resources" / "log4j2.properties"
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"


def session_settings(conf: LakehouseConf) -> dict[str, str]:
    """Every setting the lakehouse needs, as `spark-submit --conf` pairs."""
    settings = {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
        "spark.sql.shuffle.partitions": str(conf.spark.shuffle_partitions),
        # Frozen into each stateful query's checkpoint at its first start: chosen once, here.
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": str(conf.spark.ui).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": conf.spark.driver_memory,
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        # Delta rebuilds table state (e.g. to check an idempotent write's txn version) with this
        # many partitions; its default of 50 makes every micro-batch 3x slower on a small machine.
        "spark.databricks.delta.snapshotPartitions": str(max(2, conf.spark.shuffle_partitions)),
        "spark.sql.streaming.stopGracefullyOnShutdown": "true",
        "spark.sql.debug.maxToStringFields": "200",
    }
    settings.update(conf.spark.extra)
    return settings


def build_spark(conf: LakehouseConf, app_name: str | None = None) -> SparkSession:
    """Build (or join) the session for `conf`; only entry points call this."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name or conf.spark.app_name)
    if not _under_spark_submit():
        # Only loopback here and on most laptops: don't let Spark guess another interface.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            builder.master(conf.spark.master)
            .config("spark.jars", ",".join(str(j) for j in spark_jars()))
            .config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{LOG4J2}")
        )
    for key, value in session_settings(conf).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(conf.spark.log_level)
    return spark


def _under_spark_submit() -> bool:
    """True when a JVM was already launched for us (spark-submit, or a running session)."""
    return "PYSPARK_GATEWAY_PORT" in os.environ or SparkSession.getActiveSession() is not None
