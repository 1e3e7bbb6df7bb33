"""The bronze job: Kafka's committed records to a Delta table of raw records, checkpointed and
exactly once, resumable from the table without a checkpoint, with retention gaps stopped or
recorded (docs/guarantees.md, "Bronze").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from delta.tables import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

import bronze.raw_records
from bronze.raw_records import (
    OffsetGap,
    find_retention_gaps,
    resume_offsets_from_table,
    to_raw_records,
)
from pipelines.config import LakehouseConf, StreamConf
from pipelines.errors import JobFailedError
from pipelines.kafka import (
    PartitionWatermarks,
    kafka_failure,
    redacted,
    spark_kafka_options,
    topic_watermarks,
)
from pipelines.layers import progress_table
from pipelines.streaming import checkpoints
from pipelines.streaming.delta import has_log, snapshot
from pipelines.streaming.query import run_query
from pipelines.streaming.sink import IdempotentSink
from pipelines.streaming.spark import local_frame
from pipelines.streaming.storage import Files
from pipelines.streaming.tables import Table, declared, ensure_tables

log = logging.getLogger("lakehouse.bronze")
# Spark's Kafka source polls 500 records at a time by default; a backlog drains faster in polls of
# 10,000 (bench/RESULTS.md, "Figures behind code choices"). bronze.source_options wins.
SOURCE_DEFAULTS = {"kafka.max.poll.records": "10000"}


class RetentionGapError(JobFailedError):
    """Kafka deleted offsets that bronze never received."""

    def __init__(self, gaps: list[OffsetGap], conf: LakehouseConf, table: str) -> None:
        self.gaps = gaps
        lines = "\n  ".join(g.describe() for g in gaps)
        super().__init__(
            f"bronze cannot continue without losing data:\n  {lines}\n"
            f"To skip what is gone and record it in {table}_gaps, set bronze.on_data_loss: record "
            f"in {conf.source} (or LAKEHOUSE__BRONZE__ON_DATA_LOSS=record)."
        )


@dataclass(frozen=True)
class BronzeTables:
    raw: str
    gaps: str
    checkpoint: str
    name: str


def declarations(stream: StreamConf) -> tuple[Table, Table]:
    """The raw table of a stream and the table of its retention gaps."""
    return (
        declared(bronze.raw_records, stream.bronze_table),
        declared(bronze.raw_records, stream.gaps_table, attr="GAPS"),
    )


def bronze_tables(conf: LakehouseConf, stream: StreamConf) -> BronzeTables:
    return BronzeTables(
        raw=conf.table_path(stream.bronze_table),
        gaps=conf.table_path(stream.gaps_table),
        checkpoint=conf.checkpoint_path(stream.bronze_table),
        name=stream.bronze_table,
    )


def ensure_bronze_tables(spark: SparkSession, conf: LakehouseConf, stream: StreamConf) -> None:
    """Create (or bring to their declarations) the raw and gaps tables."""
    ensure_tables(spark, {conf.table_path(t.name): t for t in declarations(stream)})


def table_max_offsets(spark: SparkSession, path: str, topic: str) -> dict[int, int]:
    """The greatest offset the table holds, per partition of `topic` (no Spark job when it holds
    no file: a new table)."""
    checksum = snapshot(spark, path).checksumOpt()  # the log's own file count, if it kept one
    if checksum.isDefined() and checksum.get().numFiles() == 0:
        return {}
    rows = (
        spark.read.format("delta")
        .load(path)
        .where(F.col("topic") == topic)
        .groupBy("partition")
        .agg(F.max("offset").alias("max_offset"))
        .collect()
    )
    return {r["partition"]: r["max_offset"] for r in rows}


def record_gaps(
    spark: SparkSession, gaps_path: str, gaps: list[OffsetGap], detected_by: str
) -> None:
    """Add gaps to the gaps table, once each (keyed by topic, partition and first offset)."""
    if not gaps:
        return
    rows = [(g.topic, g.partition, g.from_offset, g.to_offset, g.missing) for g in gaps]
    new = local_frame(
        spark,
        rows,
        "topic string, partition int, from_offset long, to_offset long, missing_records long",
    ).select(
        "*", F.current_timestamp().alias("detected_at"), F.lit(detected_by).alias("detected_by")
    )
    (
        DeltaTable.forPath(spark, gaps_path)
        .alias("t")
        .merge(
            new.alias("s"),
            "t.topic = s.topic AND t.partition = s.partition AND t.from_offset = s.from_offset",
        )
        .whenNotMatchedInsertAll()
        .execute()
    )
    for g in gaps:
        log.warning("%s; recorded in %s", g.describe(), gaps_path)


class AppendRawRecords(IdempotentSink):
    """foreachBatch sink: append a micro-batch to bronze exactly once (see IdempotentSink)."""

    cache_batch = False  # written once, as it comes

    def __init__(
        self,
        tables: BronzeTables,
        topic: str,
        watermarks: Callable[[], list[PartitionWatermarks]] | None = None,
    ) -> None:
        """`watermarks` (the topic's, read committed where the stream is): record the gaps of
        each batch (bronze.on_data_loss `record`)."""
        super().__init__(tables.checkpoint)
        self.tables, self.topic, self.watermarks = tables, topic, watermarks

    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        self.append(batch, self.tables.name, self.tables.raw, batch_id)
        if self.watermarks is not None:
            self._record_batch_gaps(batch.sparkSession, batch_id, self.watermarks())

    def _record_batch_gaps(
        self, spark: SparkSession, batch_id: int, watermarks: list[PartitionWatermarks]
    ) -> None:
        """Gaps inside this batch's offset range: Kafka deleted them before Spark read them."""
        topic = self.topic
        files, checkpoint = Files(spark), self.tables.checkpoint
        start = checkpoints.batch_start_offsets(files, checkpoint, batch_id, topic) or {}
        end = checkpoints.batch_end_offsets(files, checkpoint, batch_id, topic) or {}
        low = {w.partition: w.low for w in watermarks}
        gaps = []
        for p, s in start.items():
            e = end.get(p, s)
            if s < 0 or low.get(p, 0) <= s or e <= s:
                continue
            first = (
                spark.read.format("delta")
                .load(self.tables.raw)
                .where((F.col("topic") == topic) & (F.col("partition") == p))
                .where((F.col("offset") >= s) & (F.col("offset") < e))
                .agg(F.min("offset"))
                .collect()[0][0]
            )
            # what Kafka deleted ends before its first offset left, or the first record read: the
            # offsets between those two are transaction markers or aborted records, never data
            last_missing = min(low[p], e if first is None else first) - 1
            if last_missing >= s:
                gaps.append(OffsetGap(topic, p, s, last_missing))
        record_gaps(spark, self.tables.gaps, gaps, f"batch {batch_id}")


def bronze_sink(conf: LakehouseConf, stream: StreamConf, tables: BronzeTables) -> AppendRawRecords:
    """The bronze sink of `tables`; it records gaps when bronze.on_data_loss is `record`."""

    def watermarks() -> list[PartitionWatermarks]:
        return topic_watermarks(conf, stream.topic, stream.isolation_level)

    record = conf.bronze.on_data_loss == "record"
    return AppendRawRecords(tables, stream.topic, watermarks if record else None)


def start_bronze(
    spark: SparkSession,
    conf: LakehouseConf,
    stream_name: str = "orders",
    sink: IdempotentSink | None = None,
    *,
    once: bool = False,
    checkpoint: str | None = None,
    name: str | None = None,
    trigger_interval: str | None = None,
    max_offsets: int | None = -1,
) -> StreamingQuery:
    """Check offsets against Kafka, then start the bronze query for one stream (by default with
    the bronze job's checkpoint, name, trigger and cap; the pipeline job gives its own)."""
    stream = conf.stream(stream_name)
    tables = bronze_tables(conf, stream)
    if checkpoint is not None:
        tables = replace(tables, checkpoint=checkpoint)
    max_offsets = conf.bronze.max_offsets_per_trigger if max_offsets == -1 else max_offsets
    topic = stream.topic
    # names the broker if it is unreachable, the topic if it is missing
    watermarks = topic_watermarks(conf, topic, stream.isolation_level)
    sink = sink or bronze_sink(conf, stream, tables)
    if not has_log(spark, tables.raw):
        # a new table is created while the query starts, and the first write waits for it: a
        # first run pays Delta's cold start once, not before the query and again in its batch
        sink.ready = ThreadPoolExecutor(1).submit(ensure_bronze_tables, spark, conf, stream)
    else:
        ensure_bronze_tables(spark, conf, stream)

    next_offsets = checkpoints.resume_offsets(Files(spark), tables.checkpoint, topic)
    starting = "earliest"
    if next_offsets is None:
        in_table = {} if sink.ready else table_max_offsets(spark, tables.raw, topic)
        if in_table:
            next_offsets = resume_offsets_from_table(in_table, [w.partition for w in watermarks])
            starting = json.dumps({topic: {str(p): o for p, o in next_offsets.items()}})
            log.warning(
                "no offsets in checkpoint %s; resuming %s right after the offsets in %s: %s",
                tables.checkpoint,
                topic,
                tables.raw,
                next_offsets,
            )
    gaps = _retention_gaps(topic, next_offsets or {}, watermarks)
    if gaps:
        if conf.bronze.on_data_loss == "fail":
            raise RetentionGapError(gaps, conf, tables.name)
        sink.wait_until_ready()
        record_gaps(spark, tables.gaps, gaps, "start")

    options = {
        **SOURCE_DEFAULTS,
        **spark_kafka_options(conf),
        "subscribe": topic,
        "startingOffsets": starting,
        "includeHeaders": "true",
        "failOnDataLoss": str(conf.bronze.on_data_loss == "fail").lower(),
        # only committed records (the default): aborted ones never, open ones once committed
        "kafka.isolation.level": stream.isolation_level,
    }
    if max_offsets:
        # Spark floors each partition's share of the cap: one offset more per partition, so a
        # backlog of k x max_offsets drains in k batches, not k and one of a few records
        options["maxOffsetsPerTrigger"] = str(max_offsets + len(watermarks))
    options |= conf.bronze.source_options
    log.info("bronze source options: %s", redacted(options))
    interval = trigger_interval or conf.bronze.trigger_interval
    trigger = {"availableNow": True} if once else {"processingTime": interval}
    return (
        spark.readStream.format("kafka")
        .options(**options)
        .load()
        .transform(to_raw_records)
        .writeStream.queryName(name or f"bronze_{stream.bronze_table.split('/')[-1]}")
        .foreachBatch(sink)
        .option("checkpointLocation", tables.checkpoint)
        .trigger(**trigger)
        .start()
    )


def run_bronze(
    spark: SparkSession,
    conf: LakehouseConf,
    stream_name: str = "orders",
    *,
    once: bool = False,
    progress: bool = True,
) -> StreamingQuery:
    """Run bronze until done (`once`) or until SIGINT/SIGTERM; failures become readable errors.

    Returns the finished query, whose `recentProgress` tells what each batch did.
    """
    stream = conf.stream(stream_name)
    tables = bronze_tables(conf, stream)
    sink = bronze_sink(conf, stream, tables)
    return run_query(
        spark,
        progress_table(spark, conf),
        lambda: start_bronze(spark, conf, stream_name, sink, once=once),
        sink,
        name="bronze",
        what=f"bronze ingest of topic {stream.topic!r} from {conf.kafka.bootstrap_servers} into {tables.raw}",
        progress=progress,
        explain=lambda e: _explain_failure(e, spark, conf, stream, tables),
    )


def _retention_gaps(topic: str, next_offsets: dict[int, int], watermarks) -> list[OffsetGap]:
    """What Kafka deleted between the offsets bronze needs next and what it still holds."""
    lows, highs = ({w.partition: getattr(w, k) for w in watermarks} for k in ("low", "high"))
    return find_retention_gaps(topic, next_offsets, lows, highs)


def _explain_failure(
    e: StreamingQueryException,
    spark: SparkSession,
    conf: LakehouseConf,
    stream: StreamConf,
    tables: BronzeTables,
) -> Exception | None:
    """A Kafka source that lost offsets to retention fails with text only: name the gap; one that
    no broker answered, or one that refused the login, names the servers."""
    if failure := kafka_failure(e, conf, f"bronze ingest of topic {stream.topic!r}"):
        return failure
    lowered = str(e).lower()
    if any(s in lowered for s in ("data loss", "may have been lost", "out of range", "outofrange")):
        resume = checkpoints.resume_offsets(Files(spark), tables.checkpoint, stream.topic) or {}
        watermarks = topic_watermarks(conf, stream.topic, stream.isolation_level)
        gaps = _retention_gaps(stream.topic, resume, watermarks)
        if gaps:
            return RetentionGapError(gaps, conf, tables.name)
    return None
