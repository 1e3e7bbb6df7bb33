"""Maintenance job: compact the tables' small files, remove files no version needs, checkpoint
the logs.

Usage:
    lakehouse maintain [--env local] [TABLE ...]
    spark-submit --jars "$(lakehouse jars)" pipelines/jobs/maintenance_job.py --env local
"""

from __future__ import annotations

import sys

from pipelines.jobs.layer_job import run_table_job
from pipelines.layers.maintenance import maintain


def main(argv: list[str] | None = None) -> int:
    return run_table_job(argv, "maintenance", __doc__, maintain)


if __name__ == "__main__":
    sys.exit(main())
