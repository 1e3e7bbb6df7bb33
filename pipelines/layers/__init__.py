"""Each layer's queries and sinks: bronze, silver and gold tables from their sources, and the
data-quality checks of their tables. Built from the pure functions of `bronze/`, `silver/`, `gold/`."""

from __future__ import annotations

from pyspark.sql import SparkSession

from pipelines.config import LakehouseConf
from pipelines.streaming.progress_table import ProgressTable


def progress_table(spark: SparkSession, conf: LakehouseConf) -> ProgressTable | None:
    """The progress table a job's queries report to (None when it is disabled)."""
    settings = conf.progress_table
    return (
        ProgressTable(spark, conf.table_path(settings.table), settings)
        if settings.enabled
        else None
    )
