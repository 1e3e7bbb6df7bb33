"""Delta writes that are safe to replay: idempotent transactions and conflict retries."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from delta import exceptions
from pyspark.sql import DataFrame, SparkSession

from pipelines.config import GoldConf, SilverConf
from pipelines.errors import JobFailedError
from pipelines.streaming import checkpoints
from pipelines.streaming.storage import Files, jvm_class

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
USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"


@contextmanager
def idempotent_txn(
    spark: SparkSession, app_id: str | None, version: int, metadata: str | None = None
) -> Iterator[None]:
    """Tag the Delta writes (MERGE included) inside with (app_id, version); Delta skips a
    version it already committed for that app id. `metadata` goes to the commits' userMetadata
    (alone if `app_id` is None). The confs never outlive the block."""
    tags = {TXN_APP_ID: app_id, TXN_VERSION: str(version)} if app_id is not None else {}
    confs = {TXN_APP_ID: None, TXN_VERSION: None, **tags, USER_METADATA: metadata}
    for key, value in confs.items():
        if value is not None:
            spark.conf.set(key, value)
    try:
        yield
    finally:
        for key in confs:
            spark.conf.unset(key)


@contextmanager
def session_conf(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    """The session setting `key` is `value` inside the block, and what it was after."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def snapshot(spark: SparkSession, path: str):
    """The Delta log's newest snapshot of the table at `path` (version -1: no table yet), read
    without a Spark job."""
    log = jvm_class(spark, "org.apache.spark.sql.delta.DeltaLog").forTable(
        spark._jsparkSession, path
    )
    none = jvm_class(spark, "scala.Option").empty()
    return log.update(False, none, none)


def read_pinned(spark: SparkSession, path: str, version: int | None = None) -> DataFrame:
    """The table at `path` as of `version` (default: its newest), pinned to it (a time-travel
    read). A frame over it stays what it was when the batch's own write commits to the table, and
    Spark does not re-plan it then: after every write Spark re-caches each cached frame that reads
    the written table (for Delta a file listing and a state reconstruction of the new version)."""
    if version is None:
        version = snapshot(spark, path).version()
    return spark.read.format("delta").option("versionAsOf", version).load(path)


def has_log(spark: SparkSession, path: str) -> bool:
    """Whether a Delta log exists at `path` (one file system call, without starting Delta's
    log reader: cheap in a new driver)."""
    log = jvm_class(spark, "org.apache.hadoop.fs.Path")(f"{path}/_delta_log")
    return bool(log.getFileSystem(spark._jsc.hadoopConfiguration()).exists(log))


def newest_tagged_batch(
    spark: SparkSession, path: str, query: str, since_ms: int | None
) -> int | None:
    """The newest batch of the streaming query `query` that the table at `path` recorded: the
    batch record in its commits' `userMetadata`, read newest commit first, without a Spark job.
    Commits made before `since_ms` are not read (None: every commit); None: no such commit.

    Unlike Delta's own transaction ids (`Snapshot.setTransactions`), this does not reconstruct
    the table's state: a few small files, not three Spark jobs."""
    found = snapshot(spark, path)
    version, log = found.version(), found.deltaLog()
    store, hadoop = log.store(), spark._jsc.hadoopConfiguration()
    hadoop_path, log_path = jvm_class(spark, "org.apache.hadoop.fs.Path"), log.logPath()
    while version >= 0:
        file = hadoop_path(log_path, f"{version:020d}.json")
        if not file.getFileSystem(hadoop).exists(file):
            raise JobFailedError(
                f"cannot tell whether query {query} committed its batch to {path}: the table's "
                f"log no longer holds version {version} (cleaned up); a re-run could duplicate it"
            )
        info = commit_info(store.read(file, hadoop).mkString("\n"))
        record = json.loads(info.get("userMetadata") or "{}")
        if isinstance(record, dict) and record.get("query") == query and "batch" in record:
            return int(record["batch"])
        if since_ms is not None and info.get("timestamp", since_ms) < since_ms:
            return None
        version -= 1
    return None


def commit_info(commit: str) -> dict:
    """The commitInfo action of a Delta commit file's text ({} if it has none)."""
    for line in commit.splitlines():
        if line.startswith('{"commitInfo"'):
            return json.loads(line)["commitInfo"]
    return {}


def commit_text(spark: SparkSession, found, version: int) -> str:
    """The text of commit `version` of the table whose snapshot is `found` ("" if the log no
    longer holds it)."""
    log_path = found.deltaLog().logPath().toString()
    return Files(spark).read_text(f"{log_path}/{version:020d}.json") or ""


def commit_time_ms(commit: str) -> int | None:
    """When a commit was made (its in-commit timestamp if the table has them), from the text of
    its file; None without a commitInfo."""
    info = commit_info(commit)
    return info.get("inCommitTimestamp", info.get("timestamp"))


def retry_on_conflict(
    write: Callable[[], T],
    *,
    what: str,
    attempts: int = 5,
    wait: Callable[[int], str] | None = None,
) -> T:
    """Run a Delta write, retrying when a concurrent transaction made it conflict, each retry
    once `wait(attempt)` returns (it says what it waited for; default: a backoff)."""
    for attempt in range(1, attempts):
        try:
            return write()
        except WRITE_CONFLICTS as e:
            log.warning("%s: write conflict (%s)", what, type(e).__name__)
            log.warning("%s: retry %d %s", what, attempt, (wait or backoff)(attempt))
    return write()  # the last attempt: a conflict now is raised


def backoff(attempt: int) -> str:
    """Sleep 0.4 s, 0.8 s, ... before retry `attempt`; says how long."""
    delay = 0.2 * 2**attempt
    time.sleep(delay)
    return f"after {delay:.1f} s"


def recover_checkpoint(
    spark: SparkSession,
    checkpoint: str,
    written: list[str],
    name: str,
    reads: Callable[[dict], bool],
) -> None:
    """With no checkpoint but tables that recorded batches of it, rebuild it where the newest
    recorded batch left off: every table then ends as if the checkpoint had never been lost.

    Only a batch that read this query's source counts (`reads`: whether a source's offsets, as
    the checkpoint writes them, are of it): a table written by queries of other sources (the
    state table by an earlier version's silver query, then by the state query) records their
    offsets too, which would start this query at another source's position."""
    files = Files(spark)
    if checkpoints.query_id(files, checkpoint) is not None:
        return
    found = (_newest_record(spark, path, reads) for path in written)
    records = [r for r in found if r is not None]
    if records:
        _, batch, record = max(records, key=lambda r: r[:2])
        checkpoints.rebuild(files, checkpoint, record)
        log.warning(
            "%s: checkpoint %s was lost; rebuilt from the tables it wrote, batch %s of query %s "
            "next",
            name,
            checkpoint,
            batch,
            record["query"],
        )


def _newest_record(
    spark: SparkSession, path: str, reads: Callable[[dict], bool], commits: int = 100
) -> tuple[int, int, dict] | None:
    """(commit time in ms, batch, record) of the newest of a table's last `commits` commits
    whose batch record read the source `reads` names; None if none did (or no table). Read from
    the commit files newest first, without a Spark job: a new table is one small file."""
    found = snapshot(spark, path)
    for version in range(found.version(), max(found.version() - commits, -1), -1):
        commit = commit_text(spark, found, version)
        if not commit:  # cleaned up: what is older is gone too
            return None
        info = commit_info(commit)
        record = json.loads(info.get("userMetadata") or "{}")
        if not isinstance(record, dict) or not {"query", "batch", "offsets"} <= record.keys():
            continue
        if any(reads(o) for o in checkpoints.source_offsets(record["offsets"])):
            return commit_time_ms(commit) or 0, record["batch"], record
    return None


def reads_table(spark: SparkSession, path: str) -> Callable[[dict], bool]:
    """Whether a source's offsets are those of a Delta source on the table at `path` (its id)."""
    table_id = snapshot(spark, path).metadata().id()
    return lambda offsets: offsets.get("reservoirId") == table_id


def start_delta_to_batches(
    spark: SparkSession,
    source: str,
    sink: Callable,
    *,
    name: str,
    checkpoint: str,
    layer: SilverConf | GoldConf,
    once: bool,
    written: list[str],
):
    """Stream a Delta table's new rows into a foreachBatch sink: available-now or continuous,
    taking the layer's trigger interval and files per micro-batch. A lost checkpoint is rebuilt
    first from what the tables the sink writes (`written`) recorded of it."""
    recover_checkpoint(spark, checkpoint, written, name, reads_table(spark, source))
    reader = spark.readStream.format("delta")
    if layer.max_files_per_trigger:
        reader = reader.option("maxFilesPerTrigger", layer.max_files_per_trigger)
    if layer.max_bytes_per_trigger:
        reader = reader.option("maxBytesPerTrigger", layer.max_bytes_per_trigger)
    trigger = {"availableNow": True} if once else {"processingTime": layer.trigger_interval}
    return (
        reader.load(source)
        .writeStream.queryName(name)
        .foreachBatch(sink)
        .option("checkpointLocation", checkpoint)
        .trigger(**trigger)
        .start()
    )
