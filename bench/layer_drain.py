"""Benchmark: each layer job draining a backlog, as spark-submit and the job specs run them.

Usage:
    .venv/bin/python -m bench.layer_drain [--records 2000000] [--topic TOPIC] [--env local]

Produces a backlog of the reference stream (every twist) to a fresh topic (or reads `--topic`),
then runs `lakehouse run bronze --once`, `lakehouse run silver --once` and `lakehouse run gold
--once` one after the other on one fresh storage root, each in a new process and JVM, as a user
runs them. Each figure is wall time from the process start to its end (JVM start included), in
records of the layer's input per second: Kafka records for bronze, bronze rows for silver, silver
events for gold. Prints where each job's batches spent their time (the per-step timings every
batch logs). The figures go to bench/RESULTS.md and bench/results/layer_drain-<time>.json.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.backlog import RESULTS, fresh, generate, record
from bench.bronze_ingest import delta_rows
from pipelines.config import load_config
from pipelines.kafka import topic_watermarks
from pipelines.local import broker, s3
from pipelines.reference.orders_stream import StreamPlan, with_every_twist
from pipelines.reference.producer import produce_plan

REPO = Path(__file__).resolve().parent.parent
# the progress lines every batch logs (`pipelines/streaming/console.py`), once each: the ones the
# `RUN` handler writes, without a time
BATCH = re.compile(r"^lakehouse\.progress: \[(\w+)\] batch \d+: ")
STEP = re.compile(r"^lakehouse\.progress: \[[\w ]+\]\s+where the time went: (.*)$")
# run as a user does, with the per-batch step timings logged (they go to the job's log)
RUN = (
    "import logging, sys; logging.basicConfig(level=logging.WARNING, format='%(name)s: %(message)s');"
    " logging.getLogger('lakehouse.batch').setLevel(logging.INFO);"
    " from pipelines.cli import main; sys.exit(main(sys.argv[1:]))"
)


def run_layer(layer: str, env: str, overrides: dict[str, str], log: Path) -> float:
    """Wall seconds of `lakehouse run <layer> --once` to its end (it must succeed)."""
    started = time.monotonic()
    with log.open("w") as out:
        subprocess.run(
            [sys.executable, "-c", RUN, "run", layer, "--once", "--env", env],
            check=True,
            cwd=REPO,
            env={**os.environ, **overrides},
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    return time.monotonic() - started


def steps(log: Path) -> tuple[int, dict[str, float]]:
    """How many batches the job's log shows, and the seconds of each step over all of them."""
    total: dict[str, float] = collections.defaultdict(float)
    batches = 0
    for line in log.read_text(errors="replace").splitlines():
        batches += bool(BATCH.match(line))  # the layer's query; its state query's steps count
        m = STEP.match(line)
        for part in m[1].split(", ") if m else ():
            name, seconds = part.rsplit(" ", 1)
            total[name] += float(seconds.removesuffix("s"))
    return batches, dict(total)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=2_000_000, help="backlog size")
    parser.add_argument("--env", default="local")
    parser.add_argument("--topic", help="read this topic's backlog instead of producing one")
    args = parser.parse_args()

    conf = load_config(args.env)
    broker.start(conf)
    if conf.remote:  # the local S3 endpoint of `--env s3-local`
        s3.start(conf)
    conf = fresh(conf, "layers")
    if args.topic:
        conf = conf.updated({"streams.orders.topic": args.topic})
    stream = conf.stream("orders")
    topic, root = stream.topic, conf.storage.root
    if args.topic:
        n = sum(w.high - w.low for w in topic_watermarks(conf, topic))
    else:
        print(f"generating {args.records:,} records ...", flush=True)
        records = generate(args.records)[: args.records]
        produce_plan(conf, StreamPlan(with_every_twist(), records), topic, track=False)
        n = len(records)
        del records
    print(f"backlog: {n:,} records on {topic}, storage root {root}", flush=True)

    overrides = {"LAKEHOUSE__STORAGE__ROOT": root, "LAKEHOUSE__STREAMS__ORDERS__TOPIC": topic}
    overrides["LAKEHOUSE__STORAGE__LOG_DIR"] = str(conf.log_dir)
    lakehouse = str(Path(sys.executable).parent / "lakehouse")
    env = {**os.environ, **overrides}
    subprocess.run([lakehouse, "seed", "--env", args.env], check=True, cwd=REPO, env=env)
    inputs = {"bronze": n}
    results: dict[str, dict] = {}
    figures = [f"backlog: {n:,} records on {stream.partitions} partitions"]
    for layer, table in (
        ("bronze", stream.bronze_table),
        ("silver", stream.events_table),
        ("gold", None),
    ):
        log = conf.log_dir / f"{layer}.log"
        seconds = run_layer(layer, args.env, overrides, log)
        batches, spent = steps(log)
        rate = inputs[layer] / seconds
        results[layer] = {
            "input_records": inputs[layer],
            "seconds": round(seconds, 2),
            "records_per_s": round(rate),
            "batches": batches,
            "steps": {k: round(v, 2) for k, v in spent.items()},
        }
        where = ", ".join(
            f"{k} {v:.1f}" for k, v in sorted(spent.items(), key=lambda kv: -kv[1])[:6]
        )
        line = (
            f"`lakehouse run {layer} --once`: {inputs[layer]:,} records in {seconds:.1f} s = "
            f"**{rate:,.0f} records/s** (JVM start included), {batches} batches; "
            f"steps over all batches (s): {where}"
        )
        print(line, flush=True)
        figures.append(line)
        if table is not None:
            rows = delta_rows(root, table, conf.delta_rs_options())
            if layer == "bronze":
                assert rows == n, f"bronze holds {rows:,} rows, expected {n:,}"
                inputs["silver"] = rows
            else:
                inputs["gold"] = rows  # the events gold reads

    out = RESULTS / f"layer_drain-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    RESULTS.mkdir(exist_ok=True)
    out.write_text(
        json.dumps(
            {
                "when": datetime.now(UTC).isoformat(timespec="seconds"),
                "records": n,
                "layers": results,
                "machine": {"cores": os.cpu_count()},
            },
            indent=2,
        )
        + "\n"
    )
    command = "python -m bench.layer_drain" + (
        f" --records {args.records}" if args.records != 2_000_000 else ""
    )
    command += f" --env {args.env}" if args.env != "local" else ""
    name = "Layer jobs drain" + (" on the local S3 endpoint" if conf.remote else "")
    print(f"results: {out} and {record(name, command, figures)}")


if __name__ == "__main__":
    main()
