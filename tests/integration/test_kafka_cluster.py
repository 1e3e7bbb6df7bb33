"""A three-broker Kafka cluster: replicated topics, and a partition leader lost under load."""

from __future__ import annotations

import signal
import threading
import time
import uuid

import pytest
from confluent_kafka.admin import ConfigResource

from pipelines.kafka import admin_client, ensure_topic
from pipelines.layers.bronze import bronze_tables, run_bronze, table_max_offsets
from pipelines.layers.gold import run_gold, seed_dimensions
from pipelines.layers.silver import run_silver
from pipelines.local import broker
from pipelines.reference.orders_stream import StreamOptions, generate_orders_stream
from pipelines.reference.producer import produce_plan
from tests import helpers
from tests.conftest import subprocess_env
from tests.integration.test_pipeline import every_table
from tests.integration.test_silver import TWISTS, assert_silver_matches, oracle

pytestmark = pytest.mark.integration


def wait_for(done, job, log, timeout_s: float = 180) -> None:
    """Poll `done` until true; fail with the job's log if it ends or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert job.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)


def partitions(conf, topic: str) -> dict[int, tuple[int, list[int], list[int]]]:
    """Leader, replicas and in-sync replicas of each partition of `topic`, once it has all."""
    admin = admin_client(conf)
    deadline = time.monotonic() + 30
    while True:
        meta = admin.list_topics(topic, timeout=10).topics[topic]
        found = {
            p: (m.leader, sorted(m.replicas), sorted(m.isrs)) for p, m in meta.partitions.items()
        }
        if len(found) == conf.streams["orders"].partitions or time.monotonic() > deadline:
            return found


@pytest.fixture
def cluster_lake(kafka_cluster, tmp_path):
    topic = f"orders.cluster.{uuid.uuid4().hex[:10]}"
    return kafka_cluster.updated(
        {"storage.root": str(tmp_path / "lake"), "streams.orders.topic": topic}
    )


def test_the_cluster_has_three_brokers_and_the_streams_topics_three_replicas_two_in_sync(
    cluster_lake,
):
    st = broker.status(cluster_lake)
    assert st.running and len(st.pids) == 3 and None not in st.pids
    assert st.address == cluster_lake.kafka.bootstrap_servers
    stream = cluster_lake.streams["orders"]
    assert ensure_topic(cluster_lake, stream.topic, 4, 3, 2)
    assert {p: (r, i) for p, (_, r, i) in partitions(cluster_lake, stream.topic).items()} == {
        p: ([1, 2, 3], [1, 2, 3]) for p in range(4)
    }
    admin = admin_client(cluster_lake)
    (found,) = admin.describe_configs([ConfigResource("topic", stream.topic)]).values()
    assert found.result()["min.insync.replicas"].value == "2"


def test_a_partition_leader_sigkilled_while_producing_and_bronze_runs_loses_and_doubles_nothing(
    spark, cluster_lake, tmp_path
):
    """The producer (acks=all, idempotent) sends while bronze runs continuously; the leader of
    partition 0 is SIGKILLed mid-stream and restarted. Bronze holds every acknowledged record
    exactly once, and silver and gold equal a run that read the same topic uninterrupted."""
    conf = cluster_lake.updated(
        {"silver.max_files_per_trigger": 10_000, "gold.max_files_per_trigger": 10_000}
    )
    topic = conf.streams["orders"].topic
    plan = generate_orders_stream(StreamOptions(orders=300, seed=91, **TWISTS))
    ensure_topic(conf, topic, 4, 3, 2)
    leader = partitions(conf, topic)[0][0]

    reports, failures = [], []

    def send() -> None:
        try:  # ~20 s of sending
            reports.append(produce_plan(conf, plan, topic, rate=len(plan.records) / 20))
        except Exception as e:  # raised in the test below
            failures.append(e)

    log = tmp_path / "bronze.log"
    bronze_job = helpers.start_job("pipelines.jobs.bronze_job", subprocess_env(conf), log)
    raw = bronze_tables(conf, conf.streams["orders"]).raw
    sender = threading.Thread(target=send)
    try:
        wait_for(lambda: "started" in log.read_text(), bronze_job, log)
        sender.start()
        wait_for(lambda: helpers.delta_commits(raw) >= 2, bronze_job, log)  # a first batch is in
        broker.kill(conf, leader)  # while the producer sends and bronze reads
        time.sleep(4)
        broker.start(conf, quiet=True)
        sender.join(timeout=300)
        assert not failures, failures
        (report,) = reports
        ends = {}
        for d in report.delivered:
            ends[d.partition] = max(ends.get(d.partition, -1), d.offset)
        # the continuous job catches up by itself: bronze reaches the last acknowledged offsets
        wait_for(lambda: table_max_offsets(spark, raw, topic) == ends, bronze_job, log)
        bronze_job.send_signal(signal.SIGTERM)
        assert bronze_job.wait(timeout=120) == 0, log.read_text()[-3000:]
    finally:
        if bronze_job.poll() is None:
            bronze_job.kill()
        sender.join(timeout=300)

    raw_rows = spark.read.format("delta").load(raw).select("partition", "offset", "key", "value")
    held = sorted((r[0], r[1], r[2], bytes(r[3])) for r in raw_rows.collect())
    sent = sorted((d.partition, d.offset, d.key, d.value) for d in report.delivered)
    assert held == sent  # every acknowledged record once, at its offset

    seed_dimensions(spark, conf)
    run_silver(spark, conf, once=True, progress=False)
    run_gold(spark, conf, once=True, progress=False)
    reference = conf.updated({"storage.root": str(tmp_path / "ref")})
    seed_dimensions(spark, reference)
    run_bronze(spark, reference, once=True, progress=False)
    run_silver(spark, reference, once=True, progress=False)
    run_gold(spark, reference, once=True, progress=False)
    assert every_table(spark, conf) == every_table(spark, reference)
    assert_silver_matches(spark, conf, oracle(report))
