"""Bronze against a real broker and real Delta tables: exact, replay-safe, kill-safe."""

from __future__ import annotations

import os
import random
import signal
import socket
import time
from functools import partial
from pathlib import Path

import pytest
from confluent_kafka import TopicPartition

from pipelines.config import LakehouseConf
from pipelines.kafka import admin_client
from pipelines.layers.bronze import RetentionGapError, bronze_tables, run_bronze, start_bronze
from pipelines.reference.orders_stream import StreamOptions, generate_orders_stream
from pipelines.reference.producer import ProduceReport
from tests import helpers
from tests.conftest import subprocess_env
from tests.transactions import TransactionalMix

pytestmark = pytest.mark.integration

TWISTS = dict(
    redelivery_rate=0.1,
    out_of_order_rate=0.2,
    late_rate=0.02,
    invalid_rate=0.05,
    null_key_rate=0.05,
    extra_field_rate=0.05,
)


def produce(conf: LakehouseConf, orders: int, seed: int) -> ProduceReport:
    return helpers.produce(conf, orders, seed, **TWISTS)


def bronze_rows(spark, conf: LakehouseConf) -> list[tuple]:
    """Every bronze row but the ingestion time, sorted by coordinates."""
    df = spark.read.format("delta").load(bronze_tables(conf, conf.streams["orders"]).raw)
    rows = df.drop("ingested_at").collect()
    return sorted(
        (
            (
                r["topic"],
                r["partition"],
                r["offset"],
                r["kafka_timestamp"],
                None if r["key"] is None else bytes(r["key"]),
                bytes(r["value"]),
                tuple((h["key"], bytes(h["value"])) for h in (r["headers"] or [])),
            )
            for r in rows
        ),
        key=lambda t: (t[1], t[2]),
    )


def expected_from(*reports: ProduceReport) -> dict[tuple[int, int], tuple]:
    """The oracle: (partition, offset) -> (key, value, headers) exactly as produced."""
    return {
        (d.partition, d.offset): (d.key, d.value, tuple(d.headers))
        for rep in reports
        for d in rep.delivered
    }


def assert_bronze_matches(spark, conf: LakehouseConf, expected: dict) -> None:
    rows = bronze_rows(spark, conf)
    topic = conf.streams["orders"].topic
    assert len(rows) == len(expected)
    assert len({(r[1], r[2]) for r in rows}) == len(rows), "duplicate coordinates"
    got = {(r[1], r[2]): (r[4], r[5], r[6]) for r in rows}
    assert {r[0] for r in rows} == {topic}
    assert got == expected


def test_once_ingests_every_record_exactly_once_byte_for_byte(spark, lake):
    report = produce(lake, orders=500, seed=21)
    c = report.counts
    assert c["redeliveries"] > 0 and c["invalid_records"] > 0 and c["null_keys"] > 0
    # a backlog of up to 3 caps drains in 3 batches: Spark floors each partition's share of the
    # cap, without slack a last batch of a few records would follow
    capped = lake.updated({"bronze.max_offsets_per_trigger": -(-c["records"] // 3)})
    query = run_bronze(spark, capped, once=True, progress=False)
    assert len([p for p in query.recentProgress if p.numInputRows]) == 3
    assert_bronze_matches(spark, lake, expected_from(report))
    # A second run with nothing new changes nothing.
    run_bronze(spark, lake, once=True, progress=False)
    assert len(bronze_rows(spark, lake)) == c["records"]


def test_a_replayed_batch_is_skipped_by_delta(spark, lake):
    from delta.tables import DeltaTable

    from pipelines.layers.bronze import bronze_sink

    produce(lake, orders=50, seed=5)
    run_bronze(spark, lake, once=True, progress=False)
    tables = bronze_tables(lake, lake.streams["orders"])
    version = DeltaTable.forPath(spark, tables.raw).history(1).first()["version"]
    before = bronze_rows(spark, lake)
    sink = bronze_sink(lake, lake.streams["orders"], tables)
    replay = spark.read.format("delta").load(tables.raw)
    sink(replay, 0)  # batch 0 of this checkpoint again
    assert DeltaTable.forPath(spark, tables.raw).history(1).first()["version"] == version
    assert bronze_rows(spark, lake) == before


def test_sigkill_on_s3_amid_kafka_transactions_then_restart_holds_each_committed_record_once(
    spark, s3_lake, tmp_path
):
    """Bronze on the S3 endpoint reads plain records and Kafka transactions of three producers,
    committed or aborted, one of them open while it runs. SIGKILLed three times, mid-batch or
    between batches, then run to the end once the open transaction committed, the table holds
    exactly the plain and committed records, once, at their offsets (the producers' own record
    is the oracle), and equals an uninterrupted run's on a local disk, record for record."""
    lake = s3_lake
    seed = int(os.environ.get("LAKEHOUSE_TEST_SEED", "1234"))
    rng = random.Random(seed)
    plan = generate_orders_stream(StreamOptions(orders=450, seed=33, **TWISTS))
    records, n = plan.records, len(plan.records)
    mix = TransactionalMix(lake, lake.streams["orders"].topic, seed)
    mix.send(records[: n * 2 // 3])
    held = mix.hold_open(records[n * 2 // 3 : n * 2 // 3 + 30])  # what follows it waits
    mix.send(records[n * 2 // 3 + 30 :])
    mix.finish()
    env = subprocess_env(lake, LAKEHOUSE__BRONZE__MAX_OFFSETS_PER_TRIGGER="100")
    log = tmp_path / "bronze.log"
    raw = bronze_tables(lake, lake.streams["orders"]).raw
    killed = helpers.kill_at_random_instants(
        "pipelines.jobs.bronze_job", env, log, raw, rng, jitter_s=0.4
    )
    assert killed == 3, "the ingest finished before it could be killed: make the stream longer"
    mix.resolve(held, commit=True)
    mix.close()
    fates = mix.counts()
    assert fates["aborted"] > 0 and fates["committed"] > 0 and fates["plain"] > 0, fates
    # the rest in batches of the default size: one; an uninterrupted run on a local disk beside
    # it (every transaction is resolved now)
    env.pop("LAKEHOUSE__BRONZE__MAX_OFFSETS_PER_TRIGGER")
    uninterrupted = lake.updated({"storage.root": str(tmp_path / "reference")})
    with helpers.running_beside(
        partial(run_bronze, spark, uninterrupted, once=True, progress=False)
    ):
        final = helpers.start_job("pipelines.jobs.bronze_job", env, log, "--once")
        assert final.wait(timeout=300) == 0, log.read_text()[-3000:]

    report = mix.stream_report()
    killed_rows = bronze_rows(spark, lake)
    assert len(killed_rows) == len(report.delivered)
    assert killed_rows == bronze_rows(spark, uninterrupted)
    assert_bronze_matches(spark, lake, expected_from(report))


def test_a_lost_checkpoint_on_s3_resumes_after_the_table_offsets(spark, s3_lake):
    lake = s3_lake
    first = produce(lake, orders=800, seed=44)
    small = lake.updated({"bronze.max_offsets_per_trigger": 300})
    query = start_bronze(spark, small, once=False)
    try:
        while query.isActive and len([p for p in query.recentProgress if p.numInputRows]) < 2:
            query.awaitTermination(0.2)
    finally:
        query.stop()
    half = len(bronze_rows(spark, lake))
    assert 0 < half < first.counts["records"], "stopped half-way"
    helpers.remove_tree(bronze_tables(lake, lake.streams["orders"]).checkpoint)
    second = produce(lake, orders=200, seed=45)
    run_bronze(spark, lake, once=True, progress=False)
    assert_bronze_matches(spark, lake, expected_from(first, second))


def _delete_before(conf: LakehouseConf, partition: int, offset: int) -> None:
    topic = conf.streams["orders"].topic
    admin = admin_client(conf)  # keep a reference until the futures resolve
    futures = admin.delete_records([TopicPartition(topic, partition, offset)])
    for f in futures.values():
        f.result(timeout=30)


def test_a_retention_gap_on_s3_stops_the_job_naming_topic_partition_and_range(spark, s3_lake):
    lake = s3_lake
    first = produce(lake, orders=200, seed=55)
    run_bronze(spark, lake, once=True, progress=False)
    in_p0 = sum(1 for d in first.delivered if d.partition == 0)
    second = produce(lake, orders=200, seed=56)
    new_in_p0 = sum(1 for d in second.delivered if d.partition == 0)
    _delete_before(lake, 0, in_p0 + 10)  # Kafka drops 10 records bronze never saw
    topic = lake.streams["orders"].topic
    with pytest.raises(RetentionGapError) as e:
        run_bronze(spark, lake, once=True, progress=False)
    message = str(e.value)
    assert f"topic '{topic}' partition 0: offsets {in_p0}..{in_p0 + 9} (10 records)" in message
    assert "bronze.on_data_loss: record" in message
    assert len(bronze_rows(spark, lake)) == first.counts["records"]  # nothing written

    tolerant = lake.updated(
        {"bronze.on_data_loss": "record", "bronze.max_offsets_per_trigger": None}
    )
    run_bronze(spark, tolerant, once=True, progress=False)
    gaps = spark.read.format("delta").load(bronze_tables(lake, lake.streams["orders"]).gaps)
    assert [
        tuple(r)
        for r in gaps.select(
            "topic", "partition", "from_offset", "to_offset", "missing_records"
        ).collect()
    ] == [(topic, 0, in_p0, in_p0 + 9, 10)]
    expected = {
        k: v
        for k, v in expected_from(first, second).items()
        if not (k[0] == 0 and in_p0 <= k[1] < in_p0 + 10)
    }
    assert len(expected) == first.counts["records"] + second.counts["records"] - 10
    assert new_in_p0 > 10
    assert_bronze_matches(spark, lake, expected)
    # Running again records the gap no second time and adds nothing.
    run_bronze(spark, tolerant, once=True, progress=False)
    assert gaps.count() == 1
    assert len(bronze_rows(spark, lake)) == len(expected)


def test_continuous_job_keeps_up_then_stops_cleanly_on_sigterm(spark, lake, tmp_path):
    report = produce(lake, orders=200, seed=66)
    log = tmp_path / "continuous.log"
    env = subprocess_env(lake, LAKEHOUSE__BRONZE__TRIGGER_INTERVAL="1 second")
    proc = helpers.start_job("pipelines.jobs.bronze_job", env, log)
    try:
        raw = Path(bronze_tables(lake, lake.streams["orders"]).raw)
        deadline = time.monotonic() + 120
        while not (raw / "_delta_log" / "00000000000000000001.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.1)
        # a second copy on the same checkpoint refuses to start, naming the running one
        second_log = tmp_path / "second.log"
        second = helpers.start_job("pipelines.jobs.bronze_job", env, second_log, "--once")
        assert second.wait(timeout=180) == 6, second_log.read_text()[-2000:]
        checkpoint = bronze_tables(lake, lake.streams["orders"]).checkpoint
        holder = f"checkpoint {checkpoint} is in use by the bronze job on {socket.gethostname()}"
        assert f"{holder}, pid {proc.pid}, since " in second_log.read_text()
        more = produce(lake, orders=100, seed=67)  # arrives while the job runs
        expected = expected_from(report, more)
        while len(bronze_rows(spark, lake)) < len(expected):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(0.5)
        os.kill(proc.pid, signal.SIGTERM)  # as `kill PID` does (group-wide stops: test_jobs.py)
        assert proc.wait(timeout=60) == 0, log.read_text()[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert "SIGTERM received" in log.read_text()
    assert_bronze_matches(spark, lake, expected)
