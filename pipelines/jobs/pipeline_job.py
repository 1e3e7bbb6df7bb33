"""Pipeline job: Kafka through bronze, silver and gold in one query, each table exactly once.

Usage:
    lakehouse run pipeline [--env local] [--stream orders] [--once]
    spark-submit --jars "$(lakehouse jars)" pipelines/jobs/pipeline_job.py --env local --once
"""

from __future__ import annotations

import sys

from pipelines.jobs.layer_job import run_layer_job
from pipelines.layers.pipeline import run_pipeline


def main(argv: list[str] | None = None) -> int:
    return run_layer_job(
        argv,
        "pipeline",
        run_pipeline,
        __doc__,
        needs_kafka=True,
        driver_memory=lambda conf: conf.pipeline.driver_memory,
    )


if __name__ == "__main__":
    sys.exit(main())
