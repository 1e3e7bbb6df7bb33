"""Setup job: the stream's topic, every table of the pipeline, and the dimensions when missing.

Run before continuous layers start side by side, so none waits for another's table to exist.

Usage:
    spark-submit --jars "$(lakehouse jars)" pipelines/jobs/setup_job.py --env local
"""

from __future__ import annotations

import sys

from delta.tables import DeltaTable

from pipelines.config import load_config
from pipelines.errors import exit_on_known_errors
from pipelines.jobs.bronze_job import parse_args
from pipelines.kafka import ensure_topic
from pipelines.layers.bronze import bronze_tables, ensure_bronze_tables
from pipelines.layers.gold import ensure_gold_tables, gold_tables, seed_dimensions
from pipelines.layers.silver import ensure_silver_tables, silver_tables
from pipelines.streaming.progress_table import ensure_progress_table
from pipelines.streaming.spark import build_spark


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, prog="setup", description=__doc__.splitlines()[0])
    with exit_on_known_errors():
        conf = load_config(args.env)
        stream = conf.stream(args.stream)
        if ensure_topic(conf, stream.topic, stream.partitions, 1):
            print(f"setup: created topic {stream.topic} ({stream.partitions} partitions)")
        spark = build_spark(conf, app_name="lakehouse-setup")
        ensure_bronze_tables(spark, bronze_tables(conf, stream))
        ensure_silver_tables(spark, silver_tables(conf, stream))
        tables = gold_tables(conf)
        if not DeltaTable.isDeltaTable(spark, tables.products):
            counts = seed_dimensions(spark, conf)
            print(
                "setup: seeded "
                + ", ".join(f"dimensions/{k} ({v:,} rows)" for k, v in counts.items())
            )
        ensure_gold_tables(spark, tables)
        if conf.progress_table.enabled:
            ensure_progress_table(spark, conf.table_path(conf.progress_table.table))
        print(f"setup: tables ready under {conf.root}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
