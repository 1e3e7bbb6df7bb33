"""Bronze job: Kafka to `bronze/<table>`, exactly once.

Usage:
    lakehouse run bronze [--env local] [--stream orders] [--once]
    spark-submit --jars "$(lakehouse jars)" pipelines/jobs/bronze_job.py --env local --once
"""

from __future__ import annotations

import sys

from pipelines.jobs.layer_job import run_layer_job
from pipelines.layers.bronze import run_bronze


def main(argv: list[str] | None = None) -> int:
    return run_layer_job(argv, "bronze", run_bronze, __doc__, needs_kafka=True)


if __name__ == "__main__":
    sys.exit(main())
