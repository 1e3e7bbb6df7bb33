"""Benchmark: what one pipeline batch of a fixed size costs, A/B between JVM settings.

Usage:
    .venv/bin/python -m bench.batch_cost [--records 450000] [--per-batch 30000] [--runs 3]
        [--variant NAME=JAVA_OPTIONS ...]

Each run drains a backlog of `--records` records (the reference stream, every twist) from a new
topic into a new storage root with `lakehouse run pipeline --once`, capped at `--per-batch`
records per batch, so every run makes the same batches on tables of the same sizes. From the
job's progress table: the duration of each batch of the Kafka-to-gold query; from /proc: the CPU
of the job's processes between the end of its third batch and the end of its last (the first
ones pay the JVM's start). From its event log: the Spark
jobs of each warm batch by the sink's step that started them (`IdempotentSink.step` names them),
their count and seconds per batch. A variant's Java options (`-XX:...`, `-Dspark.<setting>=<value>`) go
to the job's JVMs through JDK_JAVA_OPTIONS; the variants run alternately, `--runs` times each,
so drift of the machine falls on every side alike. The steady bench starts its clock minutes
after the JVM: this one shows a batch's cost from the third batch on, JIT warm-up included.
Figures go to bench/RESULTS.md and bench/results/batch_cost-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable as DeltaLake

from bench.backlog import (
    RESULTS,
    commit,
    cpu_seconds,
    cpu_ticks,
    descendants,
    fresh,
    generate,
    record,
)
from bench.pipeline_job import REPO, job_env
from pipelines.config import load_config
from pipelines.layers.gold import seed_dimensions
from pipelines.local import broker
from pipelines.reference.orders_stream import StreamPlan, with_every_twist
from pipelines.reference.producer import produce_plan
from pipelines.session import build_spark

WARM_FROM = 3  # batches before this one pay the JVM's start and first compilations
BATCH = re.compile(r"batch = (\d+)")  # a line of Spark's description of a streaming batch's jobs


def event_log(folder: str) -> Iterator[dict]:
    """The events of every Spark application's rolling event log in `folder`."""
    for path in sorted(Path(folder).glob("*/events_*")):
        codec = "zstd" if path.suffix == ".zstd" else None
        for line in pa.input_stream(str(path), compression=codec).read().splitlines():
            if line.strip():
                yield json.loads(line)


def jobs_by_step(folder: str, query: str, batches: set[int]) -> dict[str, dict[str, float]]:
    """Per step, the Spark jobs of the query's `batches`: jobs and job-seconds per batch (jobs on
    threads side by side overlap). A job's step is the last line of its description (Delta's
    own suffix dropped); a job started outside any step is `(no step)`."""
    started: dict[int, tuple[str, int]] = {}
    totals: dict[str, list[float]] = {}
    for event in event_log(folder):
        kind = event.get("Event")
        if kind == "SparkListenerJobStart":
            lines = ((event.get("Properties") or {}).get("spark.job.description") or "").split("\n")
            batch = next((m for line in lines if (m := BATCH.match(line))), None)
            if (
                lines[0].removeprefix("Delta: ") != query
                or batch is None
                or int(batch.group(1)) not in batches
            ):
                continue
            step = "(no step)" if BATCH.match(lines[-1]) else re.split(r": | - ", lines[-1])[0]
            started[event["Job ID"]] = (step, event["Submission Time"])
        elif kind == "SparkListenerJobEnd" and event["Job ID"] in started:
            step, at = started.pop(event["Job ID"])
            total = totals.setdefault(step, [0, 0.0])
            total[0] += 1
            total[1] += (event["Completion Time"] - at) / 1000
    n = max(len(batches), 1)
    return {
        step: {"jobs": round(jobs / n, 1), "job_s": round(seconds / n, 2)}
        for step, (jobs, seconds) in sorted(totals.items(), key=lambda kv: -kv[1][1])
    }


def steps_line(steps: dict[str, dict[str, float]]) -> str:
    """Jobs per batch by step, the costliest first."""
    return ", ".join(f"{k} {v['jobs']:g} ({v['job_s']:.2f} s)" for k, v in steps.items())


def run_once(spark, base, backlog: list, per_batch: int, java_options: str) -> dict:
    """One drain of `backlog` in its own root and topic; the warm batches' figures."""
    conf = fresh(base, "batch-cost")
    seed_dimensions(spark, conf)
    produce_plan(
        conf, StreamPlan(with_every_twist(), backlog), conf.stream("orders").topic, track=False
    )
    env = job_env(conf, "local") | {
        "LAKEHOUSE__PIPELINE__MAX_OFFSETS_PER_TRIGGER": str(per_batch),
        "JDK_JAVA_OPTIONS": java_options,
    }
    lakehouse = str(Path(sys.executable).parent / "lakehouse")
    log = Path(conf.log_dir) / "batch_cost_job.log"
    with log.open("w") as err:
        job = subprocess.Popen(
            [lakehouse, "run", "pipeline", "--once"], env=env, cwd=REPO, stdout=err, stderr=err
        )
        cpu = []  # (unix time, CPU seconds of the job's processes so far)
        threads: dict[tuple[int, int], tuple[str, float]] = {}  # the JVM's, newest reading
        while job.poll() is None:
            cpu.append((time.time(), cpu_seconds(job.pid)))
            if len(cpu) % 10 == 1:  # a few hundred files: not every poll, on the job's cores
                threads |= thread_cpu(job.pid)
            time.sleep(0.5)
    if job.returncode:
        raise SystemExit(f"the job failed ({job.returncode}): see {log}")
    progress = pa.table(
        DeltaLake(conf.table_path("system/query_progress")).to_pyarrow_table(
            columns=["event_time", "query_name", "batch_id", "input_rows", "batch_duration_ms"]
        )
    ).to_pylist()
    main = sorted(
        (p for p in progress if p["query_name"].startswith("pipeline") and p["input_rows"]),
        key=lambda p: p["event_time"],
    )
    warm = main[WARM_FROM:]
    # a progress row's time is its batch's start
    ended = [p["event_time"].timestamp() + p["batch_duration_ms"] / 1000 for p in main]

    def cpu_at(t: float) -> float:
        return min(cpu, key=lambda c: abs(c[0] - t))[1]

    warm_cpu = cpu_at(ended[-1]) - cpu_at(ended[WARM_FROM - 1])
    rows = sum(p["input_rows"] for p in warm)
    steps = jobs_by_step(conf.event_log_dir, main[0]["query_name"], {p["batch_id"] for p in warm})
    durations = [p["batch_duration_ms"] / 1000 for p in warm]
    return {
        "batches": len(main),
        "warm_batches": len(warm),
        "warm_rows": rows,
        "median_s": statistics.median(durations),
        "mean_s": statistics.mean(durations),
        "core_s_per_m": warm_cpu / rows * 1e6,
        "job_cpu_s": cpu[-1][1],
        "durations_s": [round(d, 2) for d in durations],
        "thread_cpu_s": by_kind(threads.values()),
        "jobs_per_batch": sum(v["jobs"] for v in steps.values()),
        "steps": steps,
    }


def thread_cpu(pid: int) -> dict[tuple[int, int], tuple[str, float]]:
    """(process, thread) -> (name, CPU seconds) of every thread of `pid` and its descendants."""
    tick, found = os.sysconf("SC_CLK_TCK"), {}
    for p in descendants(pid):
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                name = task.joinpath("comm").read_text().strip()
                found[(p, int(task.name))] = (name, cpu_ticks(task / "stat") / tick)
        except OSError:
            continue
    return found


KINDS = {"GC": ("GC Thread", "G1 ", "VM Thread", "PS "), "JIT": ("C1 Compiler", "C2 Compiler")}


def by_kind(threads) -> dict[str, float]:
    """CPU seconds of the garbage collector's threads, the JIT compiler's, and the rest."""
    total = {kind: 0.0 for kind in (*KINDS, "other")}
    for name, seconds in threads:
        kind = next((k for k, prefixes in KINDS.items() if name.startswith(prefixes)), "other")
        total[kind] += seconds
    return {kind: round(seconds, 1) for kind, seconds in total.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=450_000)
    parser.add_argument("--per-batch", type=int, default=30_000)
    parser.add_argument("--runs", type=int, default=3, help="runs of each variant")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=JAVA_OPTIONS",
        help="a side of the comparison (repeatable; default: one side, `base=`)",
    )
    args = parser.parse_args()
    variants = dict(v.split("=", 1) for v in args.variant) or {"base": ""}

    base = load_config("local").updated({"spark.driver_memory": "3g"})
    broker.start(base)
    spark = build_spark(base, app_name="bench-batch-cost")
    backlog = generate(args.records)[: args.records]
    runs: dict[str, list[dict]] = {name: [] for name in variants}
    for i in range(args.runs):
        for name, options in variants.items():
            result = run_once(spark, base, backlog, args.per_batch, options)
            runs[name].append(result)
            print(
                f"run {i + 1} {name}: {result['warm_batches']} warm batches of "
                f"{result['warm_rows'] / result['warm_batches']:,.0f} records, median "
                f"{result['median_s']:.2f} s, {result['core_s_per_m']:.0f} core-s per million; "
                f"whole run's CPU by thread {result['thread_cpu_s']}; Spark jobs per batch "
                f"{result['jobs_per_batch']:g}: {steps_line(result['steps'])}",
                flush=True,
            )
    spark.stop()

    figures = [
        f"{args.records:,} records (every twist), batches of {args.per_batch:,}, "
        f"`lakehouse run pipeline --once`; batches {WARM_FROM + 1}- of each run, {args.runs} "
        "runs per side, alternating"
    ]
    for name, results in runs.items():
        medians = sorted(r["median_s"] for r in results)
        cores = sorted(r["core_s_per_m"] for r in results)
        figures.append(
            f"{name} (`{variants[name] or 'defaults'}`): batch median "
            f"**{statistics.median(medians):.2f} s** (runs {', '.join(f'{m:.2f}' for m in medians)}), "
            f"**{statistics.median(cores):.0f} core-s per million** "
            f"(runs {', '.join(f'{c:.0f}' for c in cores)}); Spark jobs per batch by step "
            f"(run 1): {steps_line(results[0]['steps'])}"
        )
    for line in figures:
        print(line)
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%S")
    out = RESULTS / f"batch_cost-{stamp}.json"
    out.write_text(json.dumps({"commit": commit(), "args": vars(args), "runs": runs}, indent=1))
    command = f"python -m bench.batch_cost {' '.join(sys.argv[1:])}"
    print(f"results: {record('Batch cost (fixed batches)', command, figures)} and {out}")


if __name__ == "__main__":
    main()
