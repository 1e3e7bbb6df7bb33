"""Benchmark: the freshness floor of Spark + Delta on this machine, below any lakehouse logic.

Usage:
    .venv/bin/python -m bench.freshness_floor [--rate 3000] [--seconds 120] [--variants append,merge]

The simplest exact jobs a user could write, each a streaming query from Kafka with `--trigger`
(default: Spark's, a batch starts as soon as the previous one ends), in one warm JVM with the
lakehouse's session settings, while a paced producer (a process of its own) sends `--rate` small
JSON records/s:
- `append`: each micro-batch appended to one Delta table (one commit, idempotent by txn ids);
- `merge`: each micro-batch parsed, counted per 1-minute window and category, and MERGEd into
  one small Delta table (one commit, idempotent by txn ids): the least a gold table costs;
- `append+merge`: both, one after the other: the least a bronze + gold batch costs.
Freshness of every record, from its Kafka timestamp (the producer's delivery report gives its
partition, offset and timestamp) to the return of the write that committed its batch (the
batch's offsets from the checkpoint's offset log): p50/p99 and the batches' mean duration.
CPU: this process's and its JVM's CPU time (not the producer's) while the rate is sent and
caught up, in core-seconds per million records. `--json FILE` writes the figures there too (the
pipeline job's benchmark runs this one beside it, with its trigger, to measure against it).
A 20-second run of `append+merge` warms the JVM up first and is not measured.
Whatever the lakehouse adds (validation, dedupe, quarantine, late events, the state MERGE)
comes on top of these figures; a target below them is out of reach on this machine.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import time
from pathlib import Path

from confluent_kafka import Producer
from pyspark.sql import functions as F

from bench.backlog import cpu_seconds, fresh, record
from pipelines.config import load_config
from pipelines.local import broker, s3
from pipelines.session import build_spark
from pipelines.streaming.storage import Files

CATEGORIES = ["books", "games", "garden", "tools", "toys", "music", "food", "shoes"]


def produce(servers: str, topic: str, rate: int, seconds: float, reports) -> None:
    """Send `rate` records/s for `seconds`, paced per 10 ms; then the delivery reports, as
    (partition, offset, Kafka timestamp ms), into the pipe `reports`."""
    delivered: list = []
    p = Producer({"bootstrap.servers": servers, "linger.ms": 5, "acks": "all"})

    def done(err, msg) -> None:
        if err is None:
            delivered.append((msg.partition(), msg.offset(), msg.timestamp()[1]))

    start, sent, i = time.monotonic(), 0, 0
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate)
        while sent < due:
            value = {
                "id": i,
                "category": CATEGORIES[i % len(CATEGORIES)],
                "amount": f"{(i % 997) / 10:.2f}",
                "ts": time.time(),
            }
            p.produce(topic, json.dumps(value).encode(), key=str(i).encode(), on_delivery=done)
            sent, i = sent + 1, i + 1
        p.poll(0)
        time.sleep(0.01)
    p.flush(30)
    reports.send(delivered)


def batch_ranges(files: Files, checkpoint: str) -> dict[int, dict[int, tuple[int, int]]]:
    """Batch id -> partition -> (start, end) offsets, from the checkpoint's offset log."""
    ends: dict[int, dict[int, int]] = {}
    for name in files.names(f"{checkpoint}/offsets"):
        if name.isdigit():
            text = files.read_text(f"{checkpoint}/offsets/{name}") or ""
            offsets = json.loads(text.splitlines()[-1])
            ends[int(name)] = {int(p): o for p, o in next(iter(offsets.values())).items()}
    ranges, previous = {}, {}
    for b in sorted(ends):
        ranges[b] = {p: (previous.get(p, 0), e) for p, e in ends[b].items()}
        previous = ends[b]
    return ranges


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def run_variant(spark, conf, variant: str, rate: int, seconds: float, trigger: str) -> dict:
    c = fresh(conf, f"floor-{variant.replace('+', '-')}")
    topic, root = c.stream("orders").topic, c.storage.root
    checkpoint, raw, gold = f"{root}/_checkpoint", f"{root}/raw", f"{root}/gold"
    spark.sql(
        f"CREATE TABLE delta.`{gold}` (window_start TIMESTAMP, category STRING, "
        "events BIGINT, amount DECIMAL(18,2)) USING delta"
    )
    committed: dict[int, float] = {}
    durations: list[float] = []
    schema = "id BIGINT, category STRING, amount STRING, ts DOUBLE"

    def write(batch, batch_id: int) -> None:
        t0 = time.time()
        if "append" in variant:
            (
                batch.write.format("delta")
                .mode("append")
                .option("txnAppId", "floor-append")
                .option("txnVersion", batch_id)
                .save(raw)
            )
        if "merge" in variant:
            events = batch.select(F.from_json(F.col("value").cast("string"), schema).alias("e"))
            counts = events.groupBy(
                F.date_trunc("minute", F.timestamp_seconds("e.ts")).alias("window_start"),
                F.col("e.category").alias("category"),
            ).agg(
                F.count("*").alias("events"),
                F.sum(F.col("e.amount").try_cast("decimal(18,2)")).alias("amount"),
            )
            s = batch.sparkSession
            s.conf.set("spark.databricks.delta.write.txnAppId", "floor-merge")
            s.conf.set("spark.databricks.delta.write.txnVersion", str(batch_id))
            try:
                counts.createOrReplaceTempView("floor_counts")
                s.sql(
                    f"MERGE INTO delta.`{gold}` t USING floor_counts s "
                    "ON t.window_start = s.window_start AND t.category = s.category "
                    "WHEN MATCHED THEN UPDATE SET t.events = t.events + s.events, "
                    "t.amount = t.amount + s.amount WHEN NOT MATCHED THEN INSERT *"
                )
            finally:
                s.conf.unset("spark.databricks.delta.write.txnAppId")
                s.conf.unset("spark.databricks.delta.write.txnVersion")
        committed[batch_id] = time.time()
        durations.append(committed[batch_id] - t0)

    query = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", c.kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")  # what the contract reads
        .load()
        .writeStream.foreachBatch(write)
        .option("checkpointLocation", checkpoint)
        .queryName(f"floor_{variant}")
        .trigger(processingTime=trigger)
        .start()
    )
    query.processAllAvailable()  # the first (empty) batch: the query is warm
    warm = len(durations)
    reports, sent = multiprocessing.get_context("spawn").Pipe(duplex=False)
    producer = multiprocessing.get_context("spawn").Process(
        target=produce, args=(c.kafka.bootstrap_servers, topic, rate, seconds, sent)
    )
    producer.start()
    cpu_before = cpu_seconds(os.getpid(), frozenset({producer.pid}))
    delivered = reports.recv()
    producer.join()
    query.processAllAvailable()
    cpu = cpu_seconds(os.getpid(), frozenset({producer.pid})) - cpu_before
    query.stop()

    ranges = batch_ranges(Files(spark), checkpoint)
    fresh_s = []
    for partition, offset, ts in delivered:
        b = next(
            b for b, r in ranges.items() if r.get(partition, (0, 0))[0] <= offset < r[partition][1]
        )
        fresh_s.append(committed[b] - ts / 1000)
    steady = durations[warm:]
    return {
        "variant": variant,
        "trigger": trigger,
        "records": len(delivered),
        "cpu_s": cpu,
        "core_s_per_million": cpu / (len(delivered) / 1e6),
        "batches": len(steady),
        "batch_mean_s": sum(steady) / max(1, len(steady)),
        "batch_max_s": max(steady, default=0.0),
        "p50_s": percentile(fresh_s, 0.5),
        "p99_s": percentile(fresh_s, 0.99),
        "max_s": max(fresh_s),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=int, default=3000)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--variants", default="append,merge,append+merge")
    parser.add_argument("--trigger", default="0 seconds", help="processing-time trigger")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    parser.add_argument("--env", default="local")
    args = parser.parse_args()
    conf = load_config(args.env)
    broker.start(conf)
    if conf.remote:  # the local S3 endpoint of `--env s3-local`
        s3.start(conf)
    spark = build_spark(conf, app_name="bench-freshness-floor")
    run_variant(spark, conf, "append+merge", args.rate, 20, args.trigger)  # warm-up, unmeasured
    results = []
    for variant in args.variants.split(","):
        r = run_variant(spark, conf, variant, args.rate, args.seconds, args.trigger)
        results.append(r)
        print(
            f"{variant}: {r['records']:,} records in {r['batches']} batches "
            f"(mean {r['batch_mean_s']:.2f} s, max {r['batch_max_s']:.2f} s): freshness p50 {r['p50_s']:.2f} s, "
            f"p99 {r['p99_s']:.2f} s, max {r['max_s']:.2f} s; "
            f"{r['core_s_per_million']:,.0f} core-s per million records",
            flush=True,
        )
    spark.stop()
    if args.json:  # run for another benchmark, which records the figures with its own
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        return
    where = " on the local S3 endpoint" if conf.remote else ""
    record(
        f"Freshness floor at {args.rate:,}/s{where}",
        f"python -m bench.freshness_floor --rate {args.rate} --seconds {args.seconds:g} "
        f"--variants {args.variants} --trigger '{args.trigger}' --env {args.env}",
        [
            f"`{r['variant']}`: {r['records']:,} records, {r['batches']} batches of mean "
            f"{r['batch_mean_s']:.2f} s (max {r['batch_max_s']:.2f} s); freshness **p50 {r['p50_s']:.2f} s, p99 "
            f"{r['p99_s']:.2f} s**, max {r['max_s']:.2f} s; CPU "
            f"{r['core_s_per_million']:,.0f} core-s per million records"
            for r in results
        ],
    )


if __name__ == "__main__":
    main()
