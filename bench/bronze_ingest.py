"""Benchmark: bronze draining a backlog, against Kafka's own consumer and the plain Spark job.

Usage:
    .venv/bin/python -m bench.bronze_ingest [--records 10000000] [--env local]

Produces a backlog of the reference stream (every twist) to a fresh topic on the local broker,
then reads it three times:
- `org.apache.kafka.tools.ConsumerPerformance`, the ceiling: a bare JVM consumer that keeps
  nothing (its own figure, JVM start excluded);
- the plain Spark job a user would write instead of bronze: `readStream.format("kafka")` ->
  `writeStream.format("delta")`, available-now, Spark's default source options (no per-trigger
  cap, no headers), in a new Python process and JVM with the lakehouse's session settings;
- `lakehouse run bronze --once`, as a user runs it, in a new process and JVM.
Both Spark figures are wall time from the process start to its end: JVM start included. Prints
rates and the ratios bronze / ConsumerPerformance and bronze / plain job; the figures go to
bench/RESULTS.md and bench/results/bronze_ingest-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime
from itertools import chain
from pathlib import Path

from bench.backlog import RESULTS, fresh, generate, record
from pipelines.config import load_config
from pipelines.kafka import topic_watermarks
from pipelines.local import broker
from pipelines.local.jars import java_executable, kafka_jars
from pipelines.reference.orders_stream import StreamPlan, with_every_twist
from pipelines.reference.producer import produce_plan

REPO = Path(__file__).resolve().parent.parent


def consumer_performance(conf, topic: str, records: int) -> dict[str, float]:
    """Run Kafka's ConsumerPerformance over the topic; return its figures."""
    tool = "org.apache.kafka.tools.ConsumerPerformance"
    options = {
        "--bootstrap-server": conf.kafka.bootstrap_servers,
        "--topic": topic,
        "--messages": str(records),
        "--timeout": "120000",
        "--group": f"perf-{uuid.uuid4().hex[:8]}",
    }
    jars = kafka_jars(conf.local_broker.version)
    cmd = [java_executable(), "-Xmx1g", "-cp", f"{jars}/*", tool, *chain(*options.items())]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    lines = [ln for ln in out.splitlines() if ln.strip() and not ln.startswith("WARNING")]
    header, values = ([cell.strip() for cell in line.split(",")] for line in lines[-2:])
    figures = dict(zip(header, values, strict=True))
    start, end = (
        datetime.strptime(figures[t], "%Y-%m-%d %H:%M:%S:%f") for t in ("start.time", "end.time")
    )
    return {
        "records": float(figures["data.consumed.in.nMsg"]),
        "mb": float(figures["data.consumed.in.MB"]),
        "records_per_s": float(figures["nMsg.sec"]),
        "seconds": (end - start).total_seconds(),
    }


def plain_job(env: str, root: str, topic: str) -> None:
    """The job a user would write: Kafka -> Delta, available-now, Spark's default options but
    read_committed (the contract's records only)."""
    from pipelines.session import build_spark

    conf = load_config(env).updated({"storage.root": root})
    spark = build_spark(conf, app_name="bench-plain-kafka-to-delta")
    (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", conf.kafka.bootstrap_servers)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("kafka.isolation.level", "read_committed")  # what the contract reads
        .load()
        .writeStream.format("delta")
        .option("checkpointLocation", f"{root}/_checkpoints/plain")
        .trigger(availableNow=True)
        .start(f"{root}/plain")
        .awaitTermination()
    )
    spark.stop()


def timed(cmd: list[str], env: dict[str, str] | None = None) -> float:
    """Wall seconds of a command run to its end (it must succeed)."""
    started = time.monotonic()
    subprocess.run(cmd, check=True, cwd=REPO, env={**os.environ, **(env or {})})
    return time.monotonic() - started


def delta_rows(root: str, table: str, storage_options: dict[str, str] | None = None) -> int:
    import pyarrow as pa
    from deltalake import DeltaTable

    files = pa.table(
        DeltaTable(f"{root}/{table}", storage_options=storage_options).get_add_actions()
    )
    return sum(files.column("num_records").to_pylist())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000, help="backlog size")
    parser.add_argument("--env", default="local")
    parser.add_argument("--topic", help="read this topic's backlog instead of producing one")
    parser.add_argument("--plain-job", nargs=2, metavar=("ROOT", "TOPIC"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.plain_job:
        return plain_job(args.env, *args.plain_job)

    conf = load_config(args.env)
    broker.start(conf)
    conf = fresh(conf, "bronze")
    if args.topic:
        conf = conf.updated({"streams.orders.topic": args.topic})
    topic, root = conf.stream("orders").topic, conf.storage.root
    if args.topic:
        n = sum(w.high - w.low for w in topic_watermarks(conf, topic))
    else:
        print(f"generating {args.records:,} records ...", flush=True)
        records = generate(args.records)[: args.records]
        produced = produce_plan(conf, StreamPlan(with_every_twist(), records), topic, track=False)
        n = len(records)
        del records
        print(f"produced in {produced.seconds:.1f}s", flush=True)
    print(f"backlog: {n:,} records on {topic}", flush=True)

    perf = consumer_performance(conf, topic, n)
    print(
        f"ConsumerPerformance: {n:,} records in {perf['seconds']:.1f}s = "
        f"{perf['records_per_s']:,.0f} records/s ({perf['mb']:,.0f} MB)",
        flush=True,
    )
    python = sys.executable
    plain_s = timed(
        [python, "-m", "bench.bronze_ingest", "--env", args.env, "--plain-job", root, topic]
    )
    plain_rows = delta_rows(root, "plain")
    assert plain_rows == n, f"the plain job wrote {plain_rows:,} rows, expected {n:,}"
    print(f"plain Spark job: {n:,} rows in {plain_s:.1f}s = {n / plain_s:,.0f} rows/s", flush=True)

    overrides = {"LAKEHOUSE__STORAGE__ROOT": root, "LAKEHOUSE__STREAMS__ORDERS__TOPIC": topic}
    lakehouse = str(Path(python).parent / "lakehouse")
    bronze_s = timed([lakehouse, "run", "bronze", "--once", "--env", args.env], overrides)
    bronze_rows = delta_rows(root, conf.stream("orders").bronze_table)
    assert bronze_rows == n, f"bronze holds {bronze_rows:,} rows, expected {n:,}"
    rate = n / bronze_s
    vs_perf, vs_plain = rate / perf["records_per_s"], plain_s / bronze_s
    figures = [
        f"backlog: {n:,} records ({perf['mb']:,.0f} MB) on 4 partitions",
        f"Kafka ConsumerPerformance: {perf['records_per_s']:,.0f} records/s "
        f"({perf['seconds']:.1f} s, JVM start excluded)",
        f"plain Spark Kafka -> Delta job (available-now, default options): {plain_s:.1f} s = "
        f"{n / plain_s:,.0f} rows/s (JVM start included)",
        f"`lakehouse run bronze --once`: {bronze_s:.1f} s = {rate:,.0f} rows/s "
        f"(JVM start included)",
        f"ratio bronze / ConsumerPerformance: **{vs_perf:.3f}**",
        f"ratio bronze / plain Spark job: **{vs_plain:.3f}**",
    ]
    print("\n".join(figures))
    results = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "records": n,
        "consumer_performance": perf,
        "plain_seconds": round(plain_s, 2),
        "bronze_seconds": round(bronze_s, 2),
        "bronze_rows_per_s": round(rate),
        "ratio_consumer_performance": round(vs_perf, 4),
        "ratio_plain_job": round(vs_plain, 4),
        "machine": {"cores": os.cpu_count()},
    }
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"bronze_ingest-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.write_text(json.dumps(results, indent=2) + "\n")
    command = "python -m bench.bronze_ingest" + (
        f" --records {args.records}" if args.records != 10_000_000 else ""
    )
    print(f"results: {out} and {record('Bronze drain', command, figures)}")


if __name__ == "__main__":
    main()
