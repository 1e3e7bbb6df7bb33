"""The progress table: every streaming query's progress as rows of a Delta table, like the progress table
of a managed pipeline: query, batch, input rows, rows/s, durations, watermark, state rows and
Kafka lag per partition, tagged with the job run and task that produced them.

The driver's thread that waits for a query hands each new progress report to `ProgressTable.record`;
rows are appended in small batches (`progress_table.flush_interval_s`) and once more at the end.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from pipelines.config import LakehouseConf

QUERY_PROGRESS_SCHEMA = (
    "event_time timestamp, query_name string, query_id string, query_run_id string, "
    "batch_id bigint, input_rows bigint, input_rows_per_s double, processed_rows_per_s double, "
    "batch_duration_ms bigint, durations_ms map<string,bigint>, watermark string, "
    "state_rows bigint, state_memory_bytes bigint, kafka_lag bigint, "
    "kafka_lag_per_partition map<string,bigint>, sources string, job_run_id string, "
    "task string, host string, event_date string"
)


def kafka_lag_per_partition(latest: str | None, end: str | None) -> dict[str, int] | None:
    """`topic-partition` -> offsets behind the newest record, from a Kafka source's progress."""
    try:
        latest_o, end_o = json.loads(latest or ""), json.loads(end or "")
    except (TypeError, ValueError):
        return None
    if not isinstance(latest_o, dict) or not isinstance(end_o, dict):
        return None
    lags = {}
    for topic, parts in latest_o.items():
        if not isinstance(parts, dict):
            return None  # not a Kafka source: a Delta source reports other offsets
        for p, o in parts.items():
            lags[f"{topic}-{p}"] = max(0, int(o) - int(end_o.get(topic, {}).get(p, 0)))
    return lags


def progress_row(p, job_run_id: str | None = None, task: str | None = None) -> dict:
    """One progress-table row of a StreamingQueryProgress."""
    lags: dict[str, int] = {}
    kafka = False
    for s in p.sources:
        part = kafka_lag_per_partition(s.latestOffset, s.endOffset)
        if part is not None:
            kafka = True
            lags.update(part)
    when = datetime.fromisoformat(p.timestamp.replace("Z", "+00:00"))
    return {
        "event_time": when,
        "query_name": p.name,
        "query_id": str(p.id),
        "query_run_id": str(p.runId),
        "batch_id": p.batchId,
        "input_rows": p.numInputRows,
        "input_rows_per_s": float(p.inputRowsPerSecond or 0.0),
        "processed_rows_per_s": float(p.processedRowsPerSecond or 0.0),
        "batch_duration_ms": int(p.batchDuration),
        "durations_ms": {k: int(v) for k, v in (p.durationMs or {}).items()},
        "watermark": (p.eventTime or {}).get("watermark"),
        "state_rows": sum(op.numRowsTotal for op in p.stateOperators),
        "state_memory_bytes": sum(op.memoryUsedBytes for op in p.stateOperators),
        "kafka_lag": sum(lags.values()) if kafka else None,
        "kafka_lag_per_partition": lags if kafka else None,
        "sources": json.dumps(
            [
                {
                    "description": s.description,
                    "startOffset": s.startOffset,
                    "endOffset": s.endOffset,
                    "latestOffset": s.latestOffset,
                    "numInputRows": s.numInputRows,
                }
                for s in p.sources
            ]
        ),  # fmt: skip
        "job_run_id": job_run_id,
        "task": task,
        "host": socket.gethostname(),
        "event_date": when.strftime("%Y-%m-%d"),
    }


class ProgressTable:
    """Buffers progress rows and appends them to the progress-table table."""

    def __init__(self, spark: SparkSession, conf: LakehouseConf) -> None:
        self.spark = spark
        self.path = conf.table_path(conf.progress_table.table)
        self.interval = conf.progress_table.flush_interval_s
        self.rows: list[dict] = []
        self.last_flush = time.monotonic()
        self.job_run_id = os.environ.get("LAKEHOUSE_JOB_RUN_ID")
        self.task = os.environ.get("LAKEHOUSE_TASK_KEY")
        self.written = 0

    def record(self, progress) -> None:
        self.rows.append(progress_row(progress, self.job_run_id, self.task))
        if time.monotonic() - self.last_flush >= self.interval:
            self.flush()

    def ensure_table(self) -> None:
        ensure_progress_table(self.spark, self.path)

    def flush(self) -> None:
        """Append the buffered rows; a failure is reported and the rows are kept for the next
        flush, never fatal to the job."""
        from pipelines.streaming.delta import retry_on_conflict

        self.last_flush = time.monotonic()
        if not self.rows:
            return
        rows = self.rows
        try:
            ensure_progress_table(self.spark, self.path)
            df = self.spark.createDataFrame(rows, QUERY_PROGRESS_SCHEMA)
            retry_on_conflict(lambda: df.write.format("delta").mode("append").save(self.path),
                              what=self.path)  # fmt: skip
            self.rows = self.rows[len(rows) :]
            self.written += len(rows)
        except Exception as e:  # the log is a courtesy: a failed append must not stop a job
            self.rows = self.rows[-10_000:]
            print(f"progress table: could not append {len(rows)} rows to {self.path} (kept for the next "
                  f"try): {str(e).splitlines()[0][:300]}", file=sys.stderr, flush=True)  # fmt: skip


def is_batch(progress) -> bool:
    """True for a report of a micro-batch that ran; an idle trigger's report carries the next
    batch's id and no `addBatch` duration."""
    return "addBatch" in (progress.durationMs or {})


def ensure_progress_table(spark: SparkSession, path: str) -> None:
    """Create the progress-table table if missing; several jobs starting at once may all try."""
    from delta.tables import DeltaTable

    from pipelines.streaming.delta import retry_on_conflict

    if DeltaTable.isDeltaTable(spark, path):
        return
    schema = spark.createDataFrame([], QUERY_PROGRESS_SCHEMA).schema
    retry_on_conflict(
        lambda: DeltaTable.createIfNotExists(spark).location(path).addColumns(schema)
        .partitionedBy("event_date").property("delta.appendOnly", "true").execute(),
        what=path,
    )  # fmt: skip


__all__ = [
    "QUERY_PROGRESS_SCHEMA",
    "ProgressTable",
    "ensure_progress_table",
    "is_batch",
    "kafka_lag_per_partition",
    "progress_row",
    "UTC",
]
