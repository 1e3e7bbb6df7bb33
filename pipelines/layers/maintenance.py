"""Table maintenance: the small files of many micro-batches compacted (and laid out as the table
declares), the files no version within the retention needs removed, the log checkpointed.

`lakehouse maintain [TABLE ...]` or the shipped job `conf/jobs/maintenance.yaml`, beside the
streaming jobs: OPTIMIZE retried right after the table's next commit (`OPTIMIZE_ATTEMPTS`),
VACUUM keeping what a lagging streaming reader still needs. The rules:
docs/operations.md, "Table maintenance".
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from pipelines import logs
from pipelines.config import LakehouseConf
from pipelines.layers.declared import declared_tables
from pipelines.layers.publish import POSITION_FILE
from pipelines.streaming import checkpoints
from pipelines.streaming.delta import (
    WRITE_CONFLICTS,
    commit_info,
    commit_text,
    commit_time_ms,
    retry_on_conflict,
    session_conf,
    snapshot,
)
from pipelines.streaming.storage import Files, jvm_class
from pipelines.streaming.tables import Table

log = logs.get("maintenance")
DEFAULT_MIN_FILE_SIZE = 1024**3  # Delta's: a file smaller than this is compacted
RETAIN_IGNORED = "spark.databricks.delta.vacuum.retentionWindowIgnore.enabled"
OPTIMIZE_ATTEMPTS = 10  # each right after a commit of the table's writer
COMMIT_WAIT_S = 60.0  # a table no commit reaches in this long is not being written: go on


@dataclass(frozen=True)
class Maintained:
    """What maintenance did to one table."""

    table: str
    files_before: int  # data files of the current version
    files_after: int
    vacuumed: int  # files deleted from storage
    compacted: tuple[int, int]  # OPTIMIZE's own count: files it removed, files it wrote
    version: int  # the version checkpointed
    retention_hours: int = 168  # what VACUUM kept: the configured one, or more for a reader
    not_compacted: str | None = None  # why OPTIMIZE did not commit (every attempt conflicted)

    def describe(self) -> str:
        optimize = (
            f"OPTIMIZE not committed: {self.not_compacted}; the next run compacts it"
            if self.not_compacted
            else f"OPTIMIZE rewrote {self.compacted[0]:,} into {self.compacted[1]:,}"
        )
        return (
            f"{self.table}: {self.files_before:,} -> {self.files_after:,} files ({optimize}), "
            f"{self.vacuumed:,} old files removed (retention {self.retention_hours} h), "
            f"log checkpointed at version {self.version}"
        )


@dataclass(frozen=True)
class Reader:
    """A streaming query reading a Delta table, and where it is: `version` is the first it has
    not read in full (its offsets' `reservoirVersion`: the files that version adds, or while it
    starts the whole snapshot of that version)."""

    checkpoint: str
    table_id: str
    version: int


def maintain(
    spark: SparkSession, conf: LakehouseConf, tables: list[str] | None = None
) -> list[Maintained]:
    """Maintain `tables` (names like `silver/orders`; default: every declared table that exists)."""
    declared = declared_tables(conf)
    paths = {name: conf.table_path(name) for name in tables or _declared(conf)}
    readers = stream_readers(spark, conf)
    done = []
    for name, path in paths.items():
        if not DeltaTable.isDeltaTable(spark, path):
            if tables:
                log.warning("%s: no Delta table at %s; skipped", name, path)
            continue
        done.append(maintain_table(spark, conf, name, path, declared.get(name), readers))
        log.info("%s", done[-1].describe())
    return done


def maintain_table(
    spark: SparkSession,
    conf: LakehouseConf,
    name: str,
    path: str,
    layout: Table | None = None,
    readers: Sequence[Reader] = (),
) -> Maintained:
    before = _files(spark, path)
    compacted, not_compacted = (0, 0), None
    try:
        compacted = _optimize(spark, name, path, layout)
    except WRITE_CONFLICTS as e:
        not_compacted = f"{OPTIMIZE_ATTEMPTS} attempts conflicted with concurrent writes"
        log.warning("%s: %s (the last: %s)", name, not_compacted, type(e).__name__)
    hours = retention_hours(spark, conf, name, path, readers)
    doomed = _vacuum(spark, conf, name, path, hours)
    snap = snapshot(spark, path)
    # the writer of a version at the table's checkpoint interval checkpoints it itself: a second
    # checkpoint of it written at once fails Delta's check of what it wrote (a stack trace)
    if snap.version() % _checkpoint_interval(snap) != 0:
        snap.deltaLog().checkpoint(snap, jvm_class(spark, "scala.Option").empty())
    return Maintained(
        name, before, snap.numOfFiles(), doomed, compacted, snap.version(), hours, not_compacted
    )


def _checkpoint_interval(snap) -> int:
    """The table's `delta.checkpointInterval` (Delta's default: 10)."""
    setting = snap.metadata().configuration().get("delta.checkpointInterval")
    return int(setting.get()) if setting.isDefined() else 10


def _optimize(spark: SparkSession, name: str, path: str, layout: Table | None) -> tuple[int, int]:
    """Compact (a clustered table: cluster), or Z-order the partitions new writes fragmented;
    returns how many files it removed and wrote."""
    if layout is None or not layout.zorder_by:
        result = retry_on_conflict(
            lambda: DeltaTable.forPath(spark, path).optimize().executeCompaction().collect(),
            what=f"{name} (OPTIMIZE)",
            attempts=OPTIMIZE_ATTEMPTS,
            wait=lambda _attempt: after_next_commit(spark, path),
        )
    elif (where := fragmented_partitions(spark, path, layout.partitioned_by)) is None:
        return 0, 0  # every partition is one file already, or large files only
    else:
        result = retry_on_conflict(
            lambda: (
                DeltaTable.forPath(spark, path)
                .optimize()
                .where(where)
                .executeZOrderBy(*layout.zorder_by)
                .collect()
            ),
            what=f"{name} (OPTIMIZE ZORDER BY {', '.join(layout.zorder_by)})",
            attempts=OPTIMIZE_ATTEMPTS,
            wait=lambda _attempt: after_next_commit(spark, path),
        )
    metrics = result[0]["metrics"]
    return int(metrics["numFilesRemoved"]), int(metrics["numFilesAdded"])


def after_next_commit(
    spark: SparkSession,
    path: str,
    since: int | None = None,
    timeout_s: float = COMMIT_WAIT_S,
    poll_s: float = 0.2,
) -> str:
    """Return once the table at `path` has a commit newer than version `since` (default: its
    version now), or after `timeout_s`; says which."""
    version = snapshot(spark, path).version() if since is None else since
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        time.sleep(poll_s)
        if (newest := snapshot(spark, path).version()) > version:
            return f"right after version {newest}"
    return f"after {timeout_s:.0f} s without a commit"


def fragmented_partitions(spark: SparkSession, path: str, columns: tuple[str, ...]) -> str | None:
    """A predicate selecting the partitions with two or more small files (None: there are none;
    "true": the table is not partitioned and has them), from the log's list of files."""
    min_size = int(
        cast(  # never None: a default is given
            str,
            spark.conf.get(
                "spark.databricks.delta.optimize.minFileSize", str(DEFAULT_MIN_FILE_SIZE)
            ),
        )
    )
    files = DataFrame(snapshot(spark, path).allFiles().toDF(), spark)
    fragmented = (
        files.where(F.col("size") < min_size)
        .groupBy("partitionValues")
        .count()
        .where("count > 1")
        .collect()
    )
    if not fragmented:
        return None
    if not columns:
        return "true"
    return " OR ".join(partition_predicate(row["partitionValues"], columns) for row in fragmented)


def partition_predicate(values: dict[str, str | None], columns: tuple[str, ...]) -> str:
    """`(a = 'x' AND b IS NULL)` for one partition's values (as the log holds them: strings)."""

    def equals(column: str) -> str:
        value = values.get(column)
        if value is None:
            return f"`{column}` IS NULL"
        quoted = value.replace("\\", "\\\\").replace("'", "\\'")
        return f"`{column}` = '{quoted}'"

    return "(" + " AND ".join(equals(c) for c in columns) + ")"


def stream_readers(spark: SparkSession, conf: LakehouseConf) -> list[Reader]:
    """Every streaming query with a checkpoint under the storage root that reads a Delta table,
    where its last committed batch ended (before any: where its first planned one starts), and
    every publish job where its position says it reads next."""
    files, found = Files(spark), []
    for checkpoint in _checkpoints(files, f"{conf.root}/_checkpoints", depth=3):
        if (position := files.read_text(f"{checkpoint}/{POSITION_FILE}")) is not None:
            for table_id, version in json.loads(position)["next_versions"].items():
                found.append(Reader(checkpoint, table_id, int(version)))
            continue
        batches = checkpoints.batches(files, f"{checkpoint}/offsets")
        committed = [b for b in checkpoints.batches(files, f"{checkpoint}/commits") if b in batches]
        batch = max(committed) if committed else min(batches, default=None)
        text = files.read_text(f"{checkpoint}/offsets/{batch}") if batch is not None else None
        for source in checkpoints.source_offsets(text or ""):
            if "reservoirId" in source and "reservoirVersion" in source:
                found.append(
                    Reader(checkpoint, source["reservoirId"], int(source["reservoirVersion"]))
                )
    return found


def _checkpoints(files: Files, folder: str, depth: int) -> list[str]:
    """The folders under `folder` (down to `depth` levels) that hold a streaming checkpoint."""
    names = files.names(folder)
    if "offsets" in names or POSITION_FILE in names:
        return [folder]
    if depth == 0:
        return []
    return [c for n in sorted(names) for c in _checkpoints(files, f"{folder}/{n}", depth - 1)]


def retention_hours(
    spark: SparkSession,
    conf: LakehouseConf,
    name: str,
    path: str,
    readers: Sequence[Reader],
    now: datetime | None = None,
) -> int:
    """The configured retention, or the table's own (`delta.deletedFileRetentionDuration`) if
    longer, or longer still to keep what the furthest-behind reader of the table still reads:
    every file removed since the first version it has not read in full."""
    found = snapshot(spark, path)
    delta_log = jvm_class(spark, "org.apache.spark.sql.delta.DeltaLog")
    own = delta_log.tombstoneRetentionMillis(found.metadata())
    configured = max(conf.maintenance.vacuum_retention_hours, math.ceil(own / 3_600_000))
    mine = [r for r in readers if r.table_id == found.metadata().id()]
    now = now or datetime.now(UTC)
    hours, behind = configured, None
    for reader in mine:
        if reader.version > found.version():
            continue  # it has read everything
        committed = _commit_time(spark, found, reader.version)
        if committed is None:
            log.error(
                "%s: reader %s is at version %d, which the log no longer holds: it cannot resume; "
                "reprocess on purpose (see docs/guarantees.md, 'A checkpoint is a cache')",
                name,
                reader.checkpoint,
                reader.version,
            )
            continue
        needed = math.ceil((now - committed).total_seconds() / 3600) + 1
        if needed > hours:
            hours, behind = needed, (reader, committed)
    if behind:
        reader, committed = behind
        log.warning(
            "%s: reader %s is %.1f days behind (version %d, committed %s): VACUUM keeps %d h "
            "instead of maintenance.vacuum_retention_hours=%d, so that it loses nothing",
            name,
            reader.checkpoint,
            (now - committed).total_seconds() / 86400,
            reader.version,
            committed.isoformat(timespec="seconds"),
            hours,
            configured,
        )
    return hours


def _commit_time(spark: SparkSession, found, version: int) -> datetime | None:
    """When `version` of the table was committed, None if the log lost it."""
    ms = commit_time_ms(commit_text(spark, found, version))
    return None if ms is None else datetime.fromtimestamp(ms / 1000, UTC)


def _commit_info(spark: SparkSession, found, version: int) -> dict:
    """The commitInfo of `version` of the table ({} if the log no longer holds it)."""
    return commit_info(commit_text(spark, found, version))


def _vacuum(spark: SparkSession, conf: LakehouseConf, name: str, path: str, hours: int) -> int:
    """VACUUM, LITE (the files the log says were removed, far faster than listing the storage:
    bench/RESULTS.md, "Figures behind code choices") unless `maintenance.vacuum_full` or the log
    no longer holds what LITE needs; returns how many files it deleted (its VACUUM END commit's
    `numDeletedFiles`)."""
    mode = "FULL" if conf.maintenance.vacuum_full else "LITE"
    vacuum = f"VACUUM delta.`{path}` {{mode}} RETAIN {hours} HOURS"
    # Delta 4.4 ignores RETAIN unless this is off, and keeps only the table's own retention: a
    # reader further behind would lose files it has still to read
    with session_conf(spark, RETAIN_IGNORED, "false"):
        try:
            spark.sql(vacuum.format(mode=mode)).collect()
        except AnalysisException as e:
            if mode == "FULL" or "LITE" not in str(e):
                raise
            log.info("%s: the log no longer holds what VACUUM LITE needs; a FULL one", name)
            spark.sql(vacuum.format(mode="FULL")).collect()
    found = snapshot(spark, path)
    for version in range(found.version(), max(-1, found.version() - 20), -1):
        info = _commit_info(spark, found, version)
        if info.get("operation") == "VACUUM END":
            return int(info.get("operationMetrics", {}).get("numDeletedFiles", 0))
    return 0


def _files(spark: SparkSession, path: str) -> int:
    """Data files of the table's newest version (from its log's state, no Spark job once cached)."""
    return int(snapshot(spark, path).numOfFiles())


def _declared(conf: LakehouseConf) -> list[str]:
    """Every declared table's name (`silver/orders`), from the catalog's list."""
    prefix = f"{conf.root}/"
    return [path.removeprefix(prefix) for path in conf.table_names().values()]
