"""Benchmark: the pipeline job as users run it: drain rate, freshness at a steady rate, CPU cost.

Usage:
    .venv/bin/python -m bench.pipeline_job [--preload 3000000] [--rate 3000] [--minutes 5]

1. Drain: a backlog of `--preload` records (the reference stream, every twist) goes through
   `lakehouse run pipeline --once` in its own process: records/s from Kafka to gold, JVM start
   included. It leaves silver/orders holding about `--preload / 2.8` orders: the default leaves
   the 1M or more that the freshness targets are measured on, and `silver/order_events` about
   `--preload / 1.07` events.
2. Steady: `lakehouse run pipeline` (continuous, the configuration's trigger) runs in its own
   process while a paced producer sends `--rate` records/s, first for `--warmup-minutes` (not
   measured: the JVM compiles its hot code for minutes, the batches settle to the rate), then for
   `--minutes` (measured); then it is stopped with SIGTERM once it has caught up. Its events follow
   the backlog's in event time, on the date most of the backlog has: silver's dedupe reads that
   date's partition as a real stream's would, not a partition of its own.
3. Freshness of every on-time `created` and `paid` event, from the Kafka timestamp of its first
   delivery to the commit of the gold table whose window row counts it, exactly through the
   tables' logs: the bronze file holding the record -> the pipeline batch that committed that
   file (its Delta transaction id) -> that batch's commit to the gold table. p50/p90/p99/max
   overall and per minute of sending; and the lag (records Kafka holds that bronze has not
   committed, every 5 s), its largest and last value per minute: flat while the job keeps pace.
4. CPU: the job's processes' CPU time (Python driver and JVM; not the broker nor the producer)
   over the measured part of the steady run, in core-seconds per million records; and the batches
   of that part per query (count, duration, rows, from the progress table) and the bytes they
   added to the tables (their Delta logs) per pipeline batch.
5. The floor chain in the same run (`bench.freshness_floor`, variant `append+merge`: one append
   and one MERGE per batch, no lakehouse logic) at the same rate with the job's trigger, for
   `--floor-seconds`: its freshness p50 and CPU, and the job's ratios to them.
Figures go to bench/RESULTS.md and bench/results/pipeline_job-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable as DeltaLake
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from bench.backlog import (
    CHUNK_SPAN,
    RESULTS,
    T0,
    chunks_for,
    cpu_seconds,
    fresh,
    generate,
    generated,
    record,
)
from pipelines.config import LakehouseConf, load_config
from pipelines.kafka import topic_watermarks
from pipelines.layers.bronze import bronze_tables
from pipelines.layers.gold import gold_tables, seed_dimensions
from pipelines.layers.silver import silver_tables
from pipelines.local import broker
from pipelines.reference.orders_stream import StreamPlan, with_every_twist
from pipelines.reference.producer import produce_plan
from pipelines.session import build_spark
from pipelines.streaming.storage import Files
from silver.events import with_clock_bound
from silver.order_events import parse_events

REPO = Path(__file__).resolve().parent.parent


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
            "bytes": sum(a["add"]["size"] for a in actions if "add" in a),
            "txn": [(a["txn"]["appId"], a["txn"]["version"]) for a in actions if "txn" in a],
        }


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


class LagSampler(threading.Thread):
    """Every `every` seconds: the records Kafka holds that bronze has not committed yet."""

    def __init__(self, conf: LakehouseConf, every: float = 5.0) -> None:
        super().__init__(daemon=True)
        self.conf, self.every, self.samples = conf, every, []  # (unix ms, lag)
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(self.every):
            self.samples.append(
                (int(time.time() * 1000), produced(self.conf) - bronze_offsets(self.conf))
            )

    def per_minute(self, started_ms: int) -> dict[int, dict]:
        """Per minute of sending: the largest and the last lag sampled."""
        minutes: dict[int, list[int]] = {}
        for ms, lag in self.samples:
            minutes.setdefault((ms - started_ms) // 60000, []).append(lag)
        return {m: {"max": max(lags), "last": lags[-1]} for m, lags in sorted(minutes.items())}


def job_env(conf: LakehouseConf, env: str) -> dict[str, str]:
    return {
        **os.environ,
        "LAKEHOUSE_ENV": env,
        "LAKEHOUSE__STORAGE__ROOT": conf.storage.root,
        "LAKEHOUSE__STREAMS__ORDERS__TOPIC": conf.stream("orders").topic,
    }


def produced(conf: LakehouseConf) -> int:
    return sum(w.high for w in topic_watermarks(conf, conf.stream("orders").topic))


def bronze_offsets(conf: LakehouseConf) -> int:
    """Records bronze holds (= the offsets it read, one topic), from its files' statistics: no
    Spark job competing with the job for the cores while it catches up."""
    path = bronze_tables(conf, conf.stream("orders")).raw
    files = DeltaLake(path, storage_options=conf.delta_rs_options()).get_add_actions(flatten=True)
    return sum(pa.table(files).column("num_records").to_pylist())


def batch_figures(spark, conf: LakehouseConf, started_ms: int, ended_ms: int) -> dict:
    """Per query of the job, its batches with records that started in [started_ms, ended_ms]
    (the progress table): how many, their duration (mean, p50, max) and records; and the bytes
    the job's commits in that time added to every table of the root, per pipeline batch."""
    progress = spark.read.format("delta").load(conf.table_path(conf.progress_table.table))
    ms = F.unix_millis("event_time")
    queries = {
        name: {
            "batches": n,
            "mean_s": mean / 1000,
            "p50_s": p50 / 1000,
            "max_s": top / 1000,
            "records": rows,
        }
        for name, n, mean, p50, top, rows in progress.where(
            (ms >= started_ms) & (ms <= ended_ms) & (F.col("input_rows") > 0)
        )
        .groupBy("query_name")
        .agg(
            F.count("*"),
            F.mean("batch_duration_ms"),
            F.percentile("batch_duration_ms", 0.5),
            F.max("batch_duration_ms"),
            F.mean("input_rows"),
        )
        .collect()
    }
    root, files, written = Path(conf.storage.root), Files(spark), {}
    for log in root.rglob("_delta_log"):  # a local root
        table = str(log.parent.relative_to(root))
        written[table] = sum(
            c["bytes"]
            for c in delta_commits(files, str(log.parent))
            if started_ms <= c["ms"] <= ended_ms
        )
    batches = queries.get("pipeline_orders", {}).get("batches") or 1
    return {
        "queries": queries,
        "bytes": written,
        "bytes_per_batch": sum(written.values()) / batches,
    }


def batches_line(figures: dict) -> str:
    """The measured part's batches, per query, and the bytes written per pipeline batch."""
    queries = "; ".join(
        f"{name} {q['batches']:,} of mean **{q['mean_s']:.2f} s** (p50 {q['p50_s']:.2f}, max "
        f"{q['max_s']:.2f}), {q['records']:,.0f} rows"
        for name, q in sorted(figures["queries"].items())
    )
    top = sorted(figures["bytes"].items(), key=lambda kv: -kv[1])[:4]
    return (
        f"batches with rows while measured: {queries}; bytes added per pipeline batch **"
        f"{figures['bytes_per_batch'] / 1e6:.2f} MB** (all of them, the most: "
        + ", ".join(f"{t} {b / 1e6:,.0f} MB" for t, b in top)
        + ")"
    )


def analyse(spark, conf: LakehouseConf, started_ms: int, since_ms: int) -> dict:
    stream = conf.stream("orders")
    raw, gold = bronze_tables(conf, stream).raw, gold_tables(conf)
    batch_of_file = spark.createDataFrame(
        [
            (name, c["batch"])  # the batch its commit records (appends carry no txn ids)
            for c in delta_commits(Files(spark), raw)
            if c["batch"] is not None
            for name in c["files"]
        ],
        "file string, batch bigint",
    )
    commits = gold_commits(spark, gold)
    # the records sent from `since_ms` on (the steady part: its events' first deliveries too)
    rows = spark.read.format("delta").load(raw).where(F.unix_millis("kafka_timestamp") >= since_ms)
    batches = (
        rows.select("partition", "offset", F.col("_metadata.file_name").alias("file"))
        .join(batch_of_file, "file")
        .drop("file")
    )
    first = (
        parse_events(rows)
        .transform(with_clock_bound, conf.silver.max_clock_skew_minutes)  # as silver decides
        .where(F.col("reason").isNull() & F.col("event_type").isin("created", "paid"))
        .join(batches, ["partition", "offset"])
        .groupBy("event_id", "event_type")
        .agg(F.min(F.struct("batch", F.unix_millis("kafka_timestamp").alias("ms"))).alias("f"))
        .select("event_id", "event_type", "f.batch", F.col("f.ms").alias("kafka_ms"))
    )
    late = spark.read.format("delta").load(gold.late).select("event_id")
    windowed = (
        first.join(late, "event_id", "left_anti")
        .where(F.col("kafka_ms") >= started_ms)  # the steady run's events, not the preload's
        .withColumn("table", F.when(F.col("event_type") == "paid", REVENUE).otherwise(COUNTRIES))
        .join(commits, ["table", "batch"])
        .withColumn("freshness_s", (F.col("gold_ms") - F.col("kafka_ms")) / 1000)
        .withColumn("minute", F.floor((F.col("kafka_ms") - started_ms) / 60000))
    ).cache()
    result = {
        "freshness_s": percentiles(windowed, "freshness_s"),
        "per_minute": minute_by_minute(windowed),
    }
    windowed.unpersist()
    return result


def run_floor(args, conf: LakehouseConf, env: dict[str, str]) -> dict:
    """The floor chain (`bench.freshness_floor`, `append+merge`) at the same rate with the job's
    trigger, in a process of its own: its figures."""
    out = Path(tempfile.mkstemp(prefix="floor-", suffix=".json")[1])
    command = [sys.executable, "-m", "bench.freshness_floor", "--rate", str(int(args.rate))]
    command += ["--seconds", str(args.floor_seconds), "--variants", "append+merge"]
    command += ["--trigger", conf.pipeline.trigger_interval, "--json", str(out), "--env", args.env]
    subprocess.run(command, env=env, cwd=REPO, check=True)
    return json.loads(out.read_text())[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preload", type=int, default=3_000_000, help="backlog records drained")
    parser.add_argument("--rate", type=float, default=3000.0, help="records/s while steady")
    parser.add_argument(
        "--minutes", type=float, default=5.0, help="how long the rate is sent (0: drain only)"
    )
    # the JIT's share of the job's CPU is still 40 % after 3 minutes (bench/RESULTS.md)
    warm = "sent at the rate before the clock starts"
    parser.add_argument("--warmup-minutes", type=float, default=10.0, help=warm)
    parser.add_argument("--floor-seconds", type=float, default=120.0, help="0: no floor run")
    parser.add_argument("--env", default="local")
    parser.add_argument("--section", help="of bench/RESULTS.md (default: by the rate)")
    args = parser.parse_args()

    conf = load_config(args.env).updated({"spark.driver_memory": "3g"})
    broker.start(conf)
    conf = fresh(conf, "pipeline")
    env, lakehouse = job_env(conf, args.env), str(Path(sys.executable).parent / "lakehouse")
    spark = build_spark(conf, app_name="bench-pipeline-job")
    seed_dimensions(spark, conf)

    total, warmup = int(args.rate * args.minutes * 60), int(args.rate * args.warmup_minutes * 60)
    # the steady part's events follow the preload's in event time, on the date most of them have:
    # silver's dedupe reads the part of the events table its keys can be in, not a fresh partition
    preload_chunks = chunks_for(args.preload)
    t0 = T0 + timedelta(days=1) - (preload_chunks + chunks_for(warmup + total)) * CHUNK_SPAN
    print(f"generating and sending {args.preload:,} records ...", flush=True)
    topic, left = conf.stream("orders").topic, args.preload
    for chunk in generated(args.preload, t0=t0):
        plan = StreamPlan(with_every_twist(), chunk[:left])
        produce_plan(conf, plan, topic, track=False)
        left -= len(plan.records)
    started = time.monotonic()
    subprocess.run([lakehouse, "run", "pipeline", "--once"], env=env, cwd=REPO, check=True)
    drain_s = time.monotonic() - started
    silver = silver_tables(conf, conf.stream("orders"))
    drained = {"records": args.preload, "seconds": drain_s}
    for what, path in (("orders", silver.state), ("events", silver.events)):
        drained[what] = spark.read.format("delta").load(path).count()
    drain_line = (
        f"drain of {args.preload:,} records (every twist) by `lakehouse run pipeline --once`: "
        f"{drain_s:.1f} s = {args.preload / drain_s:,.0f} records/s Kafka to gold (JVM start "
        f"included); silver/orders then holds {drained['orders']:,} orders, silver/order_events "
        f"{drained['events']:,} events"
    )
    print(drain_line, flush=True)
    if not args.minutes:  # the drain alone
        figures = [drain_line]
        command = f"python -m bench.pipeline_job --preload {args.preload} --minutes 0"
        print(f"results: {record('Pipeline job drain', command, figures)}")
        spark.stop()
        return
    steady = generate(warmup + total, first_chunk=preload_chunks, t0=t0)[: warmup + total]
    since_ms = int(time.time() * 1000)
    job = subprocess.Popen([lakehouse, "run", "pipeline"], env=env, cwd=REPO)
    time.sleep(20)  # the JVM starts and the first (empty) batch runs
    if warmup:  # at the rate, not measured
        plan = StreamPlan(with_every_twist(), steady[:warmup])
        produce_plan(conf, plan, topic, track=False, rate=args.rate)
    steady = steady[warmup:]
    cpu_before, started_ms = cpu_seconds(job.pid), int(time.time() * 1000)
    lag = LagSampler(conf)
    lag.start()
    produce_plan(conf, StreamPlan(with_every_twist(), steady), topic, track=False, rate=args.rate)
    sent_s = time.time() - started_ms / 1000
    lag.done.set()
    target = produced(conf)
    while bronze_offsets(conf) < target:
        time.sleep(1)
    time.sleep(15)  # the batch bronze committed last goes on to silver and gold
    cpu, ended_ms = cpu_seconds(job.pid) - cpu_before, int(time.time() * 1000)
    job.send_signal(signal.SIGTERM)
    job.wait(timeout=300)

    result = analyse(spark, conf, started_ms, since_ms) | {
        "lag_per_minute": lag.per_minute(started_ms),
        "batches": batch_figures(spark, conf, started_ms, ended_ms),
    }
    f = result["freshness_s"]
    per_m = result["per_minute"]
    core_s_per_m = cpu / (total / 1e6)
    floor = run_floor(args, conf, env) if args.floor_seconds else None
    figures = [
        drain_line,
        f"steady: {args.rate:,.0f} records/s for {sent_s:.0f} s ({total:,} records) after "
        f"{args.warmup_minutes:g} min at that rate, `lakehouse run pipeline` (trigger "
        f"{conf.pipeline.trigger_interval})",
        f"freshness Kafka timestamp -> gold window row committed, {f['n']:,} on-time created/paid "
        f"events: **p50 {f['p50']:.1f} s, p99 {f['p99']:.1f} s**, p90 {f['p90']:.1f} s, "
        f"max {f['max']:.1f} s",
        "per minute (p50/p99): "
        + ", ".join(f"{m}: {v['p50']:.1f}/{v['p99']:.1f}" for m, v in per_m.items()),
        "lag per minute, records in Kafka not yet in bronze every 5 s (max/last): "
        + ", ".join(
            f"{m}: {v['max']:,}/{v['last']:,}" for m, v in result["lag_per_minute"].items()
        ),
        f"CPU of the job's processes: {cpu:,.0f} core-s = **{core_s_per_m:,.1f} "
        "core-s per million records**",
        batches_line(result["batches"]),
    ]
    if floor is not None:
        figures += [
            f"floor chain in the same run (`append+merge`, trigger {floor['trigger']}, "
            f"{floor['records']:,} records at {args.rate:,.0f}/s): freshness p50 "
            f"{floor['p50_s']:.2f} s, p99 {floor['p99_s']:.2f} s; "
            f"{floor['core_s_per_million']:,.1f} core-s per million records",
            f"ratios to the floor: freshness p50 **{f['p50'] / floor['p50_s']:.2f}x**, CPU "
            f"**{core_s_per_m / floor['core_s_per_million']:.2f}x**",
        ]
    print("\n".join(figures))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"pipeline_job-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    payload = {"drain": drained, "rate": args.rate, "records": total, "cpu_s": cpu, **result}
    payload["warmup_minutes"] = args.warmup_minutes
    payload["floor"] = floor
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    command = (
        f"python -m bench.pipeline_job --preload {args.preload} --rate {args.rate:g} "
        f"--minutes {args.minutes:g} --warmup-minutes {args.warmup_minutes:g} "
        f"--floor-seconds {args.floor_seconds:g}"
        + (f' --section "{args.section}"' if args.section else "")
    )
    section = args.section or f"Pipeline job at {args.rate:,.0f}/s"
    print(f"results: {out} and {record(section, command, figures)}")
    spark.stop()


if __name__ == "__main__":
    main()
