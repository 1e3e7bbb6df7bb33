"""Kafka's own transactions: only committed records belong to the stream, through every layer."""

from __future__ import annotations

import os
import shutil

import pytest
from pyspark.sql import functions as F

from pipelines.kafka import stable_offsets
from pipelines.layers.bronze import bronze_tables, run_bronze
from pipelines.layers.gold import gold_tables, run_gold, seed_dimensions
from pipelines.layers.silver import run_silver
from pipelines.reference.orders_stream import StreamOptions, generate_orders_stream
from tests.integration.test_gold import gold_oracle, seeds, table
from tests.integration.test_silver import TWISTS, assert_silver_matches, oracle
from tests.transactions import TransactionalMix

pytestmark = pytest.mark.integration

# no event ten minutes late: gold is then the oracle's whatever the micro-batches
ON_TIME = {k: v for k, v in TWISTS.items() if k != "late_rate"}


def bronze_rows(spark, conf) -> list[tuple]:
    raw = spark.read.format("delta").load(bronze_tables(conf, conf.streams["orders"]).raw)
    return sorted(
        (r["partition"], r["offset"], r["key"], r["value"])
        for r in raw.select("partition", "offset", "key", "value").collect()
    )


def expected_rows(report) -> list[tuple]:
    return sorted((d.partition, d.offset, d.key, d.value) for d in report.delivered)


def test_only_committed_records_reach_the_tables_through_open_transactions_and_a_lost_checkpoint(
    spark, lake
):
    """A seeded mix of plain records and transactions from three transactional producers over
    four partitions: committed ones, aborted ones (their records are real events: read, they would
    be counted), one left open then committed and one left open then aborted.

    1. While both are open, bronze holds exactly the committed and plain records below each
       partition's last stable offset (what follows an open transaction waits), once, at their
       offsets.
    2. The open transactions end (one commits, one aborts) and more records come; bronze's
       checkpoint is lost: it resumes right after the offsets its table holds, and holds exactly
       every committed and plain record once; no gap, no lag is reported for the offsets of
       transaction markers and aborted records.
    3. Silver and gold equal their oracles, computed from the committed records only.
    (Bronze SIGKILLed amid transactions: test_bronze; the pipeline job on transactions, killed,
    its checkpoint lost: test_pipeline.)"""
    seed = int(os.environ.get("LAKEHOUSE_TEST_SEED", "3737"))
    topic = lake.streams["orders"].topic
    plan = generate_orders_stream(StreamOptions(orders=240, seed=seed % 1000, **ON_TIME))
    records, n = plan.records, len(plan.records)
    mix = TransactionalMix(lake, topic, seed)
    cut = [round(n * f) for f in (0.35, 0.42, 0.6, 0.66, 0.82)]
    mix.send(records[: cut[0]])
    to_commit = mix.hold_open(records[cut[0] : cut[1]])
    mix.send(records[cut[1] : cut[2]])
    to_abort = mix.hold_open(records[cut[2] : cut[3]])
    mix.send(records[cut[3] : cut[4]])
    mix.finish()
    stable = {s.partition: s.stable for s in stable_offsets(lake, topic)}
    held = sum(s.held_back for s in stable_offsets(lake, topic))
    assert held > 0, "the open transactions hold nothing back"

    # 1. bronze, while two transactions are open
    tables = bronze_tables(lake, lake.streams["orders"])
    run_bronze(spark, lake, once=True, progress=False)
    assert bronze_rows(spark, lake) == expected_rows(mix.stream_report(below=stable))

    # 2. the open transactions end, more records come, and the checkpoint is lost
    mix.resolve(to_commit, commit=True)
    mix.resolve(to_abort, commit=False)
    mix.send(records[cut[4] :])
    mix.finish()
    mix.close()
    fates = mix.counts()
    assert fates["aborted"] > 0 and fates["committed"] > 0 and fates["plain"] > 0, fates
    shutil.rmtree(tables.checkpoint)
    recording = lake.updated({"bronze.on_data_loss": "record"})  # a gap would be recorded, not fail
    run_bronze(spark, recording, once=True, progress=False)
    report = mix.stream_report()
    assert bronze_rows(spark, lake) == expected_rows(report)
    gaps = tables.gaps
    assert not os.path.exists(gaps) or spark.read.format("delta").load(gaps).count() == 0
    progress = spark.read.format("delta").load(lake.table_path(lake.progress_table.table))
    bronze = progress.where(F.col("query_name").startswith("bronze"))
    last = bronze.orderBy("event_time").collect()[-1]  # its lag counts to the last stable offset
    assert last["kafka_lag"] == 0, last

    # 3. silver and gold: the committed records only
    seed_dimensions(spark, lake)
    run_silver(spark, lake, once=True, progress=False)
    run_gold(spark, lake, once=True, progress=False)
    expected = oracle(report)
    assert_silver_matches(spark, lake, expected)
    g = gold_tables(lake)
    phase = (list(expected["events"].values()), seeds(lake, "products"), seeds(lake, "customers"))
    assert (
        table(spark, g.aggregates["gold/revenue_by_category_1m"]),
        table(spark, g.aggregates["gold/orders_by_country_5m"]),
    ) == gold_oracle(phase)
