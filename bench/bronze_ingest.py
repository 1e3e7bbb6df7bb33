"""Benchmark: bronze ingest rate while draining a backlog, against Kafka's own consumer tool.

Usage:
    .venv/bin/python bench/bronze_ingest.py [--records 1000000] [--env local]

Produces a backlog of the reference stream to a fresh topic on the local broker, reads it once
with `org.apache.kafka.tools.ConsumerPerformance` (the ceiling: a bare JVM consumer that keeps
nothing), then drains it with the bronze job (`--once`) into a fresh Delta table, and prints both
rates and their ratio. Results also go to bench/results/bronze_ingest-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import time
import uuid
from datetime import UTC, datetime
from itertools import chain
from pathlib import Path

from pipelines.config import load_config
from pipelines.layers.bronze import bronze_tables, run_bronze
from pipelines.local import broker
from pipelines.local.jars import java_executable, kafka_jars
from pipelines.reference.orders_stream import StreamOptions, generate_orders_stream
from pipelines.reference.producer import produce_plan
from pipelines.streaming.spark import build_spark


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
        "fetch_records_per_s": float(figures["fetch.nMsg.sec"]),
        "seconds": (end - start).total_seconds(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="backlog size (approx.)")
    parser.add_argument("--env", default="local")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=250_000)
    args = parser.parse_args()

    conf = load_config(args.env)
    broker.start(conf)
    topic = f"bench.orders.{uuid.uuid4().hex[:8]}"
    conf = conf.updated(
        {
            "storage.root": tempfile.mkdtemp(prefix="lakehouse-bench-"),
            "streams.orders.topic": topic,
            "bronze.max_offsets_per_trigger": args.max_offsets_per_trigger,
            "spark.driver_memory": "4g",
        }
    )
    # ~2.4 records per order once re-deliveries and invalid records are added
    options = StreamOptions(
        orders=int(args.records / 2.3),
        seed=99,
        redelivery_rate=0.05,
        invalid_rate=0.02,
        out_of_order_rate=0.1,
        null_key_rate=0.02,
    )
    plan = generate_orders_stream(options)
    plan.records = plan.records[: args.records]
    produced = produce_plan(conf, plan, topic, track=False, progress=True)
    n = len(plan.records)
    print(f"backlog: {n:,} records on {topic} ({produced.seconds:.1f}s to produce)")

    perf = consumer_performance(conf, topic, n)
    print(
        f"ConsumerPerformance: {perf['records']:,.0f} records in {perf['seconds']:.1f}s = "
        f"{perf['records_per_s']:,.0f} records/s ({perf['mb']:.0f} MB)"
    )

    spark = build_spark(conf, app_name="bench-bronze")
    started = time.monotonic()
    query = run_bronze(spark, conf, once=True, progress=True)
    seconds = time.monotonic() - started
    batches = [p for p in query.recentProgress if p.numInputRows]
    batch_s = sum(p.durationMs["triggerExecution"] for p in batches) / 1000
    steady = n / batch_s
    rows = spark.read.format("delta").load(bronze_tables(conf, conf.stream("orders")).raw).count()
    assert rows == n, f"bronze holds {rows:,} rows, expected {n:,}"
    rate = n / seconds
    ratio, steady_ratio = (r / perf["records_per_s"] for r in (rate, steady))
    print(
        f"bronze --once: {n:,} rows in {seconds:.1f}s = {rate:,.0f} rows/s "
        f"(batches of {args.max_offsets_per_trigger:,}, query start to stop)"
    )
    print(f"bronze batches only: {len(batches)} batches in {batch_s:.1f}s = {steady:,.0f} rows/s")
    print(
        f"ratio bronze / ConsumerPerformance: {ratio:.3f} (1 / {1 / ratio:.1f}) end to end, "
        f"{steady_ratio:.3f} (1 / {1 / steady_ratio:.1f}) in batches"
    )
    results = {
        "when": datetime.now(UTC).isoformat(timespec="seconds"),
        "records": n,
        "bronze_seconds": round(seconds, 2),
        "bronze_rows_per_s": round(rate),
        "consumer_performance": perf,
        "ratio": round(ratio, 4),
        "bronze_batch_seconds": round(batch_s, 2),
        "bronze_batch_rows_per_s": round(steady),
        "batch_ratio": round(steady_ratio, 4),
        "max_offsets_per_trigger": args.max_offsets_per_trigger,
        "machine": {"cores": os.cpu_count()},
    }
    out = Path(__file__).parent / f"results/bronze_ingest-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results: {out}")
    spark.stop()


if __name__ == "__main__":
    main()
