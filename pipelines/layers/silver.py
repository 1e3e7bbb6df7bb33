"""The silver job: bronze raw records to typed events, current state and quarantine, exactly.

Each micro-batch of `bronze/<table>` is parsed and validated once, then written three times, each
write a Delta transaction tagged with (app id per table, batch id) so a replayed batch changes
nothing, not even a table version:
- invalid records are appended to the quarantine table with their reason;
- valid events, deduplicated within the batch, are MERGEd insert-only into the events table on
  `event_id` (pruned to the event's `event_date` partition): an event is stored once however late
  its re-delivery comes, with no streaming state to grow;
- the latest version per order in the batch is MERGEd into the state table, replacing a row only
  with a newer version (higher seq; ties: later event_time, then greater event_id).
"""

from __future__ import annotations

from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.config import InvalidConfigError, LakehouseConf, StreamConf
from pipelines.errors import JobFailedError
from pipelines.streaming import checkpoints
from pipelines.streaming.delta import idempotent_txn, retry_on_conflict, start_delta_to_batches
from pipelines.streaming.query import (
    first_line,
    progress_table_for,
    refuse_new_batch_when_stopping,
    run_query,
)
from silver.order_events import (
    ORDER_EVENTS_SCHEMA,
    QUARANTINE_SCHEMA,
    batch_keys,
    dedupe_events,
    new_events_condition,
    parse_order_events,
    quarantined_records,
)
from silver.orders import (
    ORDERS_SCHEMA,
    latest_versions,
    newer_version_condition,
    order_key_condition,
)


class SilverFailedError(JobFailedError):
    """The silver query stopped with an error; the message names the tables and the cause."""


@dataclass(frozen=True)
class SilverTables:
    bronze: str
    events: str
    state: str
    quarantine: str
    checkpoint: str
    names: tuple[str, str, str]


def silver_tables(conf: LakehouseConf, stream: StreamConf) -> SilverTables:
    names = (stream.events_table, stream.state_table, stream.quarantine_table)
    if not all(names):
        raise InvalidConfigError(
            f"stream for topic {stream.topic!r} in {conf.source} has no silver tables: set "
            "events_table, state_table and quarantine_table"
        )
    events, state, quarantine = names  # type: ignore[misc]
    return SilverTables(
        bronze=conf.table_path(stream.bronze_table),
        events=conf.table_path(events),
        state=conf.table_path(state),
        quarantine=conf.table_path(quarantine),
        checkpoint=conf.checkpoint_path(events),
        names=(events, state, quarantine),  # type: ignore[arg-type]
    )


def ensure_silver_tables(spark: SparkSession, tables: SilverTables) -> None:
    """Create the three tables if missing, with the layout the MERGEs rely on."""
    (
        DeltaTable.createIfNotExists(spark)
        .location(tables.events)
        .addColumns(ORDER_EVENTS_SCHEMA)
        .partitionedBy("event_date")
        .execute()
    )
    (
        DeltaTable.createIfNotExists(spark)
        .location(tables.state)
        .addColumns(ORDERS_SCHEMA)
        .property("delta.enableChangeDataFeed", "true")
        .property("delta.enableDeletionVectors", "true")
        .execute()
    )
    (
        DeltaTable.createIfNotExists(spark)
        .location(tables.quarantine)
        .addColumns(QUARANTINE_SCHEMA)
        .property("delta.appendOnly", "true")
        .execute()
    )


class UpsertSilver:
    """foreachBatch sink of the silver job; see the module docstring for what it guarantees."""

    def __init__(self, tables: SilverTables) -> None:
        self.tables = tables
        self._query_id: str | None = None

    def app_id(self, table: str) -> str:
        if self._query_id is None:
            self._query_id = checkpoints.query_id(self.tables.checkpoint)
            if self._query_id is None:
                raise SilverFailedError(f"no query id in checkpoint {self.tables.checkpoint}")
        return f"silver:{table}:{self._query_id}"

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        refuse_new_batch_when_stopping(batch_id)
        spark = batch.sparkSession
        events_name, state_name, quarantine_name = self.tables.names
        parsed = batch.transform(parse_order_events).persist()
        try:
            keys = batch_keys(parsed).first()
            if keys["invalid_records"]:
                retry_on_conflict(
                    lambda: (
                        quarantined_records(parsed)
                        .write.format("delta")
                        .mode("append")
                        .option("txnAppId", self.app_id(quarantine_name))
                        .option("txnVersion", batch_id)
                        .save(self.tables.quarantine)
                    ),
                    what=quarantine_name,
                )
            if not keys["valid_records"]:
                return
            events = dedupe_events(parsed)
            events_condition = new_events_condition(
                keys["event_dates"], keys["min_event_id"], keys["max_event_id"]
            )
            self._merge(spark, events_name, batch_id, lambda: (
                DeltaTable.forPath(spark, self.tables.events).alias("t")
                .merge(events.alias("s"), events_condition)
                .whenNotMatchedInsertAll()
                .execute()
            ))  # fmt: skip
            latest = latest_versions(events)
            state_condition = order_key_condition(keys["min_order_id"], keys["max_order_id"])
            self._merge(spark, state_name, batch_id, lambda: (
                DeltaTable.forPath(spark, self.tables.state).alias("t")
                .merge(latest.alias("s"), state_condition)
                .whenMatchedUpdateAll(condition=newer_version_condition("t", "s"))
                .whenNotMatchedInsertAll()
                .execute()
            ))  # fmt: skip
        finally:
            parsed.unpersist()

    def _merge(self, spark: SparkSession, table: str, batch_id: int, merge) -> None:
        def tagged() -> None:
            with idempotent_txn(spark, self.app_id(table), batch_id):
                merge()

        retry_on_conflict(tagged, what=table)


def start_silver(
    spark: SparkSession, conf: LakehouseConf, stream_name: str = "orders", *, once: bool = False
) -> StreamingQuery:
    """Start the silver query of one stream, reading its bronze table as a stream."""
    stream = conf.stream(stream_name)
    tables = silver_tables(conf, stream)
    if not DeltaTable.isDeltaTable(spark, tables.bronze):
        raise SilverFailedError(
            f"bronze table {tables.bronze} does not exist yet: run `lakehouse run bronze` first"
        )
    ensure_silver_tables(spark, tables)
    return start_delta_to_batches(
        spark,
        tables.bronze,
        UpsertSilver(tables),
        name=f"silver_{tables.names[0].split('/')[-1]}",
        checkpoint=tables.checkpoint,
        max_files_per_trigger=conf.silver.max_files_per_trigger,
        once=once,
        trigger_interval=conf.silver.trigger_interval,
    )


def run_silver(
    spark: SparkSession,
    conf: LakehouseConf,
    stream_name: str = "orders",
    *,
    once: bool = False,
    progress: bool = True,
) -> StreamingQuery:
    """Run silver until done (`once`) or until SIGINT/SIGTERM."""
    tables = silver_tables(conf, conf.stream(stream_name))

    def explain(e: StreamingQueryException) -> Exception:
        return SilverFailedError(
            f"silver from {tables.bronze} into {', '.join(tables.names)} failed: "
            f"{first_line(str(e))}"
        )

    return run_query(
        lambda: start_silver(spark, conf, stream_name, once=once),
        name="silver",
        progress=progress,
        explain=explain,
        progress_table=progress_table_for(spark, conf),
    )


__all__ = ["SilverFailedError", "UpsertSilver", "run_silver", "silver_tables", "start_silver"]
