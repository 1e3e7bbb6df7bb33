"""Table maintenance: the small files of many micro-batches compacted, the files no version
within the retention needs removed, the log checkpointed.

`lakehouse maintain [TABLE ...]` (every declared table that exists, by default). Compaction
(OPTIMIZE) commits with `dataChange=false`: streaming readers of the table skip it. It retries
when a concurrent write conflicts, as the layers' writes do. VACUUM keeps every file a version
younger than `maintenance.vacuum_retention_hours` needs (at least Delta's 7 days: time travel,
and readers that fall behind).
"""

from __future__ import annotations

from dataclasses import dataclass

from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession

from pipelines import logs
from pipelines.config import LakehouseConf
from pipelines.streaming.delta import retry_on_conflict

log = logs.get("maintenance")


@dataclass(frozen=True)
class Maintained:
    """What maintenance did to one table."""

    table: str
    files_before: int  # data files of the current version
    files_after: int
    vacuumed: int  # files deleted from storage
    version: int  # the version checkpointed

    def describe(self) -> str:
        return (
            f"{self.table}: {self.files_before:,} -> {self.files_after:,} files, "
            f"{self.vacuumed:,} old files removed, log checkpointed at version {self.version}"
        )


def maintain(
    spark: SparkSession, conf: LakehouseConf, tables: list[str] | None = None
) -> list[Maintained]:
    """Maintain `tables` (names like `silver/orders`; default: every declared table that exists)."""
    paths = {name: conf.table_path(name) for name in tables or _declared(conf)}
    done = []
    for name, path in paths.items():
        if not DeltaTable.isDeltaTable(spark, path):
            if tables:
                log.warning("%s: no Delta table at %s; skipped", name, path)
            continue
        done.append(maintain_table(spark, conf, name, path))
        log.info("%s", done[-1].describe())
    return done


def maintain_table(spark: SparkSession, conf: LakehouseConf, name: str, path: str) -> Maintained:
    table = DeltaTable.forPath(spark, path)
    before = _files(table)
    retry_on_conflict(lambda: table.optimize().executeCompaction(), what=f"{name} (OPTIMIZE)")
    doomed = _vacuum(spark, conf, name, path)
    jvm = spark._jvm
    delta_log = jvm.org.apache.spark.sql.delta.DeltaLog.forTable(spark._jsparkSession, path)
    snapshot = delta_log.update(False, jvm.scala.Option.empty(), jvm.scala.Option.empty())
    delta_log.checkpoint(snapshot, jvm.scala.Option.empty())
    return Maintained(name, before, _files(table), doomed, snapshot.version())


def _vacuum(spark: SparkSession, conf: LakehouseConf, name: str, path: str) -> int:
    """VACUUM, LITE (the files the log says were removed: ~1 s here, where a FULL listing of the
    storage takes 35-45 s on a 12-file table) unless `maintenance.vacuum_full` or the log no
    longer holds what LITE needs; returns how many files it deleted."""
    hours, mode = conf.maintenance.vacuum_retention_hours, "LITE"
    if conf.maintenance.vacuum_full:
        mode = "FULL"
    vacuum = f"VACUUM delta.`{path}` {{mode}} RETAIN {hours} HOURS"
    try:
        doomed = spark.sql(vacuum.format(mode=mode) + " DRY RUN").count()
    except AnalysisException as e:
        if mode == "FULL" or "LITE" not in str(e):
            raise
        log.info("%s: the log no longer holds what VACUUM LITE needs; a FULL one", name)
        mode = "FULL"
        doomed = spark.sql(vacuum.format(mode=mode) + " DRY RUN").count()
    spark.sql(vacuum.format(mode=mode)).collect()
    return doomed


def _files(table: DeltaTable) -> int:
    return int(table.detail().first()["numFiles"])


def _declared(conf: LakehouseConf) -> list[str]:
    """Every declared table's name (`silver/orders`), from the catalog's list."""
    prefix = f"{conf.root}/"
    return [path.removeprefix(prefix) for path in conf.table_names().values()]
