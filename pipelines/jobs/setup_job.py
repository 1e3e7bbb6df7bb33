"""Setup job: the stream's topic, every table of the pipeline, and the dimensions when missing.

Run before continuous layers start side by side, so none waits for another's table to exist.

Usage:
    spark-submit --jars "$(lakehouse jars)" pipelines/jobs/setup_job.py --env local
"""

from __future__ import annotations

import sys

from delta.tables import DeltaTable

from pipelines import logs
from pipelines.config import load_config
from pipelines.errors import exit_on_known_errors
from pipelines.jobs.layer_job import parse_args, stop_with_runner
from pipelines.kafka import ensure_topic
from pipelines.layers.bronze import ensure_bronze_tables
from pipelines.layers.gold import ensure_gold_tables, gold_tables, seed_dimensions
from pipelines.layers.silver import ensure_silver_tables, silver_tables
from pipelines.session import build_spark
from pipelines.streaming import progress_table
from pipelines.streaming.tables import ensure_table


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, prog="setup", description=__doc__.splitlines()[0])
    stop_with_runner()
    with exit_on_known_errors():
        conf = load_config(args.env)
        logs.configure(conf)
        log = logs.get("setup")
        stream = conf.stream(args.stream)
        if ensure_topic(
            conf,
            stream.topic,
            stream.partitions,
            stream.replication_factor,
            stream.min_insync_replicas,
        ):
            log.info("created topic %s (%d partitions)", stream.topic, stream.partitions)
        spark = build_spark(conf, app_name="lakehouse-setup")
        ensure_bronze_tables(spark, conf, stream)
        ensure_silver_tables(spark, conf, silver_tables(conf, stream))
        if stream.gold_tables:
            tables = gold_tables(conf, args.stream)
            if not all(DeltaTable.isDeltaTable(spark, p) for p in tables.dimensions.values()):
                counts = seed_dimensions(spark, conf, args.stream)
                log.info("seeded %s", ", ".join(f"{k} ({v:,} rows)" for k, v in counts.items()))
            ensure_gold_tables(spark, conf, tables)
        if conf.progress_table.enabled:
            name = conf.progress_table.table
            ensure_table(spark, conf.table_path(name), progress_table.declaration(name))
        log.info("tables ready under %s", conf.root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
