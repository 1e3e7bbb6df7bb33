"""Gold to Kafka: every change of a gold table once, in version order, whatever kills the job."""

from __future__ import annotations

import json
import logging
import os
import random
import re
import signal
import socket
import threading
import time
from datetime import UTC
from decimal import Decimal

import pytest
from confluent_kafka import Consumer, TopicPartition
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from pipelines.errors import JobFailedError
from pipelines.kafka import admin_client, client_settings, stable_offsets
from pipelines.layers.gold import gold_tables, seed_dimensions
from pipelines.layers.pipeline import run_pipeline
from pipelines.layers.publish import (
    GoldPublisher,
    PublisherFencedError,
    publication,
    run_publish,
)
from pipelines.local import broker
from pipelines.reference.orders_stream import StreamOptions, generate_orders_stream
from pipelines.reference.producer import produce_plan
from pipelines.streaming.lease import CheckpointInUseError
from tests import helpers
from tests.conftest import subprocess_env
from tests.integration.test_silver import TWISTS

pytestmark = pytest.mark.integration

ON_TIME = {k: v for k, v in TWISTS.items() if k != "late_rate"}
JOB = "pipelines.jobs.publish_job"


def read_topic(conf, topic: str, isolation: str = "read_committed") -> list:
    """Every message of partition 0 of `topic`, in offset order, as a consumer of `isolation`."""
    settings = client_settings(conf) | {
        "group.id": "test-read",
        "enable.auto.commit": False,
        "isolation.level": isolation,
        "enable.partition.eof": True,
    }
    consumer = Consumer(settings)
    consumer.assign([TopicPartition(topic, 0, 0)])
    found, deadline = [], time.monotonic() + 60
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                assert msg.error().code() == msg.error()._PARTITION_EOF, msg.error().str()
                return found
            found.append(msg)
    finally:
        consumer.close()
    raise AssertionError(f"{topic}: no end in 60 s")


def as_json(value):
    """A table value as the contract writes it in JSON (the test's own encoding)."""
    if isinstance(value, Decimal):
        return str(value)
    if hasattr(value, "isoformat"):
        text = value.replace(tzinfo=UTC).isoformat().replace("+00:00", "Z")
        return text
    return value


def row_json(row, columns: list[str]) -> dict:
    return {c: as_json(row[c]) for c in columns}


def message(msg) -> tuple[int, str, str, str | None]:
    """(version, change, key, value) of a published message, key and value as canonical JSON."""
    headers = dict(msg.headers())
    value = msg.value()
    return (
        int(headers["lakehouse.version"]),
        headers["lakehouse.change"].decode(),
        json.dumps(json.loads(msg.key()), sort_keys=True),
        None if value is None else json.dumps(json.loads(value), sort_keys=True),
    )


def expected_messages(spark, path: str, keys: list[str], first: int, snapshot: bool, last: int):
    """What the topic must hold from `first` (its rows if `snapshot`, else its changes) to
    `last`, from the table's own history (Delta's change data feed), sorted within a version."""
    reader = spark.read.format("delta")
    columns = [f.name for f in reader.load(path).schema.fields]
    found = []
    if snapshot:
        for r in reader.option("versionAsOf", first).load(path).collect():
            found.append((first, "snapshot", row_json(r, keys), row_json(r, columns)))
    start = first + 1 if snapshot else first
    if start <= last:
        changes = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", start)
            .option("endingVersion", last)
            .load(path)
            .where("_change_type <> 'update_preimage'")
            .collect()
        )
        for r in changes:
            deleted = r["_change_type"] == "delete"
            value = None if deleted else row_json(r, columns)
            found.append((r["_commit_version"], r["_change_type"], row_json(r, keys), value))
    canonical = [
        (v, c, json.dumps(k, sort_keys=True), None if x is None else json.dumps(x, sort_keys=True))
        for v, c, k, x in found
    ]
    return sorted(canonical)


def assert_published_exactly(spark, conf) -> dict[str, int]:
    """Each gold topic, read committed: every change of its table once, versions in order, and
    folded by key the table itself. Returns the messages per table."""
    stream, counts = conf.stream("orders"), {}
    g = gold_tables(conf)
    for name, path in g.aggregates.items():
        keys = __import__(stream.module(name), fromlist=["KEY_COLUMNS"]).KEY_COLUMNS
        got = [message(m) for m in read_topic(conf, stream.gold_topic(name))]
        assert got, name
        versions = [v for v, *_ in got]
        assert versions == sorted(versions), f"{name}: not in version order"
        last = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").agg({"version": "max"}).first()[0]
        first, snapshot = got[0][0], got[0][1] == "snapshot"
        assert sorted(got) == expected_messages(spark, path, keys, first, snapshot, last), name
        folded = {}
        for _, _, key, value in got:
            folded[key] = value
        columns = spark.read.format("delta").load(path).columns
        rows = spark.read.format("delta").load(path).collect()
        table = {
            json.dumps(row_json(r, keys), sort_keys=True): json.dumps(
                row_json(r, columns), sort_keys=True
            )
            for r in rows
        }
        assert {k: v for k, v in folded.items() if v is not None} == table, name
        counts[name] = len(got)
    return counts


def held_back(conf, topic: str, admin) -> int:
    """Offsets of `topic` behind a transaction still open."""
    return sum(s.held_back for s in stable_offsets(conf, topic, admin))


def stable(conf, topics: list[str], admin) -> int:
    return sum(s.stable for t in topics for s in stable_offsets(conf, t, admin))


def test_the_publish_job_killed_at_any_instant_publishes_every_gold_change_once_in_version_order(
    spark, lake, tmp_path, caplog
):
    """The pipeline job changes gold in small batches while the stream is being produced; the
    publish job runs beside it and is SIGKILLed three times: while a transaction is open, right
    after a commit, and at a random instant. A second copy started meanwhile is refused, naming
    the first. Then it runs to the end: each gold topic, read committed, holds every
    change of its table once, in version order (the table's own change data feed is the oracle),
    and folded by key it is the table, row for row; read uncommitted, it also holds what the
    killed transactions sent. Last, a publisher fenced by a newer one stops with a readable
    error, and nothing is published twice. And a publisher whose transaction Kafka aborts in an
    outage longer than the transaction timeout fails naming the brokers; back, its next
    transaction commits at the first attempt."""
    seed = int(os.environ.get("LAKEHOUSE_TEST_SEED", "2468"))
    rng = random.Random(seed)
    seed_dimensions(spark, lake)
    stream = lake.stream("orders")
    topics = [stream.gold_topic(t) for t in stream.gold_tables]
    plan = generate_orders_stream(
        StreamOptions(orders=260, seed=seed % 1000, events_per_second=2.0, **ON_TIME)
    )
    producing = threading.Thread(
        target=produce_plan,
        args=(lake, plan, stream.topic),
        kwargs={"rate": len(plan.records) / 30},
    )
    producing.start()
    env = subprocess_env(
        lake,
        LAKEHOUSE__PIPELINE__MAX_OFFSETS_PER_TRIGGER="40",
        LAKEHOUSE__PUBLISH__TRIGGER_INTERVAL="200 milliseconds",
    )
    admin = admin_client(lake)
    pipeline_log = tmp_path / "pipeline.log"
    pipeline = helpers.start_job("pipelines.jobs.pipeline_job", env, pipeline_log)
    gold = gold_tables(lake).aggregates.values()
    try:
        # a first publisher starts once both tables hold rows: its first transaction has the
        # rows of both, the second read (a cold JVM's first) while the first's wait uncommitted
        helpers.wait_for(
            lambda: all(helpers.delta_commits(t) >= 2 for t in gold), pipeline, pipeline_log
        )
        for i, kill in enumerate(("in a transaction", "after a commit", "random")):
            log = tmp_path / f"publish-{i}.log"
            job = helpers.start_job(JOB, env, log)
            helpers.wait_for(lambda log=log: "[publish]" in log.read_text(), job, log)
            if kill == "in a transaction":
                helpers.wait_for(lambda: held_back(lake, topics[0], admin) > 0, job, log)
            elif kill == "after a commit":
                before = stable(lake, topics, admin)
                helpers.wait_for(
                    lambda before=before: stable(lake, topics, admin) > before, job, log
                )
                # a second copy (this process) is refused, naming the first
                holder = f"is in use by the publish job on {socket.gethostname()}, pid {job.pid}"
                with pytest.raises(CheckpointInUseError, match=re.escape(holder)):
                    run_publish(spark, lake, once=True, progress=False)
            else:
                time.sleep(rng.uniform(0.0, 4.0))
            assert job.poll() is None, log.read_text()[-3000:]
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    finally:
        producing.join()
        pipeline.send_signal(signal.SIGTERM)
        assert pipeline.wait(timeout=180) == 0, pipeline_log.read_text()[-3000:]
    run_pipeline(spark, lake, once=True, progress=False)  # whatever the job left
    run_publish(spark, lake, once=True, progress=False)  # the last run, to the end
    counts = assert_published_exactly(spark, lake)
    uncommitted = sum(len(read_topic(lake, t, "read_uncommitted")) for t in topics)
    assert uncommitted > sum(counts.values())  # the kill in a transaction left messages aborted

    # two publishers in this process, as if a second had taken the lease of a frozen first: the
    # newer one's start fences the older one in Kafka, whose next transaction fails saying so;
    # the newer one publishes two more versions (a row deleted: a tombstone; one updated)
    older = GoldPublisher(spark, publication(lake, "orders"))
    older.open()
    assert older.publish_round() is None  # everything is published
    path = gold_tables(lake).aggregates["gold/revenue_by_category_1m"]
    rows = spark.read.format("delta").load(path).orderBy("window_start", "category").collect()
    gold_table = DeltaTable.forPath(spark, path)
    gold_table.delete(F.col("window_start") == rows[0]["window_start"])
    gold_table.update(F.col("window_start") == rows[-1]["window_start"], {"units": F.lit(1)})
    newer = GoldPublisher(spark, publication(lake, "orders"))
    newer.open()  # fences the older one
    with pytest.raises(PublisherFencedError, match="another publisher with transactional id"):
        older.publish_round()
    done = newer.publish_round()
    assert done is not None and list(done.versions) == ["gold/revenue_by_category_1m"]
    first, last = done.versions["gold/revenue_by_category_1m"]
    assert last == first + 1 and newer.publish_round() is None
    older.close()
    newer.close()
    counts = assert_published_exactly(spark, lake)
    changes = [message(m)[1] for m in read_topic(lake, topics[0])]
    deleted = sum(r["window_start"] == rows[0]["window_start"] for r in rows)
    assert changes.count("delete") == deleted and changes[-1] == "update_postimage"
    assert counts["gold/revenue_by_category_1m"] == len(changes)
    # a run from scratch resumes where the newer one stopped: nothing to publish
    assert run_publish(spark, lake, once=True, progress=False) == []

    # every broker down while a transaction is open, longer than its timeout: its messages time
    # out, Kafka aborts it, and the publisher stops naming the brokers. Back, the same publisher's
    # next transaction commits at once (a producer whose messages timed out fails the next ones)
    short = lake.updated({"publish.transaction_timeout_s": 4, "kafka.request_timeout_s": 2})
    publisher = GoldPublisher(spark, publication(short, "orders"))
    publisher.open()
    gold_table.update(F.col("window_start") == rows[-1]["window_start"], {"units": F.lit(2)})
    broker.stop(lake, quiet=True)
    try:
        with pytest.raises(JobFailedError, match=re.escape(lake.kafka.bootstrap_servers)):
            publisher.publish_round()
    finally:
        broker.start(lake, quiet=True)
    caplog.clear()
    with caplog.at_level(logging.WARNING, "lakehouse.publish"):
        done = publisher.publish_round()
    assert [r.getMessage() for r in caplog.records] == []  # committed at the first attempt
    assert done.versions == {"gold/revenue_by_category_1m": (last + 1, last + 1)}
    publisher.close()
    updated = sum(r["window_start"] == rows[-1]["window_start"] for r in rows)
    counts = assert_published_exactly(spark, lake)
    assert counts["gold/revenue_by_category_1m"] == len(changes) + updated
