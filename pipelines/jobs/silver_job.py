"""Silver job: `bronze/<table>` to the stream's events, state and quarantine tables, exactly.

Usage:
    lakehouse run silver [--env local] [--stream orders] [--once]
    spark-submit --jars "$(lakehouse jars)" pipelines/jobs/silver_job.py --env local --once
"""

from __future__ import annotations

import sys

from pipelines.jobs.layer_job import run_layer_job
from pipelines.layers.silver import run_silver


def main(argv: list[str] | None = None) -> int:
    return run_layer_job(argv, "silver", run_silver, __doc__)


if __name__ == "__main__":
    sys.exit(main())
