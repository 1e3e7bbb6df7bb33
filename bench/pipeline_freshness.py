"""Benchmark: end-to-end freshness and gold's state, bronze + silver + gold running continuously.

Usage:
    .venv/bin/python -m bench.pipeline_freshness [--minutes 5] [--rate N] [--trigger "10 seconds"]

Measures bronze's maximum rate on a backlog (`--backlog` records, `--once`), then runs bronze,
silver and gold as continuous queries in one Spark application while a paced producer sends the
reference stream with every twist at half that rate (or `--rate`) for `--minutes`. Prints the
freshness of every on-time `created` and `paid` event, from its Kafka timestamp to the commit of
the gold batch that added it to its window row (event -> the silver commit that inserted it -> the
first gold batch whose checkpoint offset covers that commit -> its txn-tagged gold commit, checked
against each gold batch's input rows), as p50/p90/p99/max overall and per minute, and gold's
state-store rows over the run. Results also go to bench/results/pipeline_freshness-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import UTC, datetime
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.backlog import fresh, generate
from pipelines.config import LakehouseConf, load_config
from pipelines.layers.bronze import bronze_tables, run_bronze, start_bronze
from pipelines.layers.gold import gold_tables, seed_dimensions, start_gold
from pipelines.layers.silver import start_silver
from pipelines.local import broker
from pipelines.reference.orders_stream import StreamPlan, with_every_twist
from pipelines.reference.producer import produce_plan
from pipelines.streaming.console import ConsoleProgress
from pipelines.streaming.progress_table import progress_row
from pipelines.streaming.spark import build_spark
from pipelines.streaming.storage import Files
from silver.events import with_clock_bound
from silver.order_events import parse_events

LAYERS = {"bronze": start_bronze, "silver": start_silver, "gold": start_gold}
# the gold tables that windowed `paid` and `created` events land in
REVENUE, COUNTRIES = "gold/revenue_by_category_1m", "gold/orders_by_country_5m"


def delta_commits(files: Files, table: str) -> Iterator[dict]:
    """Every commit of a Delta table (on any root): version, commit time (ms), txn ids, the batch
    its `userMetadata` records (None if none), added file names."""
    log = f"{table}/_delta_log"
    for name in sorted(n for n in files.names(log) if n.endswith(".json")):
        actions = [
            json.loads(line) for line in (files.read_text(f"{log}/{name}") or "").splitlines()
        ]
        info = next(a["commitInfo"] for a in actions if "commitInfo" in a)
        record = json.loads(info.get("userMetadata") or "{}")
        yield {
            "version": int(name.removesuffix(".json")),
            "ms": info["timestamp"],
            "batch": record.get("batch") if isinstance(record, dict) else None,
            "files": [a["add"]["path"].rsplit("/", 1)[-1] for a in actions if "add" in a],
            "txn": [(a["txn"]["appId"], a["txn"]["version"]) for a in actions if "txn" in a],
        }


def gold_batch_ends(files: Files, checkpoint: str) -> dict[int, tuple[int, int]]:
    """Gold batch id -> (silver version, index) its Delta source offset ends at."""
    offsets = f"{checkpoint}/offsets"
    texts = {int(n): files.read_text(f"{offsets}/{n}") for n in files.names(offsets) if n.isdigit()}
    sources = {batch: json.loads(text.splitlines()[2]) for batch, text in texts.items() if text}
    return {batch: (s["reservoirVersion"], s["index"]) for batch, s in sources.items()}


def first_covering_batch(ends: dict[int, tuple[int, int]], version: int) -> int | None:
    """The first gold batch whose end offset includes silver `version`: it ends at a later
    version, or at that one with an index >= 0 (index -1: none of it)."""
    return next((batch for batch, end in sorted(ends.items()) if (version, 0) <= end), None)


def gold_commits(spark: SparkSession, gold) -> DataFrame:
    """(table, batch, gold_ms) of each windowed gold table's commits: the sink tags each with
    txn (`<table>:<query id>`, batch id)."""
    return spark.createDataFrame(
        [
            (name, batch, c["ms"])
            for name in (REVENUE, COUNTRIES)
            for c in delta_commits(Files(spark), gold.aggregates[name])
            for app_id, batch in c["txn"]
            if app_id.startswith(f"{name}:")
        ],
        "table string, batch bigint, gold_ms bigint",
    )


def percentiles(df, column: str) -> dict[str, float]:
    n, quantiles, top = df.agg(
        F.count(column), F.percentile(column, [0.5, 0.9, 0.99]), F.max(column)
    ).first()
    if not n:
        return {"n": 0}
    p50, p90, p99 = quantiles
    return {"n": n, "p50": p50, "p90": p90, "p99": p99, "max": float(top)}


def minute_by_minute(windowed) -> dict[int, dict]:
    """Count, p50 and p99 of `freshness_s` per `minute` of sending."""
    return {
        int(minute): {"n": n, "p50": p50, "p99": p99}
        for minute, n, (p50, p99) in windowed.groupBy("minute")
        .agg(F.count("*"), F.percentile("freshness_s", [0.5, 0.99]))
        .orderBy("minute")
        .collect()
    }


def measure_bronze_max(spark: SparkSession, conf: LakehouseConf, records: list) -> float:
    """Bronze's rate (rows/s) draining `records` from a new topic with `--once`."""
    conf = fresh(conf, "max")
    stream = conf.stream("orders")
    produce_plan(conf, StreamPlan(with_every_twist(), records), stream.topic, track=False)
    started = time.monotonic()
    run_bronze(spark, conf, once=True, progress=False)
    seconds = time.monotonic() - started
    rows = spark.read.format("delta").load(bronze_tables(conf, stream).raw).count()
    assert rows == len(records), f"bronze holds {rows:,} rows, expected {len(records):,}"
    return len(records) / seconds


def analyse(spark: SparkSession, conf: LakehouseConf, started_ms: int, progress: dict) -> dict:
    gold = gold_tables(conf)
    delta = spark.read.format("delta")
    ends = gold_batch_ends(Files(spark), gold.checkpoint)
    files = spark.createDataFrame(
        [
            (name, c["ms"], first_covering_batch(ends, c["version"]))
            for c in delta_commits(Files(spark), gold.events)  # the silver events gold reads
            for name in c["files"]
        ],
        "file string, silver_ms bigint, gold_batch bigint",
    )
    commits = gold_commits(spark, gold).withColumnRenamed("batch", "gold_batch")
    sent = (
        delta.load(bronze_tables(conf, conf.stream("orders")).raw)
        .transform(parse_events)
        .transform(with_clock_bound, conf.silver.max_clock_skew_minutes)  # as silver decides
        .where(F.col("reason").isNull())
        .groupBy("event_id")
        .agg(F.min("kafka_timestamp").alias("kafka_timestamp"))
    )
    events = (
        delta.load(gold.events)
        .select("event_id", "event_type", F.col("_metadata.file_name").alias("file"))
        .join(files, "file")
        .join(sent, "event_id")
        .withColumn("kafka_ms", F.unix_millis("kafka_timestamp"))
    )
    # attribution check: events per gold batch must equal the batch's input rows
    attributed = Counter(dict(events.groupBy("gold_batch").count().collect()))
    reported = {b: p["rows"] for b, p in progress.get("gold", {}).items() if p["rows"]}
    mismatched = {b: (attributed[b], n) for b, n in reported.items() if attributed[b] != n}
    late = delta.load(gold.late).select("event_id")
    windowed = (
        events.where(F.col("event_type").isin("created", "paid"))
        .join(late, "event_id", "left_anti")
        .withColumn("table", F.when(F.col("event_type") == "paid", REVENUE).otherwise(COUNTRIES))
        .join(commits, ["table", "gold_batch"])
        .withColumn("freshness_s", (F.col("gold_ms") - F.col("kafka_ms")) / 1000)
        .withColumn("to_silver_s", (F.col("silver_ms") - F.col("kafka_ms")) / 1000)
        .withColumn("minute", F.floor((F.col("kafka_ms") - started_ms) / 60000))
    ).cache()
    per_minute = minute_by_minute(windowed)
    result = {
        "freshness_s": percentiles(windowed, "freshness_s"),
        "kafka_to_silver_s": percentiles(windowed, "to_silver_s"),
        "per_minute": per_minute,
        "late_events": late.count(),
        "events_in_silver": events.count(),
        "attribution_mismatches": mismatched,
        "gold_rows": {
            name.removeprefix("gold/"): delta.load(gold.aggregates[name]).count()
            for name in (REVENUE, COUNTRIES)
        },
    }
    windowed.unpersist()
    return result


def collect(queries: dict, printers: dict, progress: dict) -> None:
    for name, q in queries.items():
        printers[name].update(q)
        for p in q.recentProgress:
            row = progress_row(p)
            progress.setdefault(name, {})[p.batchId] = {
                "rows": p.numInputRows,
                "seconds": p.durationMs.get("triggerExecution", 0) / 1000,
                "state_rows": row["state_rows"],
                "state_operators": len(p.stateOperators),
                "at": p.timestamp,
                "lag": row["kafka_lag"],
            }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0, help="how long the stream is sent")
    parser.add_argument("--rate", type=float, help="records/s (default: half of bronze's maximum)")
    parser.add_argument("--backlog", type=int, default=500_000, help="records for bronze's max")
    parser.add_argument("--trigger", help="trigger interval of every layer (default: the env's)")
    parser.add_argument("--env", default="local")
    args = parser.parse_args()

    conf = load_config(args.env).updated({"spark.driver_memory": "6g"})
    broker.start(conf)
    if args.trigger:
        conf = conf.updated({f"{layer}.trigger_interval": args.trigger for layer in LAYERS})
    triggers = {layer: getattr(conf, layer).trigger_interval for layer in LAYERS}
    spark = build_spark(conf, app_name="bench-pipeline-freshness")
    # keep every batch's offsets for the attribution (Spark keeps 100 by default)
    spark.conf.set("spark.sql.streaming.minBatchesToRetain", "100000")

    rate, bronze_max = args.rate, None
    if rate is None:
        print(f"generating a backlog of {args.backlog:,} records ...", flush=True)
        bronze_max = measure_bronze_max(spark, conf, generate(args.backlog)[: args.backlog])
        rate = bronze_max / 2
        print(f"bronze maximum {bronze_max:,.0f}/s, running at half: {rate:,.0f}/s", flush=True)
    total = int(rate * args.minutes * 60)
    print(f"generating {total:,} records ...", flush=True)
    plan = StreamPlan(with_every_twist(), generate(total, first_chunk=100)[:total])

    conf = fresh(conf, "orders")
    topic = conf.stream("orders").topic
    seed_dimensions(spark, conf)
    queries = {layer: start(spark, conf) for layer, start in LAYERS.items()}
    printers = {name: ConsoleProgress(name) for name in queries}
    progress: dict = {}
    print(
        f"sending {total:,} records to {topic} at {rate:,.0f}/s for {args.minutes} min; triggers: "
        + ", ".join(f"{layer} {trigger}" for layer, trigger in triggers.items()),
        flush=True,
    )
    started_ms = int(time.time() * 1000)
    with ThreadPoolExecutor(1) as pool:
        sending = pool.submit(produce_plan, conf, plan, topic, track=False, rate=rate)
        while not sending.done():
            wait([sending], timeout=2)
            collect(queries, printers, progress)
            for name, q in queries.items():
                if q.exception():
                    raise RuntimeError(f"{name} failed: {q.exception()}")
    sending.result()
    sent_s = time.time() - started_ms / 1000
    print(f"sent {total:,} records in {sent_s:.1f}s; draining ...", flush=True)
    for q in queries.values():
        q.processAllAvailable()
        collect(queries, printers, progress)
    drained_s = time.time() - started_ms / 1000 - sent_s
    for q in queries.values():
        q.stop()

    result = analyse(spark, conf, started_ms, progress)
    gold_batches = progress.get("gold", {})
    state_rows = [p["state_rows"] for _, p in sorted(gold_batches.items())]
    quarters = [state_rows[min(len(state_rows) - 1, len(state_rows) * q // 4)] for q in range(1, 5)]
    f, s, per_minute = result["freshness_s"], result["kafka_to_silver_s"], result["per_minute"]
    report = [
        f"rate: {rate:,.0f} records/s for {sent_s:.0f}s ({total:,} records, scheduled for "
        f"{total / rate:.0f}s; bronze maximum {bronze_max and f'{bronze_max:,.0f}'} rows/s)",
        f"drain after the producer stopped: {drained_s:.1f}s",
        f"freshness Kafka timestamp -> gold window row committed, {f['n']:,} on-time created/paid "
        f"events: p50 {f['p50']:.1f}s, p90 {f['p90']:.1f}s, p99 {f['p99']:.1f}s, max {f['max']:.1f}s",
        f"  of which Kafka -> silver/order_events committed: p50 {s['p50']:.1f}s, p99 {s['p99']:.1f}s",
        "  per minute of sending (p50 / p99): "
        + ", ".join(f"{m}: {v['p50']:.1f}/{v['p99']:.1f}s" for m, v in per_minute.items()),
        f"gold state store rows per batch at 25/50/75/100% of {len(state_rows)} batches: {quarters} "
        f"(state operators: {max((p['state_operators'] for p in gold_batches.values()), default=0)})",
        f"gold tables: {result['gold_rows']}; late events recorded: {result['late_events']:,}",
        f"attribution check (events per gold batch = its input rows): "
        f"{result['attribution_mismatches'] or 'ok'}",
    ]
    for name in queries:
        b = progress.get(name, {})
        busy = [p for p in b.values() if p["rows"]]
        report.append(
            f"{name}: {len(b)} batches, {sum(p['rows'] for p in b.values()):,} rows, median "
            f"batch {sorted(p['seconds'] for p in busy)[len(busy) // 2] if busy else 0:.1f}s"
        )
    print("\n" + "\n".join(report))
    out = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "rate": rate,
        "bronze_max": bronze_max,
        "seconds": sent_s,
        "records": total,
        "triggers": list(triggers.values()),
        "drain_seconds": drained_s,
        "state_rows_quarters": quarters,
        **result,
        "batches": {n: list(b.values()) for n, b in progress.items()},
        "machine": {"cores": os.cpu_count()},
    }
    out_dir = Path(__file__).parent / "results"
    out_dir.mkdir(exist_ok=True)
    path = out_dir / f"pipeline_freshness-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"results: {path}")
    spark.stop()


if __name__ == "__main__":
    main()
