"""Silver job: `bronze/<table>` to the stream's events, state and quarantine tables, exactly.

Usage:
    lakehouse run silver [--env local] [--stream orders] [--once]
    spark-submit --jars "$(lakehouse jars)" pipelines/jobs/silver_job.py --env local --once
"""

from __future__ import annotations

import sys

from pipelines.config import load_config
from pipelines.errors import exit_on_known_errors
from pipelines.jobs.bronze_job import parse_args
from pipelines.layers.silver import run_silver
from pipelines.streaming.spark import build_spark


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, prog="silver", description=__doc__.splitlines()[0])
    with exit_on_known_errors():
        conf = load_config(args.env)
        spark = build_spark(conf, app_name=f"lakehouse-silver-{args.stream}")
        run_silver(spark, conf, args.stream, once=args.once, progress=not args.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
