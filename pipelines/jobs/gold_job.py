"""Gold job: silver/order_events to the gold window tables and gold/late_events.

Usage:
    lakehouse seed                                  # the dimension tables, once
    lakehouse run gold [--env local] [--once]
    spark-submit --jars "$(lakehouse jars)" pipelines/jobs/gold_job.py --env local --once
"""

from __future__ import annotations

import sys

from pipelines.jobs.layer_job import run_layer_job
from pipelines.layers.gold import run_gold


def main(argv: list[str] | None = None) -> int:
    return run_layer_job(argv, "gold", run_gold, __doc__)


if __name__ == "__main__":
    sys.exit(main())
