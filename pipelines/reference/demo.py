"""The main job on the embedded default: local broker, the reference stream, bronze, a summary."""

from __future__ import annotations

import sys
import time

from pyspark.sql import functions as F

from pipelines.config import LakehouseConf
from pipelines.layers.bronze import bronze_tables, run_bronze
from pipelines.layers.gold import gold_tables, run_gold, seed_dimensions
from pipelines.layers.silver import run_silver, silver_tables
from pipelines.local import broker
from pipelines.reference.orders_stream import StreamPlan, generate_orders_stream, with_every_twist
from pipelines.reference.producer import produce_plan
from pipelines.streaming.spark import build_spark


def run_demo(conf: LakehouseConf, orders: int | None = None, rounds: int = 3) -> None:
    """Start Kafka, then in `rounds` rounds: produce a part of a stream with every twist and run
    bronze, silver and gold on what arrived (as a scheduled job would); print a summary.

    The stream's event time runs at 2 events/s, so it spans more than the allowed lateness and
    the late events of the later rounds really are late for gold.
    """
    broker.start(conf)
    stream = conf.stream(conf.producer.stream)
    plan = generate_orders_stream(with_every_twist(
        orders=orders or conf.producer.orders, seed=conf.producer.seed,
        partitions=stream.partitions, events_per_second=2.0))  # fmt: skip
    spark = build_spark(conf, app_name="lakehouse-demo")
    seed_dimensions(spark, conf)
    seconds = {"bronze": 0.0, "silver": 0.0, "gold": 0.0}
    records = plan.records
    counts: dict[str, int] = {}
    for i in range(rounds):
        part = records[len(records) * i // rounds : len(records) * (i + 1) // rounds]
        print(f"\n--- round {i + 1}/{rounds}: {len(part):,} records ---", file=sys.stderr)
        report = produce_plan(conf, StreamPlan(plan.options, part), stream.topic, track=False)
        for k, v in report.counts.items():
            counts[k] = counts.get(k, 0) + v
        for layer, run in (("bronze", run_bronze), ("silver", run_silver), ("gold", run_gold)):
            started = time.monotonic()
            if layer == "gold":
                run(spark, conf, once=True)
            else:
                run(spark, conf, conf.producer.stream, once=True)
            seconds[layer] += time.monotonic() - started
    tables = bronze_tables(conf, stream)
    raw = spark.read.format("delta").load(tables.raw)
    total = raw.count()
    per_partition = {
        r["partition"]: r["rows"]
        for r in raw.groupBy("partition").agg(F.count("*").alias("rows")).collect()
    }
    gaps = spark.read.format("delta").load(tables.gaps).count()
    out = sys.stdout
    print("\n=== lakehouse demo: summary ===", file=out)
    print(f"produced this run   {counts['records']:>10,} records to {stream.topic}", file=out)
    for k, v in counts.items():
        if k != "records" and v:
            print(f"  {k:<30} {v:>8,}", file=out)
    print(f"bronze/orders_raw   {total:>10,} rows  ({tables.raw})", file=out)
    print(f"  per partition     {dict(sorted(per_partition.items()))}", file=out)
    print(f"  retention gaps    {gaps:>10,}", file=out)
    print(f"bronze runs         {seconds['bronze']:>10.1f} s ({counts['records'] / seconds['bronze']:,.0f} records/s, "
          f"{rounds} rounds, start-up included)", file=out)  # fmt: skip
    st = silver_tables(conf, stream)
    events = spark.read.format("delta").load(st.events).count()
    orders = spark.read.format("delta").load(st.state)
    quarantine = spark.read.format("delta").load(st.quarantine)
    print(f"silver/order_events {events:>10,} rows  (one per event_id)", file=out)
    print(f"silver/orders       {orders.count():>10,} rows  (current state per order_id)", file=out)
    for r in orders.groupBy("status").count().orderBy("status").collect():
        print(f"  status {r['status']:<12} {r['count']:>10,}", file=out)
    print(f"silver/orders_quarantine {quarantine.count():>5,} rows; reasons:", file=out)
    reasons = (
        quarantine.select(F.regexp_replace("reason", r"(, got .*|: .*)$", "").alias("reason"))
        .groupBy("reason").count().orderBy(F.desc("count"), "reason").collect()
    )  # fmt: skip
    for r in reasons[:10]:
        print(f"  {r['count']:>6,}  {r['reason']}", file=out)
    if len(reasons) > 10:
        rest = sum(r["count"] for r in reasons[10:])
        print(f"  {rest:>6,}  ... {len(reasons) - 10} more reasons", file=out)
    print(
        f"silver runs         {seconds['silver']:>10.1f} s ({counts['records'] / seconds['silver']:,.0f} records/s)",
        file=out,
    )
    gt = gold_tables(conf)
    revenue = spark.read.format("delta").load(gt.revenue)
    countries = spark.read.format("delta").load(gt.countries)
    late = spark.read.format("delta").load(gt.late).count()
    print(f"gold/revenue_by_category_1m {revenue.count():>6,} rows; top by revenue:", file=out)
    for r in revenue.orderBy(F.desc("revenue"), "window_start").limit(5).collect():
        print(f"  {r['window_start']:%H:%M} {r['category']:<12} {r['currency']} "
              f"{r['paid_orders']:>3} orders {r['revenue']:>14,}", file=out)  # fmt: skip
    print(f"gold/orders_by_country_5m   {countries.count():>6,} rows; top by value:", file=out)
    for r in countries.orderBy(F.desc("order_value"), "window_start").limit(5).collect():
        print(f"  {r['window_start']:%H:%M}-{r['window_end']:%H:%M} {r['country']:<8} "
              f"{r['created_orders']:>3} orders {r['order_value']:>14,}", file=out)  # fmt: skip
    print(
        f"gold/late_events            {late:>6,} rows (kept out of the windows, traced)", file=out
    )
    print(
        f"gold runs           {seconds['gold']:>10.1f} s ({events / seconds['gold']:,.0f} events/s)",
        file=out,
    )
    from pipelines.layers.quality import QualityCheckFailedError, run_quality

    try:
        outcomes = run_quality(spark, conf)
        verdict = ", ".join(f"{o.suite} {'ok' if o.success else 'WARN'}" for o in outcomes)
        print(f"quality             passed: {verdict}", file=out)
    except QualityCheckFailedError as e:
        print(f"quality             FAILED: {e}", file=out)
    print(f"  results in {conf.table_path('quality/results')}, Data Docs in "
          f"{conf.root / '_quality'}", file=out)  # fmt: skip
