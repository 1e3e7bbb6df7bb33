"""Benchmark: what one Delta commit of the pipeline's shapes costs, A/B between session settings.

Usage:
    .venv/bin/python -m bench.commit_cost [--rounds 4] [--commits 6]
        [--variant NAME=KEY=VALUE[,KEY=VALUE...] ...]

In one driver (the project's session), on tables of 40 files: an append of 2,000 rows (as
bronze's and the events' appends) and a tagged MERGE of 2,000 cached rows, half of them updates
(as gold's MERGEs). The variants' settings are set on the session in turn, `--rounds` times, each
round timing `--commits` commits of each shape: the same JVM, the same tables, so the JIT's
warm-up and the machine's drift fall on every side alike. Figures: the median wall time of a
commit and the Spark jobs it runs. To see a JVM option's effect (`-Duser.timezone=...`), start
the benchmark with it in JDK_JAVA_OPTIONS. Printed only: a figure for a closing note, not a target.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time

from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from pipelines.config import load_config
from pipelines.session import build_spark
from pipelines.streaming.delta import idempotent_txn
from pipelines.streaming.spark import session_confs

ROWS = 2_000
FILES = 40


def timed(spark: SparkSession, write) -> tuple[float, int]:
    """Seconds and Spark jobs of `write()`."""
    tracker = spark.sparkContext.statusTracker()
    jobs = set(tracker.getJobIdsForGroup(None))
    started = time.perf_counter()
    write()
    seconds = time.perf_counter() - started
    return seconds, len(set(tracker.getJobIdsForGroup(None)) - jobs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--commits", type=int, default=6, help="of each shape, per round")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=KEY=VALUE,...")
    args = parser.parse_args()
    variants = {"base": {}}
    for v in args.variant:
        name, settings = v.split("=", 1)
        variants[name] = dict(s.split("=", 1) for s in settings.split(","))

    root = tempfile.mkdtemp(prefix="lakehouse-bench-commit-cost-")
    spark = build_spark(load_config("local").updated({"storage.root": root}), "bench-commit")
    ids = spark.range(ROWS)
    rows = ids.select(
        F.format_string("k-%06d", "id").alias("key"), (F.col("id") * 3).alias("amount")
    )
    appended, merged = f"{root}/appended", f"{root}/merged"
    for _ in range(FILES):
        rows.write.format("delta").mode("append").save(appended)
    for i in range(FILES):  # keys spread over every file, as gold's windows are
        rows.where(F.col("id") % FILES == i).write.format("delta").mode("append").save(merged)
    upserts = ids.select(  # half of them update a row, half insert one
        F.format_string("k-%06d", F.col("id") * 2).alias("key"), F.col("id").alias("amount")
    ).cache()
    upserts.count()
    figures = {name: {"append": [], "merge": []} for name in variants}
    version = 0
    for _ in range(args.rounds):
        for name, settings in variants.items():
            with session_confs(spark, settings):
                for _ in range(args.commits):
                    append = rows.write.format("delta").mode("append")
                    figures[name]["append"].append(timed(spark, lambda a=append: a.save(appended)))
                    version += 1
                    merge = (
                        DeltaTable.forPath(spark, merged)
                        .alias("t")
                        .merge(upserts.alias("s"), "t.key = s.key")
                        .whenMatchedUpdate(set={"amount": "t.amount + s.amount"})
                        .whenNotMatchedInsertAll()
                    )
                    with idempotent_txn(spark, "bench-merge", version):
                        figures[name]["merge"].append(timed(spark, merge.execute))
    spark.stop()
    for name, shapes in figures.items():
        parts = []
        for shape, runs in shapes.items():
            seconds = statistics.median(s for s, _ in runs)
            jobs = statistics.median(j for _, j in runs)
            parts.append(f"{shape} {seconds:.3f} s, {jobs:g} jobs")
        label = f"{name} {variants[name]}" if variants[name] else name
        print(f"{label}: median of {len(runs)}: {'; '.join(parts)}")


if __name__ == "__main__":
    main()
