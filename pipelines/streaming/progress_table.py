"""The progress table: every streaming query's progress as rows of a Delta table, like a managed
pipeline's: query, batch, rows, rows/s, durations, watermark, state rows and Kafka lag per
partition, tagged with the job run and task. `run_query` hands it each batch's report; rows are
appended every `progress_table.flush_interval_s` and once more at the end.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from datetime import datetime

from pyspark.sql import SparkSession

from pipelines import logs
from pipelines.config import ProgressTableConf
from pipelines.streaming.console import kafka_lag_per_partition
from pipelines.streaming.delta import retry_on_conflict
from pipelines.streaming.spark import local_frame
from pipelines.streaming.tables import Table, ensure_table

log = logs.get("progress_table")

SCHEMA = (
    "event_time timestamp, query_name string, query_id string, query_run_id string, "
    "batch_id bigint, input_rows bigint, input_rows_per_s double, processed_rows_per_s double, "
    "batch_duration_ms bigint, durations_ms map<string,bigint>, watermark string, "
    "state_rows bigint, state_memory_bytes bigint, kafka_lag bigint, "
    "kafka_lag_per_partition map<string,bigint>, sources string, job_run_id string, "
    "task string, host string, event_date string"
)
# What the `sources` column keeps of each source's progress.
SOURCE_FIELDS = ("description", "startOffset", "endOffset", "latestOffset", "numInputRows")


def declaration(name: str) -> Table:
    return Table(
        name=name,
        schema=SCHEMA,
        partitioned_by=("event_date",),
        properties={"delta.appendOnly": "true"},
    )


def progress_row(p, job_run_id: str | None = None, task: str | None = None) -> dict:
    """One progress-table row of a StreamingQueryProgress."""
    per_source = [kafka_lag_per_partition(s.latestOffset, s.endOffset) for s in p.sources]
    kafka = [part for part in per_source if part is not None]  # one per Kafka source
    lags = {key: lag for part in kafka for key, lag in part.items()}
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
        "sources": json.dumps([{k: getattr(s, k) for k in SOURCE_FIELDS} for s in p.sources]),
        "job_run_id": job_run_id,
        "task": task,
        "host": socket.gethostname(),
        "event_date": when.strftime("%Y-%m-%d"),
    }


class ProgressTable:
    """Buffers progress rows and appends them to the progress table: every
    `flush_interval_s` in a background thread, so that a query never waits for it, and once more
    at the end (`flush`)."""

    def __init__(self, spark: SparkSession, path: str, settings: ProgressTableConf) -> None:
        self.spark, self.path, self.settings, self.created = spark, path, settings, False
        self.rows: list[dict] = []
        self.last_flush = time.monotonic()
        self.job_run_id = os.environ.get("LAKEHOUSE_JOB_RUN_ID")
        self.task = os.environ.get("LAKEHOUSE_TASK_KEY")
        self._buffer = threading.Lock()  # guards `rows`
        self._writing = threading.Lock()  # one append at a time
        # the table is made ready while the query starts: the last flush is then a plain append
        self._writer = threading.Thread(target=self._append, name="progress-table")
        self._writer.start()

    def record(self, progress) -> None:
        row = progress_row(progress, self.job_run_id, self.task)
        with self._buffer:
            self.rows.append(row)
        if time.monotonic() - self.last_flush >= self.settings.flush_interval_s:
            self.last_flush = time.monotonic()
            if not self._writer.is_alive():
                self._writer = threading.Thread(target=self._append, name="progress-table")
                self._writer.start()

    def flush(self) -> None:
        """Append the buffered rows now (after any append under way)."""
        self._writer.join()
        self._append()

    def _append(self) -> None:
        """Append the buffered rows; on a failure, say so and keep them for the next flush."""
        with self._writing:
            with self._buffer:
                rows, self.rows = self.rows, []
            try:
                if not self.created:
                    table = declaration(self.settings.table)
                    self.created = bool(ensure_table(self.spark, self.path, table))
                if not rows:
                    return
                df = local_frame(self.spark, rows, SCHEMA)
                retry_on_conflict(
                    lambda: df.write.format("delta").mode("append").save(self.path),
                    what=self.path,
                )
            except Exception as e:  # progress is a courtesy: a failed append must not stop a job
                log.warning(
                    "could not append %d rows to %s (kept for the next try): %s",
                    len(rows),
                    self.path,
                    str(e).splitlines()[0][:300],
                )
                with self._buffer:
                    self.rows[:0] = rows[-10_000:]
