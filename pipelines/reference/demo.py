"""The main job on the embedded default: local broker, the reference stream, bronze, a summary."""

from __future__ import annotations

import sys
import time

from pyspark.sql import functions as F

from pipelines.config import LakehouseConf
from pipelines.layers.bronze import bronze_tables, run_bronze
from pipelines.layers.declared import declared_tables
from pipelines.layers.gold import gold_tables, run_gold, seed_dimensions
from pipelines.layers.publish import run_publish
from pipelines.layers.quality import QualityCheckFailedError, run_quality
from pipelines.layers.silver import run_silver, silver_tables
from pipelines.local import broker
from pipelines.reference.orders_stream import StreamPlan, generate_orders_stream, with_every_twist
from pipelines.reference.producer import produce_plan
from pipelines.session import build_spark


def run_demo(conf: LakehouseConf, orders: int | None = None, rounds: int = 3) -> None:
    """Start Kafka, then in `rounds` rounds: produce a part of a stream with every twist and run
    bronze, silver and gold on what arrived, then publish gold's changes to Kafka (as a scheduled
    job would); print a summary."""
    broker.start(conf)
    stream = conf.stream(conf.producer.stream)
    plan = generate_orders_stream(
        with_every_twist(
            orders=orders or conf.producer.orders,
            seed=conf.producer.seed,
            partitions=stream.partitions,
            # the stream spans more than the allowed lateness: late events really are late for gold
            events_per_second=2.0,
        )
    )
    spark = build_spark(conf, app_name="lakehouse-demo")
    seed_dimensions(spark, conf)
    seconds, published = _run_rounds(spark, conf, plan, stream.topic, rounds)
    records = len(plan.records)
    print("\n=== lakehouse demo: summary ===")
    print(f"produced this run   {records:>10,} records to {stream.topic}")
    for k, v in plan.counts().items():
        if k != "records" and v:
            print(f"  {k:<30} {v:>8,}")
    _bronze_summary(spark, conf, stream)
    _print_runs("bronze", seconds, records, f"records/s, {rounds} rounds, start-up included")
    events = _silver_summary(spark, conf, stream)
    _print_runs("silver", seconds, records, "records/s")
    _gold_summary(spark, conf)
    _print_runs("gold", seconds, events, "events/s")
    for table, messages in published.items():
        topic = stream.gold_topic(table)
        print(f"{table:<27} {messages:>6,} changes published to Kafka topic {topic}")
    _print_runs("publish", seconds, sum(published.values()), "messages/s, exactly once")
    _quality_summary(spark, conf)


def _print_runs(layer: str, seconds: dict[str, float], count: int, unit: str) -> None:
    print(f"{layer + ' runs':<20}{seconds[layer]:>10.1f} s ({count / seconds[layer]:,.0f} {unit})")


def _run_rounds(spark, conf: LakehouseConf, plan: StreamPlan, topic: str, rounds: int):
    """Seconds per layer over `rounds` parts of the plan, each produced then run `--once`, and
    the changes published per gold table."""
    layers = {"bronze": run_bronze, "silver": run_silver, "gold": run_gold, "publish": run_publish}
    seconds, published = dict.fromkeys(layers, 0.0), {}
    records = plan.records
    for i in range(rounds):
        part = records[len(records) * i // rounds : len(records) * (i + 1) // rounds]
        print(f"\n--- round {i + 1}/{rounds}: {len(part):,} records ---", file=sys.stderr)
        produce_plan(conf, StreamPlan(plan.options, part), topic, track=False)
        for layer, run in layers.items():
            started = time.monotonic()
            done = run(spark, conf, conf.producer.stream, once=True)
            seconds[layer] += time.monotonic() - started
            for r in done if layer == "publish" else ():
                for table, messages in r.messages.items():
                    published[table] = published.get(table, 0) + messages
    return seconds, published


def _bronze_summary(spark, conf: LakehouseConf, stream) -> None:
    tables = bronze_tables(conf, stream)
    raw = spark.read.format("delta").load(tables.raw)
    per_partition = {r["partition"]: r["count"] for r in raw.groupBy("partition").count().collect()}
    print(f"bronze/orders_raw   {raw.count():>10,} rows  ({tables.raw})")
    print(f"  per partition     {dict(sorted(per_partition.items()))}")
    print(f"  retention gaps    {spark.read.format('delta').load(tables.gaps).count():>10,}")


def _silver_summary(spark, conf: LakehouseConf, stream) -> int:
    st = silver_tables(conf, stream)
    events = spark.read.format("delta").load(st.events).count()
    orders = spark.read.format("delta").load(st.state)
    quarantine = spark.read.format("delta").load(st.quarantine)
    print(f"silver/order_events {events:>10,} rows  (one per event_id)")
    print(f"silver/orders       {orders.count():>10,} rows  (current state per order_id)")
    for r in orders.groupBy("status").count().orderBy("status").collect():
        print(f"  status {r['status']:<12} {r['count']:>10,}")
    print(f"silver/orders_quarantine {quarantine.count():>5,} rows; reasons:")
    reasons = (
        quarantine.select(F.regexp_replace("reason", r"(, got .*|: .*)$", "").alias("reason"))
        .groupBy("reason")
        .count()
        .orderBy(F.desc("count"), "reason")
        .collect()
    )
    for r in reasons[:10]:
        print(f"  {r['count']:>6,}  {r['reason']}")
    if len(reasons) > 10:
        rest = sum(r["count"] for r in reasons[10:])
        print(f"  {rest:>6,}  ... {len(reasons) - 10} more reasons")
    return events


def _gold_summary(spark, conf: LakehouseConf) -> None:
    gt = gold_tables(conf)
    revenue = spark.read.format("delta").load(gt.aggregates["gold/revenue_by_category_1m"])
    countries = spark.read.format("delta").load(gt.aggregates["gold/orders_by_country_5m"])
    print(f"gold/revenue_by_category_1m {revenue.count():>6,} rows; top by revenue:")
    for r in revenue.orderBy(F.desc("revenue"), "window_start").limit(5).collect():
        window = f"{r['window_start']:%H:%M} {r['category']:<12} {r['currency']}"
        print(f"  {window} {r['paid_orders']:>3} orders {r['revenue']:>14,}")
    print(f"gold/orders_by_country_5m   {countries.count():>6,} rows; top by value:")
    for r in countries.orderBy(F.desc("order_value"), "window_start").limit(5).collect():
        window = f"{r['window_start']:%H:%M}-{r['window_end']:%H:%M} {r['country']:<8}"
        print(f"  {window} {r['created_orders']:>3} orders {r['order_value']:>14,}")
    late = spark.read.format("delta").load(gt.late).count()
    print(f"gold/late_events            {late:>6,} rows (kept out of the windows, traced)")


def _quality_summary(spark, conf: LakehouseConf) -> None:
    try:
        outcomes = run_quality(spark, conf, declared_tables(conf))
        verdict = ", ".join(f"{o.suite} {'ok' if o.success else 'WARN'}" for o in outcomes)
        print(f"quality             passed: {verdict}")
    except QualityCheckFailedError as e:
        print(f"quality             FAILED: {e}")
    results = conf.table_path(conf.tables.quality_results)
    print(f"  results in {results}, Data Docs in {conf.root}/_quality")
