"""Delta writes that are safe to replay: idempotent transactions and conflict retries."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from delta import exceptions
from pyspark.sql import SparkSession

from pipelines.config import GoldConf, SilverConf

log = logging.getLogger("lakehouse.delta")
T = TypeVar("T")

# In Python these are siblings, not subclasses of DeltaConcurrentModificationException: list all.
WRITE_CONFLICTS = (
    exceptions.DeltaConcurrentModificationException,
    exceptions.ConcurrentAppendException,
    exceptions.ConcurrentDeleteDeleteException,
    exceptions.ConcurrentDeleteReadException,
    exceptions.ConcurrentTransactionException,
    exceptions.ConcurrentWriteException,
    exceptions.MetadataChangedException,
    exceptions.ProtocolChangedException,
)

TXN_APP_ID = "spark.databricks.delta.write.txnAppId"
TXN_VERSION = "spark.databricks.delta.write.txnVersion"


@contextmanager
def idempotent_txn(spark: SparkSession, app_id: str, version: int) -> Iterator[None]:
    """Tag the Delta writes (MERGE included) inside with (app_id, version); Delta skips a
    version it already committed for that app id. The confs never outlive the block."""
    spark.conf.set(TXN_APP_ID, app_id)
    spark.conf.set(TXN_VERSION, str(version))
    try:
        yield
    finally:
        spark.conf.unset(TXN_APP_ID)
        spark.conf.unset(TXN_VERSION)


def snapshot(spark: SparkSession, path: str):
    """The Delta log's newest snapshot of the table at `path` (version -1: no table yet), read
    without a Spark job."""
    jvm = spark._jvm
    log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    return log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())


def committed_txn(spark: SparkSession, path: str, app_id: str) -> int | None:
    """The newest version the writer `app_id` committed to the table at `path`, if any."""
    found = snapshot(spark, path).transactions().get(app_id)
    return found.get() if found.isDefined() else None


def retry_on_conflict(write: Callable[[], T], *, what: str, attempts: int = 5) -> T:
    """Run a Delta write, retrying when a concurrent transaction made it conflict."""
    for attempt in range(1, attempts):
        try:
            return write()
        except WRITE_CONFLICTS as e:
            delay = 0.2 * 2**attempt
            log.warning(
                "%s: write conflict (%s), retry %d in %.1fs", what, type(e).__name__, attempt, delay
            )
            time.sleep(delay)
    return write()  # the last attempt: a conflict now is raised


def start_delta_to_batches(
    spark: SparkSession,
    source: str,
    sink: Callable,
    *,
    name: str,
    checkpoint: str,
    layer: SilverConf | GoldConf,
    once: bool,
):
    """Stream a Delta table's new rows into a foreachBatch sink: available-now or continuous,
    taking the layer's trigger interval and files per micro-batch."""
    reader = spark.readStream.format("delta")
    if layer.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", layer.max_files_per_trigger)
    trigger = {"availableNow": True} if once else {"processingTime": layer.trigger_interval}
    return (
        reader.load(source)
        .writeStream.queryName(name)
        .foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(**trigger)
        .start()
    )
