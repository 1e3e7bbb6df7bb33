"""`lakehouse maintain`: small files compacted, the rows unchanged, files a recent version needs
kept, the log checkpointed."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from deltalake import DeltaTable as DeltaLake
from deltalake.exceptions import TableNotFoundError

from pipelines.config import InvalidConfigError
from pipelines.layers.bronze import ensure_bronze_tables
from pipelines.layers.gold import gold_tables, seed_dimensions
from pipelines.layers.maintenance import (
    Maintained,
    Reader,
    after_next_commit,
    maintain,
    retention_hours,
    stream_readers,
)
from pipelines.layers.publish import POSITION_FILE
from pipelines.layers.silver import silver_tables
from pipelines.streaming.spark import local_frame
from pipelines.streaming.tables import clustering_columns
from tests import helpers
from tests.conftest import subprocess_env
from tests.integration.test_gold import START, gold_oracle, produce, seeds, table
from tests.integration.test_silver import ORDER_COLUMNS, assert_silver_matches, oracle
from tests.integration.test_silver import table as columns_of

pytestmark = pytest.mark.integration
RAW = "topic string, partition int, offset long, kafka_timestamp timestamp, value binary"


def live_files(path: str) -> int:
    """The files of a table's current version (0 before it exists)."""
    try:
        return len(DeltaLake(path).file_uris())
    except TableNotFoundError:
        return 0


def append_rows(spark, path: str, offsets: range) -> None:
    """One commit (one file) per row, as a quiet stream writes them."""
    now = datetime.now(UTC)
    for offset in offsets:
        row = [("t", 0, offset, now, f"v{offset}".encode())]
        batch = local_frame(spark, row, RAW).selectExpr(
            "*",
            "CAST(NULL AS binary) AS key",
            "CAST(NULL AS array<struct<key:string,value:binary>>) AS headers",
            "current_timestamp() AS ingested_at",
        )
        batch.write.format("delta").mode("append").save(path)


def test_small_files_are_compacted_and_what_time_travel_needs_is_kept(spark, lake):
    ensure_bronze_tables(spark, lake, lake.stream("orders"))
    path = lake.table_path("bronze/orders_raw")
    # a table whose own retention keeps nothing: VACUUM still keeps the configured 168 h (Delta
    # 4.4 ignores VACUUM's RETAIN by default and took the table's, deleting every removed file)
    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
        "('delta.deletedFileRetentionDuration' = 'interval 0 hours')"
    )
    append_rows(spark, path, range(4))
    before = spark.read.format("delta").load(path).collect()

    [done] = maintain(spark, lake, ["bronze/orders_raw"])

    # versions: 0 created, 1 its property, 2-5 appended, 6 compacted, 7 and 8 VACUUM's start
    # and end
    assert done == Maintained("bronze/orders_raw", 4, 1, 0, (4, 1), 8)
    after = spark.read.format("delta").load(path)
    assert sorted(after.collect()) == sorted(before)
    # the log is checkpointed at the new version: a reader starts from it, not from 9 JSONs
    log = Path(path) / "_delta_log"
    assert (log / "00000000000000000008.checkpoint.parquet").is_file()
    assert '"version":8' in (log / "_last_checkpoint").read_text()
    # the compacted files are gone from the table, not from storage: version 5 still reads (once
    # the table allows time travel that far again)
    spark.sql(
        f"ALTER TABLE delta.`{path}` UNSET TBLPROPERTIES ('delta.deletedFileRetentionDuration')"
    )
    assert spark.read.format("delta").option("versionAsOf", 5).load(path).count() == 4


def test_a_retried_optimize_starts_right_after_the_writers_next_commit(spark, lake):
    """OPTIMIZE loses to a MERGE that rewrites a file it read; its retry waits for the stream's
    next commit, to have the whole interval before the one after."""
    ensure_bronze_tables(spark, lake, lake.stream("orders"))
    path = lake.table_path("bronze/orders_raw")
    version = DeltaLake(path).version()
    writer = threading.Thread(target=append_rows, args=(spark, path, range(2)))
    writer.start()
    assert after_next_commit(spark, path, since=version) in (
        f"right after version {version + 1}",
        f"right after version {version + 2}",  # both commits landed within one poll
    )
    writer.join()
    quiet = after_next_commit(spark, path, since=version + 2, timeout_s=1.0)
    assert quiet == "after 1 s without a commit"


def test_vacuum_keeps_what_a_streaming_reader_far_behind_still_has_to_read(spark, lake):
    """A reader's checkpoint says which version it read last; when the next one is older than
    the retention, VACUUM keeps files long enough for it (whole hours, one to spare)."""
    ensure_bronze_tables(spark, lake, lake.stream("orders"))
    path = lake.table_path("bronze/orders_raw")
    append_rows(spark, path, range(3))  # versions 1-3
    checkpoint = f"{lake.root}/_checkpoints/tests/reader"
    query = (
        spark.readStream.format("delta")
        .load(path)
        .writeStream.format("noop")
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    append_rows(spark, path, range(3, 5))  # versions 4 and 5: not read yet

    # and the publish job's position, as it copies it beside its lease
    publisher = f"{lake.root}/_checkpoints/publish/orders"
    os.makedirs(publisher)
    table_id = DeltaTable.forPath(spark, path).detail().first()["id"]
    with open(f"{publisher}/{POSITION_FILE}", "w") as f:
        json.dump({"next_versions": {table_id: 2}}, f)

    readers = stream_readers(spark, lake)
    # read through 3: 4 is next; the publisher has published version 1: 2 is next
    assert readers == [Reader(publisher, table_id, 2), Reader(checkpoint, table_id, 4)]
    now = datetime.now(UTC)
    name = "bronze/orders_raw"
    assert retention_hours(spark, lake, name, path, readers, now) == 168
    # ten days on, version 4 was committed 240 h and a few seconds ago
    later = now + timedelta(days=10)
    assert retention_hours(spark, lake, name, path, readers, later) == 242
    caught_up = [Reader(checkpoint, table_id, 6)]
    assert retention_hours(spark, lake, name, path, caught_up, later) == 168
    other_table = [Reader(checkpoint, "another-table-id", 0)]
    assert retention_hours(spark, lake, name, path, other_table, later) == 168
    # a table that keeps its removed files longer than the configuration says keeps them so
    spark.sql(
        f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES "
        "('delta.deletedFileRetentionDuration' = 'interval 30 days')"
    )
    assert retention_hours(spark, lake, name, path, caught_up, later) == 720


def test_a_vacuum_retention_shorter_than_a_week_is_refused(lake):
    with pytest.raises(InvalidConfigError, match="maintenance.vacuum_retention_hours"):
        lake.updated({"maintenance.vacuum_retention_hours": 24})


def test_maintenance_while_silver_and_gold_merge_continuously_loses_and_doubles_nothing(
    spark, lake, tmp_path
):
    """The continuous pipeline job (`lakehouse run pipeline`: one query from Kafka to gold, a
    second one MERGEing the events' new rows into the state table on its own trigger) MERGEs the
    state and the gold tables in small batches while maintenance runs over and over beside it:
    OPTIMIZE (clustering, Z-order) and VACUUM commits land between the stream's, no batch fails
    (one run; a SIGTERM stops both queries between batches, exit 0), the small files are
    compacted, and every table equals its oracle: nothing lost, nothing counted twice."""
    seed_dimensions(spark, lake)
    products, customers = seeds(lake, "products"), seeds(lake, "customers")
    tables = gold_tables(lake)
    silver = silver_tables(lake, lake.streams["orders"])
    names = ["silver/order_events", "silver/orders", *tables.aggregates]
    paths = [lake.table_path(n) for n in names]
    env = subprocess_env(
        lake,
        LAKEHOUSE__PIPELINE__MAX_OFFSETS_PER_TRIGGER="60",  # small batches: small files
        LAKEHOUSE__PIPELINE__STATE_TRIGGER_INTERVAL="1 second",
    )
    log = tmp_path / "pipeline.log"
    rounds: list[list[Maintained]] = []
    stop = threading.Event()

    def maintain_over_and_over() -> None:
        while not stop.is_set():
            rounds.append(maintain(spark, lake, names))
            stop.wait(1.0)  # the stream's batches go on between rounds

    def wait_for(done, what: str) -> None:
        deadline = time.monotonic() + 300
        while not done():
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, f"{what}: {log.read_text()[-3000:]}"
            time.sleep(0.5)

    reports, start = [], START

    def send(seed: int, orders: int) -> None:
        nonlocal start
        reports.append(produce(lake, seed, orders, start))
        start = max(e[9] for e in oracle(reports[-1])["events"].values()) + timedelta(0, 1)
        start = start.replace(tzinfo=UTC)

    send(95, 40)  # ~100 records: a few batches, each MERGE its own small files
    proc = helpers.start_job("pipelines.jobs.pipeline_job", env, log)
    worker = threading.Thread(target=maintain_over_and_over)
    try:
        # several files in the MERGE target and the events table (several commits alone are
        # not: creating a table takes more than one, and a MERGE may rewrite its one file)
        wait_for(
            lambda: (
                all(helpers.delta_commits(p) > 2 for p in paths)
                and min(live_files(silver.state), live_files(silver.events)) > 1
            ),
            "first MERGEs",
        )
        worker.start()
        send(96, 20)  # the stream goes on, maintenance with it
        wait_for(lambda: rounds, "a first maintenance round")
        send(97, 20)  # these MERGEs come after the first round's OPTIMIZE
        expected = oracle(*reports)
        gold = gold_oracle((list(expected["events"].values()), products, customers))
        orders = sorted(expected["orders"].values())
        wait_for(
            helpers.on_commit(
                [silver.state, *tables.aggregates.values()],
                lambda: (
                    columns_of(spark, silver.state, ORDER_COLUMNS) == orders
                    and tuple(table(spark, p) for p in tables.aggregates.values()) == gold
                ),
            ),
            "the state and gold tables to match their oracles",
        )
    finally:
        stop.set()
        if worker.is_alive():
            worker.join()
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=120)
    assert code == 0, log.read_text()[-3000:]
    text = log.read_text()
    assert text.count("query pipeline_orders started") == 1  # never restarted: no failed batch
    assert text.count("query silver_orders_state started") == 1
    assert "SIGTERM received" in text

    # maintenance and the stream's MERGEs interleave: a MERGE before and after an OPTIMIZE
    for path in (silver.state, *tables.aggregates.values()):
        ops = [r["operation"] for r in DeltaTable.forPath(spark, path).history().collect()][::-1]
        first = ops.index("OPTIMIZE")
        assert "MERGE" in ops[:first] and "MERGE" in ops[first:], (path, ops)
    # the first round compacted the small files of the MERGE target and the events table (a
    # small gold table stays one file: each MERGE rewrites the file it updates)
    first = {d.table: d.compacted for d in rounds[0]}
    assert first["silver/orders"][0] > 1 and first["silver/orders"][1] == 1, rounds[0]
    assert first["silver/order_events"][0] > first["silver/order_events"][1] > 0, rounds[0]

    # with the stream stopped: each table (each events partition) in one file, and every table
    # still its oracle
    final = {d.table: d for d in maintain(spark, lake, names)}
    days = spark.read.format("delta").load(silver.events).select("event_date").distinct().count()
    assert [final[n].files_after for n in names] == [days, 1, 1, 1]
    assert_silver_matches(spark, lake, expected)
    assert tuple(table(spark, p) for p in tables.aggregates.values()) == gold
    assert clustering_columns(spark, silver.state) == ("order_id",)
    assert clustering_columns(spark, tables.aggregates["gold/revenue_by_category_1m"]) == (
        "window_start",
    )
