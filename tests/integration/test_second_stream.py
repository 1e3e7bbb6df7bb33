"""A second stream through every layer, from a config entry, pure functions and declarations only."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from confluent_kafka import Producer

from pipelines.kafka import client_settings, ensure_topic
from pipelines.layers.bronze import run_bronze
from pipelines.layers.declared import declared_tables
from pipelines.layers.gold import gold_tables, run_gold
from pipelines.layers.quality import run_quality
from pipelines.layers.silver import run_silver, silver_tables

pytestmark = pytest.mark.integration

ENTRY = """
topic: {topic}
partitions: 2
bronze_table: bronze/clicks_raw
events_table: silver/clicks
state_table: silver/visitors
quarantine_table: silver/clicks_quarantine
gold_tables: [gold/clicks_per_page_1m]
late_events_table: gold/late_clicks
modules:
  silver/clicks: tests.clicks.clicks
  silver/visitors: tests.clicks.visitors
  gold/clicks_per_page_1m: tests.clicks.clicks_per_page_1m
  gold/late_clicks: tests.clicks.late_clicks
"""
T0 = datetime(2026, 11, 23, 9, 0, tzinfo=UTC)


def click(n: int, at: datetime) -> bytes:
    return json.dumps(
        {"click_id": f"k{n}", "visitor_id": f"v{n % 7}", "page": f"/p{n % 3}", "ts": at.isoformat()}
    ).encode()


def send(conf, topic: str, values: list[bytes]) -> None:
    producer = Producer({**client_settings(conf), "enable.idempotence": True})
    for i, v in enumerate(values):
        producer.produce(topic, value=v, partition=i % 2)
    assert producer.flush(30) == 0


def run_layers(spark, conf) -> None:
    run_bronze(spark, conf, "clicks", once=True, progress=False)
    run_silver(spark, conf, "clicks", once=True, progress=False)
    run_gold(spark, conf, "clicks", once=True, progress=False)


def rows(spark, path: str, *columns: str) -> list[tuple]:
    return sorted(
        tuple(r) for r in spark.read.format("delta").load(path).select(*columns).collect()
    )


def test_a_second_stream_flows_through_every_layer(spark, kafka, tmp_path):
    topic = f"clicks.{uuid.uuid4().hex[:8]}"
    conf = kafka.updated(
        {
            "storage.root": str(tmp_path / "lake"),
            "streams.clicks": yaml.safe_load(ENTRY.format(topic=topic)),
        }
    )
    ensure_topic(conf, topic, 2, 1)
    # round 1: 40 clicks over 4 minutes, 5 re-delivered, 3 invalid
    first = {n: T0 + timedelta(seconds=6 * n) for n in range(40)}
    invalid = [
        b"not json",
        json.dumps({"click_id": "", "visitor_id": "v", "page": "/", "ts": "x"}).encode(),
        b"{}",
    ]
    send(
        conf,
        topic,
        [click(n, t) for n, t in first.items()] + [click(n, first[n]) for n in range(5)] + invalid,
    )
    run_layers(spark, conf)
    # round 2: 10 on-time clicks, and 4 older than the allowed lateness (10 min) behind round 1
    second = {n: T0 + timedelta(minutes=4, seconds=5 * (n - 40)) for n in range(40, 50)}
    late = {n: T0 - timedelta(minutes=30) for n in range(50, 54)}
    send(conf, topic, [click(n, t) for n, t in {**second, **late}.items()])
    run_layers(spark, conf)

    valid = {**first, **second, **late}
    silver = silver_tables(conf, conf.stream("clicks"))
    assert rows(spark, silver.events, "click_id", "event_time") == sorted(
        (f"k{n}", t.replace(tzinfo=None)) for n, t in valid.items()
    )
    newest = {}
    for n, _ in sorted(valid.items(), key=lambda nt: (nt[1], f"k{nt[0]}")):
        newest[f"v{n % 7}"] = (f"k{n}", f"/p{n % 3}")
    assert rows(spark, silver.state, "visitor_id", "click_id", "page") == sorted(
        (v, *c) for v, c in newest.items()
    )
    assert Counter(r[0] for r in rows(spark, silver.quarantine, "reason")) == {
        "value is not JSON": 1,
        "missing field 'click_id'": 2,  # an empty id is no id
    }
    gold = gold_tables(conf, "clicks")
    windows = Counter()
    for n, t in {**first, **second}.items():
        start = t.replace(second=0, tzinfo=None)
        windows[(start, start + timedelta(minutes=1), f"/p{n % 3}")] += 1
    assert rows(
        spark,
        gold.aggregates["gold/clicks_per_page_1m"],
        "window_start",
        "window_end",
        "page",
        "clicks",
    ) == sorted((*k, c) for k, c in windows.items())
    assert rows(spark, gold.late, "click_id") == sorted((f"k{n}",) for n in late)
    # its declared expectations run with everyone else's
    outcomes = {
        o.suite: o.success
        for o in run_quality(spark, conf, declared_tables(conf), ["silver/clicks"])
    }
    assert outcomes == {"silver_clicks": True}
