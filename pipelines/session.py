"""The one place a SparkSession is built: Delta, the Kafka source, and sane local defaults.

Works the same from a script, a notebook and `spark-submit`: under `spark-submit`, settings given
on its command line win over the ones set here.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

from pyspark.sql import SparkSession
from pyspark.sql.types import ArrayType, StringType

from pipelines.config import LakehouseConf
from pipelines.local.cds import driver_java_options
from pipelines.local.jars import spark_jars
from pipelines.local.s3 import ensure_folder
from pipelines.spark_conf import event_log_settings, metrics_settings, session_settings
from silver.events import FLAT_OBJECT

FLAT_OBJECT_CLASS = "lakehouse.json.FlatObject"


def build_spark(
    conf: LakehouseConf, app_name: str | None = None, *, job: str | None = None
) -> SparkSession:
    """Build (or join) the session for `conf`; only entry points call this. A layer's `job`
    (`<layer>-<stream>`) also writes Spark's event log and serves Spark's metrics at its port."""
    settings = session_settings(conf)
    if job is not None:
        settings |= metrics_settings(conf, job)
    event_log = event_log_settings(conf) if job is not None else {}
    if event_log and "spark.eventLog.enabled" not in _submitted():
        ensure_folder(conf, conf.event_log_dir)  # Spark refuses to start without it
        settings |= event_log
    json_logs = conf.log.format == "json"
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.appName(app_name or conf.spark.app_name)
    # A JVM already launched for us (spark-submit, or a running session) keeps its own settings.
    if "PYSPARK_GATEWAY_PORT" not in os.environ and SparkSession.getActiveSession() is None:
        # Only loopback here and on most laptops: don't let Spark guess another interface.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = (
            builder.master(conf.spark.master)
            .config("spark.jars", ",".join(str(j) for j in spark_jars(s3=conf.uses_s3)))
            .config("spark.driver.extraJavaOptions", driver_java_options(json_logs=json_logs))
        )
    spark = builder.config(map=dict[str, Any](settings)).getOrCreate()
    spark.sparkContext.setLogLevel(conf.spark.log_level)
    register_functions(spark)
    # pyspark logs each SQL error with its JVM stack trace as it creates it, even one that the
    # caller handles: the caller reports what it does not handle, once.
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        logging.getLogger(name).disabled = True
    return spark


def register_functions(spark: SparkSession) -> None:
    """The SQL functions of the project's JVM classes that the layers call by name (see
    `silver.events.flat_object`); a session cloned from this one (a streaming batch's) has them."""
    spark.udf.registerJavaFunction(FLAT_OBJECT, FLAT_OBJECT_CLASS, ArrayType(StringType()))


def _submitted() -> dict[str, str]:
    """The settings spark-submit gave the JVM this process runs in (none outside spark-submit):
    a job's own event log settings, e.g. in a job spec's spark_conf, are kept."""
    if "PYSPARK_GATEWAY_PORT" not in os.environ or SparkSession.getActiveSession() is not None:
        return {}
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()  # the gateway spark-submit started; no context yet
    return dict(SparkConf().getAll())
