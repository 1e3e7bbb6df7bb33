"""Benchmark: gold to Kafka, exactly once: the publish job's messages/s and publication delay.

Usage:
    .venv/bin/python -m bench.publish [--orders 60000] [--rate 3000] [--minutes 2]

1. Messages/s: a stream whose event times spread over days (many window rows) is drained by
   `lakehouse run pipeline --once`; `lakehouse run publish --once` (its own process) then
   publishes both gold tables' rows (a snapshot: one transaction), then a second part's changes
   (the change data feed, transactions of up to `publish.max_versions_per_transaction`
   versions). Messages/s with the JVM's start and without it (the job's own transactions).
2. Delay: `lakehouse run pipeline` and `lakehouse run publish` run side by side while a paced
   producer sends `--rate` records/s for `--minutes`; a read_committed consumer sees each
   change appear. The delay of a gold version is from its commit (its commit file's time in the
   table's log) to the moment its first message became readable, committed, in Kafka: p50/p99.
   Its floor in the same run: a transaction of one message committed by a bare transactional
   producer (what Kafka alone costs), and half the publish trigger interval (the wait for the
   next look at the tables).
Figures go to bench/RESULTS.md and bench/results/publish-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from bench.backlog import RESULTS, fresh, generate, record
from bench.pipeline_job import delta_commits, job_env
from pipelines.config import LakehouseConf, duration_seconds, load_config
from pipelines.kafka import client_settings, ensure_topic
from pipelines.layers.gold import gold_tables, seed_dimensions
from pipelines.local import broker
from pipelines.reference.orders_stream import (
    StreamOptions,
    StreamPlan,
    event_time_span,
    generate_orders_stream,
    with_every_twist,
)
from pipelines.reference.producer import produce_plan
from pipelines.session import build_spark
from pipelines.streaming.storage import Files

REPO = Path(__file__).resolve().parent.parent
# event times start a month back (ahead of the Kafka timestamps they would be quarantined)
SPREAD_START = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(
    days=30
)
ROUND = re.compile(r"\[publish\] \d+: .* in ([\d.]+)s \(")


def lakehouse(env: dict, *args: str, log: Path) -> subprocess.Popen:
    with log.open("ab") as out:
        return subprocess.Popen(
            [str(Path(sys.executable).parent / "lakehouse"), *args],
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def topic_messages(conf: LakehouseConf, topics: list[str]) -> int:
    """Messages a read_committed consumer reads in `topics` (partition 0 each)."""
    total = 0
    for topic in topics:
        consumer = Consumer(
            client_settings(conf)
            | {
                "group.id": "bench",
                "isolation.level": "read_committed",
                "enable.partition.eof": True,
            }
        )
        consumer.assign([TopicPartition(topic, 0, 0)])
        while True:
            batch = consumer.consume(10_000, timeout=5)
            total += sum(1 for m in batch if not m.error())
            if not batch or any(m.error() for m in batch):
                break
        consumer.close()
    return total


def throughput(conf: LakehouseConf, env: dict, logs: Path, orders: int, after: datetime) -> dict:
    """Step 1: a snapshot, then changes, each by `lakehouse run publish --once`."""
    stream = conf.stream("orders")
    topics = [stream.gold_topic(t) for t in stream.gold_tables]
    found = {}
    for step in ("snapshot", "changes"):
        log = logs / f"publish-{step}.log"
        before = topic_messages(conf, topics) if step == "changes" else 0
        started = time.monotonic()
        assert lakehouse(env, "run", "publish", "--once", log=log).wait() == 0, log.read_text()
        wall = time.monotonic() - started
        messages = topic_messages(conf, topics) - before
        in_job = sum(float(m) for m in ROUND.findall(log.read_text()))
        found[step] = {"messages": messages, "wall_s": wall, "transactions_s": in_job}
        if step == "snapshot":  # a second part of the stream, on time: gold's next windows
            part = generate_orders_stream(spread_options(seed=2, orders=orders, start=after))
            produce_plan(conf, StreamPlan(part.options, part.records), stream.topic, track=False)
            assert lakehouse(env, "run", "pipeline", "--once", log=logs / "drain.log").wait() == 0
    return found


def spread_options(seed: int, orders: int, start: datetime = SPREAD_START) -> StreamOptions:
    """Orders whose event times spread over days: a gold row per minute and group."""
    return StreamOptions(orders=orders, seed=seed, start_time=start, events_per_second=0.5)


def kafka_floor(conf: LakehouseConf, samples: int = 50) -> list[float]:
    """Seconds to commit a transaction of one message, a bare transactional producer."""
    topic = f"{conf.stream('orders').topic}.floor"
    ensure_topic(conf, topic, 1, 1)
    producer = Producer(client_settings(conf) | {"transactional.id": f"bench-floor-{topic}"})
    producer.init_transactions(30)
    took = []
    for i in range(samples):
        started = time.monotonic()
        producer.begin_transaction()
        producer.produce(topic, key=b"k", value=str(i).encode())
        producer.commit_transaction(30)
        took.append(time.monotonic() - started)
    return took


def watch(conf: LakehouseConf, topics: list[str], seen: dict, stop: threading.Event) -> None:
    """(table version -> when its first message was readable, read committed), until `stop`."""
    consumer = Consumer(
        client_settings(conf)
        | {
            "group.id": "bench-watch",
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 10,
            "fetch.error.backoff.ms": 10,
        }
    )
    consumer.assign([TopicPartition(t, 0, 0) for t in topics])
    while not stop.is_set():
        for m in consumer.consume(1000, timeout=0.05):
            if m.error():
                continue
            headers = dict(m.headers())
            key = (headers["lakehouse.table"].decode(), int(headers["lakehouse.version"]))
            seen.setdefault(key, time.time())
    consumer.close()


def delays(spark, conf: LakehouseConf, seen: dict, since_ms: int) -> list[tuple[float, float]]:
    """(seconds since `since_ms`, delay) of each gold version committed since then: from its
    commit to its first message read."""
    found = []
    for name, path in gold_tables(conf).aggregates.items():
        for c in delta_commits(Files(spark), path):
            if c["ms"] >= since_ms and (name, c["version"]) in seen:
                at = (c["ms"] - since_ms) / 1000
                found.append((at, seen[(name, c["version"])] - c["ms"] / 1000))
    return sorted(found)


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=int, default=60_000, help="orders spread over days")
    parser.add_argument("--rate", type=float, default=3000.0, help="records/s while steady")
    parser.add_argument("--minutes", type=float, default=2.0)
    parser.add_argument("--env", default="local")
    args = parser.parse_args()

    conf = load_config(args.env)
    broker.start(conf)
    conf = fresh(conf, "publish")
    env, logs = job_env(conf, args.env), Path(conf.storage.log_dir or "/tmp")
    spark = build_spark(conf, app_name="bench-publish")
    seed_dimensions(spark, conf)
    stream = conf.stream("orders")
    topics = [stream.gold_topic(t) for t in stream.gold_tables]

    part = generate_orders_stream(spread_options(seed=1, orders=args.orders))
    produce_plan(conf, StreamPlan(part.options, part.records), stream.topic, track=False)
    assert lakehouse(env, "run", "pipeline", "--once", log=logs / "drain.log").wait() == 0
    sizes = {
        n: spark.read.format("delta").load(p).count()
        for n, p in gold_tables(conf).aggregates.items()
    }
    after = SPREAD_START + event_time_span(part)
    found = throughput(conf, env, logs, args.orders, after)
    snap, changes = found["snapshot"], found["changes"]

    floor = kafka_floor(conf)
    seen: dict = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(conf, topics, seen, stop))
    watcher.start()
    pipeline = lakehouse(env, "run", "pipeline", log=logs / "pipeline.log")
    publisher = lakehouse(env, "run", "publish", log=logs / "publish-steady.log")
    time.sleep(25)  # both JVMs start and catch up before the clock starts
    since_ms = int(time.time() * 1000)
    total = int(args.rate * args.minutes * 60)
    steady = generate(total, first_chunk=100)[:total]
    produce_plan(
        conf, StreamPlan(with_every_twist(), steady), stream.topic, track=False, rate=args.rate
    )
    time.sleep(30)  # the last batches reach gold and Kafka
    for job in (pipeline, publisher):
        job.terminate()
        job.wait(timeout=300)
    stop.set()
    watcher.join()
    timed = delays(spark, conf, seen, since_ms)
    measured = [d for _, d in timed]
    warm = [d for at, d in timed if at >= 60]  # the publisher's JVM compiles its first rounds
    interval = duration_seconds(conf.publish.trigger_interval)

    def rate(step: dict, key: str) -> float:
        return step["messages"] / step[key] if step[key] else 0.0

    figures = [
        f"gold tables: {', '.join(f'{n} {c:,} rows' for n, c in sizes.items())}",
        f"snapshot (one transaction): {snap['messages']:,} messages, **{rate(snap, 'transactions_s'):,.0f} "
        f"messages/s** in the job's transactions, {rate(snap, 'wall_s'):,.0f}/s with the JVM's start "
        f"({snap['wall_s']:.1f} s)",
        f"changes (change data feed): {changes['messages']:,} messages, "
        f"**{rate(changes, 'transactions_s'):,.0f} messages/s** in the job's transactions, "
        f"{rate(changes, 'wall_s'):,.0f}/s with the JVM's start ({changes['wall_s']:.1f} s)",
        f"steady: {args.rate:,.0f} records/s for {args.minutes:g} min through `lakehouse run pipeline`, "
        f"`lakehouse run publish` beside it (trigger {conf.publish.trigger_interval})",
        f"publication delay, gold commit -> readable committed in Kafka, {len(measured)} versions: "
        f"p50 {pct(measured, 0.5):.2f} s, p99 {pct(measured, 0.99):.2f} s, max {max(measured):.2f} s; "
        f"from the second minute on ({len(warm)} versions): **p50 {pct(warm, 0.5):.2f} s, p99 "
        f"{pct(warm, 0.99):.2f} s**",
        f"floor: a one-message Kafka transaction p50 {pct(floor, 0.5) * 1000:.0f} ms, p99 "
        f"{pct(floor, 0.99) * 1000:.0f} ms; half the trigger interval {interval / 2:.2f} s",
    ]
    print("\n".join(figures))
    RESULTS.mkdir(exist_ok=True)
    out = RESULTS / f"publish-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    payload = {"sizes": sizes, **found, "delays_s": timed, "floor_s": floor}
    out.write_text(json.dumps(payload, indent=2) + "\n")
    command = f"python -m bench.publish --orders {args.orders} --rate {args.rate:g} --minutes {args.minutes:g}"
    print(f"results: {out} and {record('Publish gold to Kafka', command, figures)}")
    spark.stop()


if __name__ == "__main__":
    main()
