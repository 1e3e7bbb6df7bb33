"""A three-broker Kafka cluster: replicated topics, and a partition leader lost under load."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import ConfigResource

from pipelines.kafka import admin_client, ensure_topic, stable_offsets
from pipelines.layers.bronze import bronze_tables, table_max_offsets
from pipelines.layers.gold import gold_tables
from pipelines.layers.publish import run_publish
from pipelines.layers.silver import silver_tables
from pipelines.local import broker
from pipelines.orchestration.runs import read_runs
from pipelines.reference.orders_stream import StreamOptions, StreamPlan, generate_orders_stream
from pipelines.reference.producer import produce_plan
from tests import helpers
from tests.conftest import subprocess_env
from tests.integration.test_gold import gold_oracle, seeds, table
from tests.integration.test_publish import assert_published_exactly
from tests.integration.test_silver import TWISTS, assert_silver_matches, oracle

# one worker runs the module, so its cluster starts once (pytest-xdist `--dist loadgroup`)
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("kafka_cluster")]


def partitions(conf, topic: str, count: int | None = None) -> dict[int, tuple[int, list, list]]:
    """Leader, replicas and in-sync replicas of each partition of `topic`, once it has all
    `count` (the stream's partitions)."""
    admin = admin_client(conf)
    deadline = time.monotonic() + 30
    while True:
        meta = admin.list_topics(topic, timeout=10).topics[topic]
        found = {
            p: (m.leader, sorted(m.replicas), sorted(m.isrs)) for p, m in meta.partitions.items()
        }
        if (
            len(found) == (count or conf.streams["orders"].partitions)
            or time.monotonic() > deadline
        ):
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


def test_a_leader_sigkilled_while_producing_then_every_broker_down_lose_and_double_nothing(
    spark, cluster_lake, tmp_path
):
    """The pipeline job spec (Kafka to gold in one query, and publish) runs on the cluster; the
    layer jobs read Kafka through the same source, and stop and resume as it does under a
    SIGKILL and a lost checkpoint (test_bronze, test_gold).

    1. While the producer (acks=all, idempotent) sends, the leader of partition 0 is SIGKILLed
       and restarted 4 s later: the producer retries until a new leader takes over, the
       pipeline's batch waits as long.
    2. Every broker then stops for 35 s: the pipeline stops with one line naming the bootstrap
       servers (exit code 4), the spec's retries restart it until Kafka answers, and it resumes
       at its checkpoint.
    3. While the spec's publish task publishes gold's changes of the second part, the leader of
       a gold topic is SIGKILLed and restarted 4 s later.
    Bronze holds each acknowledged record once, at its offset; silver and gold equal their
    oracles (what an uninterrupted run writes: the other tests hold runs to them); each gold
    topic holds every change of its table once, in version order.
    """
    conf = cluster_lake
    topic = conf.streams["orders"].topic
    twists = {k: v for k, v in TWISTS.items() if k != "late_rate"}  # no event 10 min late
    whole = generate_orders_stream(StreamOptions(orders=300, seed=93, **twists))
    half = len(whole.records) // 2
    plans = [
        StreamPlan(whole.options, part) for part in (whole.records[:half], whole.records[half:])
    ]
    ensure_topic(conf, topic, 4, 3, 2)
    leader = partitions(conf, topic)[0][0]
    reports, failures = [], []

    def send(plan: StreamPlan, seconds: float) -> None:
        try:
            reports.append(produce_plan(conf, plan, topic, rate=len(plan.records) / seconds))
        except Exception as e:  # raised in the test below
            failures.append(e)

    env = subprocess_env(
        conf,
        # the pipeline gives up after three requests of this (18 s, not 45 s): a shorter outage
        # shows it
        LAKEHOUSE__KAFKA__REQUEST_TIMEOUT_S="6",
    )
    log = tmp_path / "runner.log"
    command = [sys.executable, "-m", "pipelines.cli", "jobs", "run"]
    command += ["conf/jobs/orders_pipeline.yaml", "--param", "env=test"]
    with open(log, "wb") as out:
        runner = subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    stream = conf.streams["orders"]
    raw, gold = bronze_tables(conf, stream).raw, gold_tables(conf)
    sender = threading.Thread(target=send, args=(plans[0], 20))
    try:
        helpers.wait_for(lambda: "started" in pipeline_log_text(conf), runner, log)
        sender.start()
        helpers.wait_for(
            lambda: helpers.delta_commits(raw) >= 2, runner, log
        )  # a first batch is in
        broker.kill(conf, leader)  # 1. while the producer sends and bronze reads
        time.sleep(4)
        broker.start(conf, quiet=True)
        sender.join(timeout=300)
        assert not failures, failures
        helpers.wait_for(
            lambda: bronze_offsets(spark, raw, topic) == last_offsets(reports[0]), runner, log
        )
        broker.stop(conf, quiet=True)  # 2. every broker, for 35 s
        time.sleep(35)
        broker.start(conf, quiet=True)
        # 3. while gold's changes of the second part are being published, the leader of the
        #    first gold topic is SIGKILLed and restarted 4 s later
        published = stream.gold_topic("gold/revenue_by_category_1m")
        before = sum(s.stable for s in stable_offsets(conf, published))
        sender = threading.Thread(target=send, args=(plans[1], 5))
        sender.start()
        helpers.wait_for(
            lambda: sum(s.stable for s in stable_offsets(conf, published)) > before, runner, log
        )
        broker.kill(conf, partitions(conf, published, conf.publish.partitions)[0][0])
        time.sleep(4)
        broker.start(conf, quiet=True)
        sender.join(timeout=300)
        assert not failures, failures
        expected = oracle(*reports)
        products, customers = seeds(conf, "products"), seeds(conf, "customers")
        revenue, countries = gold_oracle((list(expected["events"].values()), products, customers))

        def caught_up() -> bool:  # gold, and silver's state query behind it
            aggregates = gold.aggregates
            try:
                assert_silver_matches(spark, conf, expected)
            except AssertionError:
                return False
            return (
                table(spark, aggregates["gold/revenue_by_category_1m"]) == revenue
                and table(spark, aggregates["gold/orders_by_country_5m"]) == countries
            )

        written = [*gold.aggregates.values(), silver_tables(conf, stream).state]
        helpers.wait_for(helpers.on_commit(written, caught_up), runner, log, timeout_s=300)
        os.killpg(runner.pid, signal.SIGTERM)
        assert runner.wait(timeout=180) == 130, log.read_text()[-3000:]
    finally:
        if runner.poll() is None:
            os.killpg(runner.pid, signal.SIGKILL)
            runner.wait()
        if sender.is_alive():
            sender.join(timeout=300)
    raw_rows = spark.read.format("delta").load(raw).select("partition", "offset", "key", "value")
    held = sorted((r[0], r[1], r[2], bytes(r[3])) for r in raw_rows.collect())
    sent = [(d.partition, d.offset, d.key, d.value) for rep in reports for d in rep.delivered]
    assert held == sorted(sent)  # every acknowledged record once, at its offset
    assert_silver_matches(spark, conf, expected)
    assert table(spark, gold.late) == []
    tries = [r for r in read_runs(conf) if r["task"] == "pipeline"]
    failed = [r for r in tries if r["state"] == "FAILED"]
    assert failed and all(r["exit_code"] == 4 for r in failed), tries
    # one line naming the brokers: none answered, or the partition's leader gave no offsets yet
    assert all(
        r["message"].count(conf.kafka.bootstrap_servers) == 1 and "\n" not in r["message"]
        for r in failed
    ), [r["message"] for r in failed]
    assert any(
        f"no Kafka broker answered at {conf.kafka.bootstrap_servers}" in r["message"]
        for r in failed
    ), [r["message"] for r in failed]
    assert tries[-1]["state"] == "CANCELED", tries
    # every gold change published once: the publish task rode the failures out (its restarts
    # resumed after what Kafka had committed), and a last run catches up with gold
    run_publish(spark, conf, once=True, progress=False)
    assert_published_exactly(spark, conf)


def pipeline_log_text(conf) -> str:
    """What the job's first pipeline attempt printed so far."""
    logs = Path(conf.storage.root, "_jobs", "logs").glob("*/pipeline-0.log")
    return "".join(f.read_text() for f in logs)


def bronze_offsets(spark, raw: str, topic: str) -> dict[int, int]:
    """The greatest offset bronze holds per partition ({} before its table exists)."""
    return table_max_offsets(spark, raw, topic) if helpers.delta_commits(raw) else {}


def last_offsets(report) -> dict[int, int]:
    """The last acknowledged offset of each partition of a producer's report."""
    ends: dict[int, int] = {}
    for d in report.delivered:
        ends[d.partition] = max(ends.get(d.partition, -1), d.offset)
    return ends
