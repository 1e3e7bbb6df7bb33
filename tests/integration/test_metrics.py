"""A running layer job serves Prometheus metrics, its own and Spark's, at its fixed ports; the
figures equal the table's and Kafka's."""

from __future__ import annotations

import signal
import time
import urllib.request

import pytest
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from pipelines.kafka import client_settings
from pipelines.layers.bronze import bronze_tables
from tests import helpers
from tests.conftest import _free_port, subprocess_env

pytestmark = pytest.mark.integration


def scrape(url: str) -> dict[tuple[str, tuple], float]:
    """Every sample at `url` by (name, sorted labels), parsed by Prometheus' own parser."""
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def test_a_running_bronze_job_serves_figures_equal_to_its_table_and_kafka(spark, lake, tmp_path):
    report = helpers.produce(lake, orders=300, seed=81, redelivery_rate=0.05)
    records, topic = len(report.delivered), lake.streams["orders"].topic
    port, ui_port = _free_port(), _free_port()
    env = subprocess_env(lake)
    env |= {
        "LAKEHOUSE__METRICS__ENABLED": "true",
        "LAKEHOUSE__METRICS__PORTS__BRONZE-ORDERS": str(port),
        "LAKEHOUSE__METRICS__SPARK_UI_PORTS__BRONZE-ORDERS": str(ui_port),
    }
    job = helpers.start_job("pipelines.jobs.bronze_job", env, tmp_path / "bronze.log", "--quiet")
    table = ("table", "bronze/orders_raw")
    lags = "lakehouse_kafka_lag_offsets"
    try:
        deadline, samples = time.monotonic() + 240, {}
        while time.monotonic() < deadline and job.poll() is None:
            try:
                samples = scrape(f"http://127.0.0.1:{port}/metrics")
            except OSError:  # not serving yet
                samples = {}
            caught_up = [v for (name, labels), v in samples.items() if name == lags]
            if samples.get(("lakehouse_table_rows", (table,))) == records and caught_up == [0] * 4:
                break
            time.sleep(0.5)
        assert job.poll() is None, (tmp_path / "bronze.log").read_text()[-3000:]
        spark_samples = scrape(f"http://127.0.0.1:{ui_port}/metrics/prometheus")
        held, opened = open_transaction_figures(lake, topic, port, job, tmp_path)
    finally:
        job.send_signal(signal.SIGTERM)
        assert job.wait(timeout=120) == 0, (tmp_path / "bronze.log").read_text()[-3000:]

    # the table's figures, scraped last (the 25 records of the transaction below included)
    raw = spark.read.format("delta").load(bronze_tables(lake, lake.stream("orders")).raw)
    assert samples[("lakehouse_table_rows", (table,))] == records
    assert opened[("lakehouse_table_rows", (table,))] == raw.count() == records + 25
    history = spark.sql(f"DESCRIBE HISTORY delta.`{lake.table_path('bronze/orders_raw')}`")
    newest = history.orderBy("version", ascending=False).first()
    assert opened[("lakehouse_table_version", (table,))] == newest["version"]
    # Delta's history (Spark: the commit file's time; delta-rs: the commit's own record of it)
    committed = opened[("lakehouse_table_last_commit_timestamp_seconds", (table,))]
    assert abs(committed - newest["timestamp"].timestamp()) < 1.0
    newest_event = raw.agg({"kafka_timestamp": "max"}).first()[0].timestamp()
    assert opened[("lakehouse_table_newest_event_timestamp_seconds", (table,))] == newest_event
    # every record read once, every partition caught up, one gauge per batch of the query
    query = ("query", "bronze_orders_raw")
    assert samples[("lakehouse_input_rows_total", (query,))] == records
    batches = samples[("lakehouse_batches_total", (query,))]
    assert batches == samples[("lakehouse_last_batch_id", (query,))] + 1
    assert sorted(
        (dict(labels)["topic"], dict(labels)["partition"], v)
        for (name, labels), v in samples.items()
        if name == lags
    ) == [(topic, str(p), 0) for p in range(4)]
    # a transaction open on partition 1: its 25 records held back (and every later one of the
    # partition), not lag; once committed, bronze holds them and nothing is held back
    ages = "lakehouse_kafka_open_transaction_age_seconds"

    def per_partition(found: dict, name: str) -> dict[str, float]:
        return {dict(labels)["partition"]: v for (n, labels), v in found.items() if n == name}

    assert per_partition(held, "lakehouse_kafka_open_transaction_offsets") == {
        "0": 0,
        "1": 25,
        "2": 0,
        "3": 0,
    }
    assert per_partition(held, lags) == dict.fromkeys(("0", "1", "2", "3"), 0)
    age = per_partition(held, ages)
    assert age["0"] == age["2"] == age["3"] == 0 and 0 < age["1"] <= held[("waited", ())] + 1
    assert per_partition(opened, "lakehouse_kafka_open_transaction_offsets") == dict.fromkeys(
        ("0", "1", "2", "3"), 0
    )
    assert samples[("lakehouse_input_rows_total", (query,))] == records
    assert opened[("lakehouse_input_rows_total", (query,))] == records + 25
    # Spark's own metrics, its streaming query's among them, from its UI's servlet
    query_metrics = "metrics_lakehouse_bronze_orders_driver_spark_streaming_bronze_orders_raw_"
    streaming = sorted(name for name, _ in spark_samples if name.startswith(query_metrics))
    assert {"inputRate_total", "processingRate_total", "latency"} <= {
        name.removeprefix(query_metrics).rsplit("_", 1)[0] for name in streaming
    }, sorted(spark_samples)[:40]


def open_transaction_figures(lake, topic: str, port: int, job, tmp_path) -> tuple:
    """A transaction of 25 records left open on partition 1 while the bronze job runs: the
    samples then, and once it commits and bronze has read it."""
    producer = Producer(client_settings(lake) | {"transactional.id": f"{topic}.metrics"})
    producer.init_transactions(30)
    producer.begin_transaction()
    began = time.time()
    for i in range(25):
        producer.produce(topic, key=b"k", value=b'{"open": %d}' % i, partition=1)
    producer.flush(30)
    url = f"http://127.0.0.1:{port}/metrics"
    key = ("lakehouse_kafka_open_transaction_offsets", (("partition", "1"), ("topic", topic)))
    deadline = time.monotonic() + 60
    while (held := scrape(url)).get(key) != 25:
        assert time.monotonic() < deadline and job.poll() is None, sorted(held.items())[:20]
        time.sleep(0.5)
    waited = time.time() - began
    producer.commit_transaction(30)
    rows = ("lakehouse_table_rows", (("table", "bronze/orders_raw"),))
    read = ("lakehouse_input_rows_total", (("query", "bronze_orders_raw"),))
    before = (held[rows], held[read])

    def caught_up(found: dict) -> bool:  # the table's figure first, the query's a poll later
        return (found.get(rows), found.get(read)) == (before[0] + 25, before[1] + 25)

    while not caught_up(opened := scrape(url)):
        assert time.monotonic() < deadline and job.poll() is None, sorted(opened.items())[:20]
        time.sleep(0.5)
    return held | {("waited", ()): waited}, opened
