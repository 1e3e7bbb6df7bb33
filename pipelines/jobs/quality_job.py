"""Quality job: the Great Expectations suites on the tables as they are now.

Results go to `quality/results` and the Data Docs; a `fail` suite that fails ends the job with
exit code 5 and a summary naming each failed expectation.

Usage:
    lakehouse dq [--env local] [TABLE ...]
    spark-submit --jars "$(lakehouse jars)" pipelines/jobs/quality_job.py --env local
"""

from __future__ import annotations

import argparse
import sys

from pipelines import logs
from pipelines.config import load_config
from pipelines.errors import exit_on_known_errors
from pipelines.jobs.layer_job import stop_with_runner
from pipelines.layers.quality import run_quality
from pipelines.streaming.spark import build_spark


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="quality", description=__doc__.splitlines()[0])
    parser.add_argument("--env", default=None, help="configuration environment (conf/<env>.yaml)")
    parser.add_argument("tables", nargs="*", help="only these tables, e.g. silver/orders")
    args = parser.parse_args(argv)
    stop_with_runner()
    with exit_on_known_errors():
        conf = load_config(args.env)
        logs.configure(conf)
        spark = build_spark(conf, app_name="lakehouse-quality")
        log = logs.get("quality")
        for o in run_quality(spark, conf, args.tables or None):
            if o.success:
                log.info("%-30s passed", o.suite)
            else:
                log.warning("%-30s FAILED (policy warn)", o.suite)
    return 0


if __name__ == "__main__":
    sys.exit(main())
