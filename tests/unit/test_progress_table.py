"""Event-log rows from streaming progress reports: rows, rates, durations, state and Kafka lag."""

from __future__ import annotations

import json
from datetime import UTC, datetime

from pyspark.sql.streaming.listener import StreamingQueryProgress

from pipelines.streaming.console import is_batch, kafka_lag_per_partition
from pipelines.streaming.progress_table import progress_row


def _progress(sources: list[dict], state_ops: list[dict] | None = None) -> StreamingQueryProgress:
    return StreamingQueryProgress.fromJson(
        {
            "id": "11111111-1111-1111-1111-111111111111",
            "runId": "22222222-2222-2222-2222-222222222222",
            "name": "bronze_orders_raw",
            "timestamp": "2026-11-23T01:02:03.456Z",
            "batchId": 7,
            "batchDuration": 1234,
            "durationMs": {"addBatch": 900, "triggerExecution": 1234},
            "eventTime": {},
            "stateOperators": state_ops or [],
            "sources": sources,
            "sink": {"description": "ForeachBatchSink", "numOutputRows": -1},
            "numInputRows": 500,
            "inputRowsPerSecond": 250.0,
            "processedRowsPerSecond": 405.2,
            "observedMetrics": {},
        }
    )


def _kafka_source(end: dict, latest: dict) -> dict:
    return {
        "description": "KafkaV2[Subscribe[orders]]",
        "startOffset": json.dumps({"orders": {"0": 0}}),
        "endOffset": json.dumps(end),
        "latestOffset": json.dumps(latest),
        "numInputRows": 500,
        "inputRowsPerSecond": 250.0,
        "processedRowsPerSecond": 405.2,
        "metrics": {},
    }


def test_a_kafka_batch_becomes_one_row_with_lag_per_partition():
    p = _progress(
        [_kafka_source({"orders": {"0": 300, "1": 200}}, {"orders": {"0": 350, "1": 200}})]
    )
    row = progress_row(p, job_run_id="17", task="bronze")
    assert row["event_time"] == datetime(2026, 11, 23, 1, 2, 3, 456000, tzinfo=UTC)
    assert (row["query_name"], row["batch_id"], row["input_rows"]) == ("bronze_orders_raw", 7, 500)
    assert (row["input_rows_per_s"], row["processed_rows_per_s"]) == (250.0, 405.2)
    assert row["batch_duration_ms"] == 1234
    assert row["durations_ms"] == {"addBatch": 900, "triggerExecution": 1234}
    assert row["kafka_lag"] == 50 and row["kafka_lag_per_partition"] == {
        "orders-0": 50,
        "orders-1": 0,
    }
    assert (row["state_rows"], row["watermark"], row["job_run_id"], row["task"]) == (
        0,
        None,
        "17",
        "bronze",
    )
    assert row["event_date"] == "2026-11-23"


def test_a_delta_source_has_no_kafka_lag_and_state_rows_are_summed():
    delta = {
        "description": "DeltaSource[file:/lake/silver/order_events]",
        "startOffset": json.dumps({"reservoirVersion": 3, "index": -1}),
        "endOffset": json.dumps({"reservoirVersion": 5, "index": -1}),
        "latestOffset": None,
        "numInputRows": 500,
        "inputRowsPerSecond": 1.0,
        "processedRowsPerSecond": 1.0,
        "metrics": {},
    }
    op = {
        "operatorName": "dedupe",
        "numRowsTotal": 40,
        "numRowsUpdated": 2,
        "allUpdatesTimeMs": 1,
        "numRowsRemoved": 0,
        "allRemovalsTimeMs": 0,
        "commitTimeMs": 1,
        "memoryUsedBytes": 1000,
        "numRowsDroppedByWatermark": 0,
        "numShufflePartitions": 4,
        "numStateStoreInstances": 4,
        "customMetrics": {},
    }
    row = progress_row(_progress([delta], [op, {**op, "numRowsTotal": 2, "memoryUsedBytes": 24}]))
    assert row["kafka_lag"] is None and row["kafka_lag_per_partition"] is None
    assert (row["state_rows"], row["state_memory_bytes"]) == (42, 1024)


def test_kafka_lag_per_partition_ignores_other_offsets():
    assert kafka_lag_per_partition('{"t": {"0": 5}}', '{"t": {"0": 7}}') == {"t-0": 0}
    assert kafka_lag_per_partition('{"t": {"0": 9, "1": 3}}', '{"t": {"0": 7}}') == {
        "t-0": 2,
        "t-1": 3,
    }
    assert kafka_lag_per_partition('{"reservoirVersion": 3}', '{"reservoirVersion": 1}') is None
    assert kafka_lag_per_partition(None, "{}") is None


def test_an_idle_trigger_is_not_a_batch():
    ran = _progress([_kafka_source({"t": {"0": 1}}, {"t": {"0": 1}})])
    idle = StreamingQueryProgress.fromJson(
        {**json.loads(ran.json), "durationMs": {"latestOffset": 3, "triggerExecution": 3}}
    )
    assert is_batch(ran) and not is_batch(idle)


def test_driver_rows_go_to_spark_as_arrow_with_the_same_values_as_create_dataframe(spark):
    """local_frame equals pyspark's createDataFrame (Python workers) on every type the progress
    table holds: naive and aware timestamps, maps, nulls, tuples and dicts."""
    from chispa import assert_df_equality

    from pipelines.streaming.progress_table import SCHEMA
    from pipelines.streaming.spark import local_frame

    names = [f.split(" ")[0] for f in SCHEMA.split(", ")]
    full = progress_row(_progress([_kafka_source({"orders": {"0": 9}}, {"orders": {"0": 12}})]))
    naive = {**full, "event_time": datetime(2026, 11, 23, 1, 2, 3, 456000), "sources": None}
    aware = {**full, "event_time": datetime(2026, 11, 23, 1, 2, 3, tzinfo=UTC)}
    rows = [full, naive, aware, {"batch_id": 1, "durations_ms": {}}]
    dicts = [{n: r.get(n) for n in names} for r in rows]
    expected = spark.createDataFrame([tuple(d.values()) for d in dicts], SCHEMA)
    assert_df_equality(local_frame(spark, dicts, SCHEMA), expected)
    assert_df_equality(local_frame(spark, [tuple(d.values()) for d in dicts], SCHEMA), expected)
    assert local_frame(spark, [], SCHEMA).count() == 0
