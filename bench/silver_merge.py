"""Benchmark: cost of one micro-batch's MERGE into silver/orders as the table grows.

Usage:
    .venv/bin/python bench/silver_merge.py [--sizes 1000000 10000000] [--batch 10000]

For each table size it writes silver/orders with that many orders (the job's own schema and
table properties, files in order_id order as appends leave them), then MERGEs micro-batches of a
fixed size (half updates of recent orders, half new orders) exactly as the silver job does:
`current_state` + the newer-version rule + the key condition bounded by the batch's key range.
It also times the same MERGE without the range bound, to show what the bound buys. Prints the
median seconds per batch and the ratio between the largest and the smallest table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines.config import load_config
from pipelines.layers.silver import ensure_silver_tables, silver_tables
from pipelines.session import build_spark
from silver.events import key_condition
from silver.orders import KEY, ORDER_COLUMNS, current_state, is_newer

ROWS_PER_FILE = 1_000_000
ORDER_ID = "o-%012d"  # the seeded orders and the batches' events must agree on it
MODES = ("bounded", "unbounded")


def seed_orders(spark: SparkSession, path: str, rows: int) -> None:
    """`rows` orders, ids o-000000000000.., files of ROWS_PER_FILE in id order."""
    (
        spark.range(0, rows, numPartitions=max(1, rows // ROWS_PER_FILE))
        .select(
            F.format_string(ORDER_ID, F.col("id")).alias("order_id"),
            F.format_string("e-%012d-1", F.col("id")).alias("event_id"),
            F.lit(1).cast("bigint").alias("seq"),
            F.lit("created").alias("status"),
            F.format_string("c-%05d", F.col("id") % 3000).alias("customer_id"),
            F.format_string("p-%04d", F.col("id") % 300).alias("product_id"),
            (F.col("id") % 5 + 1).alias("quantity"),
            ((F.col("id") % 50000) / 100).cast("decimal(12,2)").alias("unit_price"),
            F.lit("EUR").alias("currency"),
            (
                F.lit(datetime(2026, 11, 22, 10, 0)) + F.make_interval(secs=F.col("id") % 86400)
            ).alias("updated_at"),
        )
        .select(*ORDER_COLUMNS)
        .write.format("delta")
        .mode("append")
        .save(path)
    )


def batch_events(spark: SparkSession, table_rows: int, batch: int, n: int):
    """Events of one micro-batch: half move recent orders to seq 2, half create new orders."""
    half = batch // 2
    updates = spark.range(table_rows - (n + 1) * half, table_rows - n * half)
    inserts = spark.range(table_rows + n * half, table_rows + (n + 1) * half)
    events = updates.withColumn("seq", F.lit(2)).unionByName(inserts.withColumn("seq", F.lit(1)))
    return events.select(
        F.format_string("e-%012d-%d", F.col("id"), F.col("seq")).alias("event_id"),
        F.format_string(ORDER_ID, F.col("id")).alias("order_id"),
        F.col("seq").cast("bigint"),
        F.when(F.col("seq") == 2, "paid").otherwise("created").alias("event_type"),
        F.lit("c-00001").alias("customer_id"),
        F.lit("p-0001").alias("product_id"),
        F.lit(2).cast("bigint").alias("quantity"),
        F.lit("9.99").cast("decimal(12,2)").alias("unit_price"),
        F.lit("EUR").alias("currency"),
        F.lit(datetime(2026, 11, 23, 10, 0)).alias("event_time"),
    )


def merge_batch(spark: SparkSession, path: str, events, bounded: bool) -> float:
    latest = current_state(events).persist()
    lo, hi = latest.agg(F.min("order_id"), F.max("order_id")).first()
    condition = key_condition(KEY, lo, hi) if bounded else key_condition(KEY)
    started = time.monotonic()
    (
        DeltaTable.forPath(spark, path)
        .alias("t")
        .merge(latest.alias("s"), condition)
        .whenMatchedUpdateAll(condition=is_newer("t", "s"))
        .whenNotMatchedInsertAll()
        .execute()
    )
    seconds = time.monotonic() - started
    latest.unpersist()
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--batches", type=int, default=4, help="timed batches per size and mode")
    args = parser.parse_args()

    base = load_config("local")
    root = Path(tempfile.mkdtemp(prefix="lakehouse-merge-bench-"))
    spark = build_spark(base.updated({"storage.root": str(root)}), "bench-merge")
    results: dict[int, dict] = {}
    for size in args.sizes:
        conf = base.updated({"storage.root": str(root / f"n{size}")})
        tables = silver_tables(conf, conf.stream("orders"))
        ensure_silver_tables(spark, conf, tables)
        t0 = time.monotonic()
        seed_orders(spark, tables.state, size)
        print(f"silver/orders with {size:,} rows written in {time.monotonic() - t0:.1f}s")
        batches = (batch_events(spark, size, args.batch, n) for n in itertools.count())
        figures = results[size] = {}
        for mode in MODES:
            merge_batch(spark, tables.state, next(batches), bounded=True)  # warm-up
            times = [
                merge_batch(spark, tables.state, next(batches), bounded=mode == "bounded")
                for _ in range(args.batches)
            ]
            figures[mode] = statistics.median(times)
            print(
                f"  {mode:>9} key condition: {args.batch:,}-event batch MERGE, median "
                f"{figures[mode]:.2f}s over {len(times)} ({', '.join(f'{t:.2f}' for t in times)})"
            )
        rows = spark.read.format("delta").load(tables.state).count()
        # each mode merged a warm-up and the timed batches, each adding `batch // 2` new orders
        expected = size + 2 * (args.batches + 1) * (args.batch // 2)
        assert rows == expected, f"{rows} rows, expected {expected}"
    small, large = min(args.sizes), max(args.sizes)
    summary = {mode: results[large][mode] / results[small][mode] for mode in MODES}
    print(
        f"ratio {large:,} / {small:,} rows: {', '.join(f'{m} {r:.2f}' for m, r in summary.items())}"
    )
    out = Path(__file__).parent / "results" / f"silver_merge-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(dict(batch=args.batch, seconds=results, ratio=summary), indent=2))
    print(f"results: {out}")


if __name__ == "__main__":
    main()
