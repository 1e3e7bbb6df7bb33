"""`lakehouse maintain`: small files compacted, the rows unchanged, files a recent version needs
kept, the log checkpointed."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipelines.config import InvalidConfigError
from pipelines.layers.bronze import ensure_bronze_tables
from pipelines.layers.maintenance import Maintained, maintain
from pipelines.streaming.spark import local_frame

pytestmark = pytest.mark.integration
RAW = "topic string, partition int, offset long, kafka_timestamp timestamp, value binary"


def test_small_files_are_compacted_and_what_time_travel_needs_is_kept(spark, lake):
    ensure_bronze_tables(spark, lake, lake.stream("orders"))
    path = lake.table_path("bronze/orders_raw")
    now = datetime.now(UTC)
    for offset in range(8):  # one file per micro-batch, as a quiet stream writes them
        row = [("t", 0, offset, now, f"v{offset}".encode())]
        batch = local_frame(spark, row, RAW).selectExpr(
            "*",
            "CAST(NULL AS binary) AS key",
            "CAST(NULL AS array<struct<key:string,value:binary>>) AS headers",
            "current_timestamp() AS ingested_at",
        )
        batch.write.format("delta").mode("append").save(path)
    before = spark.read.format("delta").load(path).collect()

    [done] = maintain(spark, lake, ["bronze/orders_raw"])

    # versions: 0 created, 1-8 appended, 9 compacted, 10 and 11 VACUUM's start and end
    assert done == Maintained("bronze/orders_raw", 8, 1, 0, 11)
    after = spark.read.format("delta").load(path)
    assert sorted(after.collect()) == sorted(before)
    # the compacted files are gone from the table, not from storage: version 8 still reads
    assert spark.read.format("delta").option("versionAsOf", 8).load(path).count() == 8
    # and the log is checkpointed at the new version: a reader starts from it, not from 12 JSONs
    log = Path(path) / "_delta_log"
    assert (log / "00000000000000000011.checkpoint.parquet").is_file()
    assert '"version":11' in (log / "_last_checkpoint").read_text()


def test_a_vacuum_retention_shorter_than_a_week_is_refused(lake):
    with pytest.raises(InvalidConfigError, match="maintenance.vacuum_retention_hours"):
        lake.updated({"maintenance.vacuum_retention_hours": 24})
