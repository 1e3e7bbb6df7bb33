"""Publish job: every change of each gold table to its compacted Kafka topic, exactly once.

Usage:
    lakehouse run publish [--env local] [--stream orders] [--once]
    spark-submit --jars "$(lakehouse jars)" pipelines/jobs/publish_job.py --env local --once
"""

from __future__ import annotations

import sys

from pipelines.jobs.layer_job import run_layer_job
from pipelines.layers.publish import run_publish


def main(argv: list[str] | None = None) -> int:
    return run_layer_job(argv, "publish", run_publish, __doc__, needs_kafka=True)


if __name__ == "__main__":
    sys.exit(main())
