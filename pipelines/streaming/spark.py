"""The one place a SparkSession is built: Delta, the Kafka source, and sane local defaults.

Works the same from a script, a notebook and `spark-submit`: under `spark-submit`, settings given
on its command line win over the ones set here.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any, cast

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import ArrayType, StringType, StructType

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


def local_frame(spark: SparkSession, rows: list, schema: str) -> DataFrame:
    """A DataFrame of a few driver-side rows (dicts by column name, or tuples in the schema's
    order), handed to the JVM as Arrow: `createDataFrame` of Python rows starts Python workers
    to read them back (a second and more in a new driver, CPU in every job after)."""
    struct = cast(StructType, StructType.fromDDL(schema))  # a row's schema: a struct
    arrow = to_arrow_schema(struct, timezone="UTC")
    names = struct.fieldNames()
    rows = [
        {
            k: _aware(v)
            for k, v in (row.items() if isinstance(row, dict) else zip(names, row, strict=True))
        }
        for row in rows
    ]
    return spark.createDataFrame(pa.Table.from_pylist(rows, schema=arrow), struct)


def _aware(value):
    """A naive datetime is local time, as pyspark reads and writes them."""
    return value.astimezone() if isinstance(value, datetime) and value.tzinfo is None else value


# Spark generates and compiles Java for each projection outside whole-stage code generation, per
# task: a fixed cost that dominates small jobs (Delta's log replay, a MERGE of a few rows) and
# that interpreted projections skip, at a cost per row: a small pipeline batch's writes run
# faster interpreted, the state MERGE and a large append slower
# (bench/RESULTS.md, "Figures behind code choices").
FACTORY_MODE = "spark.sql.codegen.factoryMode"  # an internal Spark setting, tested both ways
INTERPRETED = {FACTORY_MODE: "NO_CODEGEN"}
COMPILED = {FACTORY_MODE: "FALLBACK"}  # Spark's default


@contextmanager
def session_confs(spark: SparkSession, confs: dict[str, str]) -> Iterator[None]:
    """Set `confs` on the session inside the block, and put back what was there after it."""
    before = {k: spark.conf.get(k, None) for k in confs}
    for key, value in confs.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)
