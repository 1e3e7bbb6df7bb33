"""Quality job: the Great Expectations suites on the tables as they are now.

Results go to `quality/results` and the Data Docs; a `fail` suite that fails ends the job with
exit code 5 and a summary naming each failed expectation.

Usage:
    lakehouse dq [--env local] [TABLE ...]
    spark-submit --jars "$(lakehouse jars)" pipelines/jobs/quality_job.py --env local
"""

from __future__ import annotations

import sys

from pyspark.sql import SparkSession

from pipelines import logs
from pipelines.config import LakehouseConf
from pipelines.jobs.layer_job import run_table_job
from pipelines.layers.declared import declared_tables
from pipelines.layers.quality import run_quality


def main(argv: list[str] | None = None) -> int:
    return run_table_job(argv, "quality", __doc__, check)


def check(spark: SparkSession, conf: LakehouseConf, tables: list[str] | None) -> list:
    log = logs.get("quality")
    outcomes = run_quality(spark, conf, declared_tables(conf), tables)
    for o in outcomes:
        if o.success:
            log.info("%-30s passed", o.suite)
        else:
            log.warning("%-30s FAILED (policy warn)", o.suite)
    return outcomes


if __name__ == "__main__":
    sys.exit(main())
