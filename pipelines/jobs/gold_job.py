"""Gold job: silver/order_events to the gold window tables and gold/late_events.

Usage:
    lakehouse seed                                  # the dimension tables, once
    lakehouse run gold [--env local] [--once]
    spark-submit --jars "$(lakehouse jars)" pipelines/jobs/gold_job.py --env local --once
"""

from __future__ import annotations

import sys

from pipelines.config import load_config
from pipelines.errors import exit_on_known_errors
from pipelines.jobs.bronze_job import parse_args
from pipelines.layers.gold import run_gold
from pipelines.streaming.spark import build_spark


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv, prog="gold", description=__doc__.splitlines()[0])
    with exit_on_known_errors():
        conf = load_config(args.env)
        spark = build_spark(conf, app_name=f"lakehouse-gold-{args.stream}")
        run_gold(spark, conf, args.stream, once=args.once, progress=not args.quiet)
    return 0


if __name__ == "__main__":
    sys.exit(main())
