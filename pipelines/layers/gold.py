"""The gold job: a stream's windowed aggregates of its silver events, joined with its dimensions.

Per micro-batch of new silver events: late events to the late-events table, the others enriched,
aggregated per window and group, and MERGEd into the gold tables, adding to their window rows,
each write once per batch (docs/guarantees.md, "Gold").
"""

from __future__ import annotations

import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, replace
from datetime import datetime
from functools import partial, reduce
from typing import cast

import pyarrow as pa
from delta.tables import DeltaTable
from deltalake import DeltaTable as DeltaLake
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

import gold.late_events
from bronze.ddl import column_names
from gold import overflow
from gold.late_events import kept_out, late_events, on_time_events
from gold.overflow import Range, TableRanges
from pipelines.config import InvalidConfigError, LakehouseConf
from pipelines.errors import JobFailedError
from pipelines.layers import progress_table
from pipelines.layers.quality import check_frames
from pipelines.layers.silver import silver_tables
from pipelines.streaming.delta import read_pinned, snapshot, start_delta_to_batches
from pipelines.streaming.query import run_query
from pipelines.streaming.sink import IdempotentSink
from pipelines.streaming.spark import local_frame
from pipelines.streaming.tables import (
    Table,
    declared,
    declared_dimension,
    ensure_table,
    ensure_tables,
    require_tables,
)

log = logging.getLogger("lakehouse.gold")
TOO_BIG = "a window this event falls in would exceed the value columns"


@dataclass(frozen=True)
class GoldTables:
    stream: str
    events: str  # the silver events it reads
    key: str  # their key column
    aggregates: dict[str, str]  # configured name -> path
    late: str
    late_name: str  # configured name of the late-events table
    high_water: str  # gold's own state: the newest event time each batch had seen
    dimensions: dict[str, str]  # role -> path
    checkpoint: str
    declarations: dict[str, Table]  # configured name -> declaration, of every table above
    modules: dict[str, str]  # gold table -> the module of its aggregate
    enrich: str | None  # the module joining the dimensions


Frames = dict[str, tuple[DataFrame, int | None]]


@dataclass(frozen=True)
class GoldSettings:
    """What the gold sink needs of the configuration, resolved where it is read (`gold_sink`)."""

    lateness_s: int  # gold.allowed_lateness_minutes, in seconds
    storage_options: dict[str, str] | None  # delta-rs's, to read the tables' file statistics
    check: Callable[[SparkSession, Frames, str], None] | None  # per-batch quality checks


def gold_tables(conf: LakehouseConf, stream_name: str = "orders") -> GoldTables:
    stream = conf.stream(stream_name)
    late, high_water = stream.late_events_table, stream.high_water_table
    if not stream.gold_tables or not late or not high_water:
        raise InvalidConfigError(
            f"stream {stream_name!r} in {conf.source} has no gold tables: set gold_tables and "
            "late_events_table"
        )
    # every gold table keeps its change data feed: the publish job reads its changes from it
    decl = {
        name: _with_change_feed(declared(stream.module(name), name)) for name in stream.gold_tables
    }
    decl[late] = declared(stream.module(late), late)
    decl[high_water] = declared(gold.late_events, high_water, attr="HIGH_WATER")
    for role, name in stream.dimensions.items():
        if not stream.enrich:
            raise InvalidConfigError(f"stream {stream_name!r} has dimensions but no enrich module")
        decl[name] = declared_dimension(stream.enrich, name, role)
    silver = silver_tables(conf, stream)
    return GoldTables(
        stream=stream_name,
        events=silver.events,
        key=importlib.import_module(stream.module(silver.names[0])).KEY,
        aggregates={name: conf.table_path(name) for name in stream.gold_tables},
        late=conf.table_path(late),
        late_name=late,
        high_water=conf.table_path(high_water),
        dimensions={role: conf.table_path(name) for role, name in stream.dimensions.items()},
        checkpoint=conf.checkpoint_path(f"gold/{stream_name}"),
        declarations=decl,
        modules={name: stream.module(name) for name in stream.gold_tables},
        enrich=stream.enrich,
    )


CHANGE_FEED = {"delta.enableChangeDataFeed": "true"}


def _with_change_feed(table: Table) -> Table:
    return replace(table, properties={**table.properties, **CHANGE_FEED})


def seed_dimensions(spark: SparkSession, conf: LakehouseConf, stream: str = "orders") -> dict:
    """Load each dimension of a stream from `<gold.seed_dir>/<role>.csv` (replacing its rows)."""
    declarations, counts = gold_tables(conf, stream).declarations, {}
    for role, name in conf.stream(stream).dimensions.items():
        table = declarations[name]
        file = conf.seed_dir / f"{role}.csv"
        if not file.is_file():
            raise JobFailedError(f"seed file {file} is missing (gold.seed_dir in {conf.source})")
        path = ensure_table(spark, conf.table_path(table.name), table)
        rows = spark.read.option("header", True).option("mode", "FAILFAST").schema(table.schema)
        rows.csv(str(file)).write.format("delta").mode("overwrite").save(path)
        counts[role] = spark.read.format("delta").load(path).count()
    return counts


def ensure_gold_tables(spark: SparkSession, conf: LakehouseConf, tables: GoldTables) -> None:
    """Create (or bring to their declarations) the tables gold writes; dimensions are seeded."""
    dimensions = set(conf.stream(tables.stream).dimensions.values())
    written = {n: t for n, t in tables.declarations.items() if n not in dimensions}
    ensure_tables(spark, {conf.table_path(t.name): t for t in written.values()})


def require_dimensions(spark: SparkSession, tables: GoldTables) -> None:
    """Refuse to start before the dimension tables are seeded."""
    require_tables(spark, dict.fromkeys(tables.dimensions.values(), "run `lakehouse seed` first"))


def _add_condition(keys: list[str], lo: datetime, hi: datetime) -> F.Column:
    condition = F.col("t.window_start").between(F.lit(lo), F.lit(hi))
    for k in keys:
        condition = condition & (F.col(f"t.{k}") == F.col(f"s.{k}"))
    return condition


def _one_row(frame: DataFrame) -> Row:
    """The row of a global aggregate (it always has one)."""
    return cast(Row, frame.first())


def _file_stats_range(files: pa.Table, column: str) -> Range | None:
    """The range of `column` over a Delta table's files (`get_add_actions(flatten=True)`)."""
    lows, highs = (
        files.column(c).to_pylist() if c in files.column_names else [None] * files.num_rows
        for c in (f"min.{column}", f"max.{column}")
    )
    return Range.covering(lows, highs)


@dataclass(frozen=True)
class _Known:
    """What the sink knows after a batch, for the next batch of the same query only (a retried
    or replayed batch reads the tables): the newest event time, and each gold table's ranges."""

    at: tuple[str, int]  # (query id, next batch id)
    newest: datetime | None
    ranges: dict[str, TableRanges] | None


@dataclass(frozen=True)
class _Fitted:
    """A batch's partial aggregates per gold table; the events kept out of every table (with a
    `_reason`), or None; the tables' ranges once the partials are added, if proved; event times."""

    partials: dict[str, DataFrame]
    kept_out: DataFrame | None
    ranges: dict[str, TableRanges] | None
    newest: datetime
    oldest: datetime


class UpsertGold(IdempotentSink):
    """foreachBatch sink of the gold job; see the module docstring."""

    def __init__(self, tables: GoldTables, settings: GoldSettings) -> None:
        super().__init__(tables.checkpoint)
        self.tables, self.settings, self._warned = tables, settings, False
        self.modules = {n: importlib.import_module(m) for n, m in tables.modules.items()}
        self.enrich = importlib.import_module(tables.enrich).enrich if tables.enrich else None
        self.late_name = tables.late_name
        self.late_columns = column_names(tables.declarations[self.late_name].schema)
        self.lateness_s = settings.lateness_s
        self.key = tables.key
        self.types = {
            n: overflow.column_types(tables.declarations[n].schema) for n in tables.aggregates
        }
        self._known: _Known | None = None
        self._dimensions: tuple | None = None  # (Spark context, versions, cached frames)

    def _knows(self, batch_id: int) -> _Known:
        """What is known for this batch (nothing, if another came between); forgotten either way."""
        known, self._known = self._known, None
        if known is None or known.at != (self.query_id(), batch_id):
            return _Known((self.query_id(), batch_id), None, None)
        return known

    def dimensions(self, spark: SparkSession) -> dict[str, DataFrame]:
        """The dimension tables as they are now (a change is seen by the next batch), each read
        and cached once per version: while none changes, a batch plans no scan of them (a file
        listing, a Spark job each)."""
        paths = self.tables.dimensions
        versions = {role: snapshot(spark, path).version() for role, path in paths.items()}
        known = self._dimensions
        if known is None or known[0] is not spark.sparkContext or known[1] != versions:
            for frame in known[2].values() if known else ():
                frame.unpersist()
            frames = {r: read_pinned(spark, paths[r], v).persist() for r, v in versions.items()}
            self._dimensions = (spark.sparkContext, versions, frames)
            return frames
        return known[2]

    def newest_before(self, spark: SparkSession, batch_id: int) -> datetime | None:
        """Newest event time processed by earlier batches (a replay sees the same value)."""
        rows = spark.read.format("delta").load(self.tables.high_water)
        earlier = rows.where(
            ~((F.col("query_id") == self.query_id()) & (F.col("batch_id") >= batch_id))
        )
        return _one_row(earlier.agg(F.max("newest_event_time")))[0]

    def write_batch(self, events: DataFrame, batch_id: int) -> None:
        spark, tables = events.sparkSession, self.tables
        known = self._knows(batch_id)
        with self.step("gold.newest_before"):
            newest = known.newest or self.newest_before(spark, batch_id)
        late = late_events(events, newest, self.lateness_s, self.late_columns)
        on_time = on_time_events(events, newest, self.lateness_s)
        if self.enrich:
            on_time = self.cache(self.enrich(on_time, self.dimensions(spark)))
        with self.step("gold.fitting"):
            fitted = self._fitting(spark, events, on_time, batch_id, known.ranges)
        if fitted is None:  # no event in the batch
            self._known = replace(known, at=(self.query_id(), batch_id + 1))
            return
        kept = fitted.kept_out is not None
        if fitted.kept_out is not None:
            reason = F.col("_reason")
            late = late.unionByName(kept_out(fitted.kept_out, newest, self.late_columns, reason))
        if self.settings.check is not None:
            # a batch that fails a `fail` suite is not written: the query stops on it
            frames: Frames = {name: (df, None) for name, df in fitted.partials.items()}
            self.settings.check(spark, frames, f"batch {batch_id}")
        newest_after = max(x for x in (newest, fitted.newest) if x is not None)
        high_water = local_frame(
            spark, [(self.query_id(), batch_id, newest_after)], gold.late_events.HIGH_WATER.schema
        )
        writes = [
            partial(self._add, fitted.partials[name], name, batch_id, self._starts(fitted, name))
            for name in self.modules
        ]
        writes.append(
            partial(
                self.append,
                high_water,
                f"{self.late_name}_high_water",
                tables.high_water,
                batch_id,
            )
        )
        write_late = partial(self.append, late, self.late_name, tables.late, batch_id)
        if kept:  # first: a replay reads there which events a committed MERGE kept out
            write_late()
        else:
            writes.append(write_late)
        # the tables' writes side by side, each in a session of its own: a window row is current
        # once its table's MERGE commits, whichever other table is still being written
        self.in_parallel(*writes)
        self._known = _Known((self.query_id(), batch_id + 1), newest_after, fitted.ranges)

    def _starts(self, times: _Fitted, name: str) -> tuple[datetime, datetime]:
        """The window starts of gold table `name` the batch's events can fall in."""
        seconds = self.modules[name].WINDOW_SECONDS
        return overflow.window_starts(times.oldest, times.newest, seconds)

    def _fitting(
        self,
        spark: SparkSession,
        events: DataFrame,
        on_time: DataFrame,
        batch_id: int,
        ranges: dict[str, TableRanges] | None,
    ) -> _Fitted | None:
        """The partial aggregates of the on-time events, less those falling in a window row that
        would not fit its columns (kept out of every table); None if the batch has no event.
        Decided once per batch: a replay (any write of the batch committed) reads it back. In
        the common case one Spark job: aggregates, event times and the proof in one pass."""
        no_reason = F.lit(None).cast("string").alias("_reason")
        out = None
        # the batch ran before if any of its writes committed: an empty late append commits
        # nothing (Delta skips empty commits), a MERGE of the same batch may have
        written = [self.tables.late, *self.tables.aggregates.values()]
        replay = any(self.committed(path, batch_id) for path in written)
        if replay:
            late = spark.read.format("delta").load(self.tables.late)
            done = late.where(F.col("reason").startswith(TOO_BIG)).select(self.key, "reason")
            out = self.cache(on_time.join(done.withColumnRenamed("reason", "_reason"), self.key))
        times = None
        while True:
            fitting = on_time if out is None else on_time.join(out, self.key, "left_anti")
            partials = {name: self.cache(m.aggregate(fitting)) for name, m in self.modules.items()}
            if replay or times is not None:
                after = None  # a replay keeps its decision; a second round proves nothing cheaply
                times = times or tuple(
                    _one_row(events.agg(F.max("event_time"), F.min("event_time")))
                )
            else:
                with self.step("gold.surely_fit"):
                    after, times = self._surely_fit(events, partials, ranges)
            if times[0] is None:
                return None
            fitted = _Fitted(partials, out, after, *times)
            if replay or after is not None:
                return fitted
            unfit = [
                fitting.alias("e")
                .join(
                    self._unfit(spark, name, fitted).alias("g"), overflow.in_window(m.KEY_COLUMNS)
                )
                .select(
                    *[F.col(f"e.{c}") for c in on_time.columns],
                    F.lit(f"{TOO_BIG} of {name}: kept out of the gold windows").alias("_reason"),
                )
                for name, m in self.modules.items()
            ]
            more = reduce(DataFrame.unionByName, unfit).dropDuplicates([self.key])
            if more.isEmpty():
                return fitted
            base = on_time.limit(0).select("*", no_reason) if out is None else out
            out = self.cache(base.unionByName(more))

    def _surely_fit(
        self,
        events: DataFrame,
        partials: dict[str, DataFrame],
        ranges: dict[str, TableRanges] | None = None,
    ) -> tuple[dict[str, TableRanges] | None, tuple[datetime | None, datetime | None]]:
        """One Spark job: the tables' ranges once the partials are added if `overflow.proof`
        proves every window row fits, else None (`ranges`: before, else the files' statistics);
        and the batch's (newest, oldest) event times."""
        ranges = ranges or self._table_ranges()
        times = F.max("event_time").alias("newest"), F.min("event_time").alias("oldest")
        checks = [events.agg(*times)]  # one row per frame, a table's columns prefixed by its index
        proved = ranges or {}  # none: no proof, the event times only
        names = [name for name in self.modules if name in proved]
        for i, name in enumerate(names):
            values = self.modules[name].VALUE_COLUMNS
            row = overflow.proof(partials[name], values, self.types[name], proved[name])
            checks.append(row.toDF(*[f"{i} {c}" for c in row.columns]))
        got = _one_row(reduce(DataFrame.crossJoin, checks)).asDict()
        proofs = {
            name: {c.split(" ", 1)[1]: v for c, v in got.items() if c.startswith(f"{i} ")}
            for i, name in enumerate(names)
        }
        if not proofs or not all(p["fit"] for p in proofs.values()):
            return None, (got["newest"], got["oldest"])
        after = {name: overflow.ranges_after(proved[name], p) for name, p in proofs.items()}
        return after, (got["newest"], got["oldest"])

    def _table_ranges(self) -> dict[str, TableRanges] | None:
        """Each value column's range over each gold table, from its files' statistics; None if
        one is missing."""
        ranges: dict[str, TableRanges] = {}
        options = self.settings.storage_options
        for name, module in self.modules.items():
            path = self.tables.aggregates[name]
            try:  # the files' statistics, by delta-rs; if it cannot read them, the exact check
                files = DeltaLake(path, storage_options=options).get_add_actions(flatten=True)
            except Exception as e:  # noqa: BLE001 (a table feature or storage delta-rs lacks)
                if not self._warned:
                    log.warning(
                        "%s: no file statistics from delta-rs (%s); window rows are "
                        "checked one by one, which is slower",
                        path,
                        str(e)[:300],
                    )
                    self._warned = True
                return None
            files = pa.table(files)
            table = {v: _file_stats_range(files, v) for v in module.VALUE_COLUMNS}
            known = {v: r for v, r in table.items() if r is not None}
            if len(known) < len(table):
                return None
            ranges[name] = known
        return ranges

    def _unfit(self, spark: SparkSession, name: str, fitted: _Fitted) -> DataFrame:
        """The keys of window rows of gold table `name` that would not fit (`overflow.unfit`)."""
        module, (lo, hi) = self.modules[name], self._starts(fitted, name)
        target = spark.read.format("delta").load(self.tables.aggregates[name])
        target = target.where(F.col("window_start").between(F.lit(lo), F.lit(hi)))
        return overflow.unfit(
            fitted.partials[name],
            target,
            module.KEY_COLUMNS,
            module.VALUE_COLUMNS,
            self.types[name],
        )

    def _add(
        self, rows: DataFrame, name: str, batch_id: int, starts: tuple[datetime, datetime]
    ) -> None:
        """MERGE a batch's partial aggregates into their table, adding to existing window rows."""
        module, (lo, hi) = self.modules[name], starts
        values: dict[str, str | Column] = {
            v: F.col(f"t.{v}") + F.col(f"s.{v}") for v in module.VALUE_COLUMNS
        }
        self.transaction(
            name,
            batch_id,
            lambda session: (
                DeltaTable.forPath(session, self.tables.aggregates[name])
                .alias("t")
                .merge(rows.alias("s"), _add_condition(module.KEY_COLUMNS, lo, hi))
                .whenMatchedUpdate(set=values)
                .whenNotMatchedInsertAll()
                .execute()
            ),
        )


def gold_sink(conf: LakehouseConf, tables: GoldTables) -> UpsertGold:
    """The gold sink of `tables`, with what it needs of `conf`."""

    def check(spark: SparkSession, frames: Frames, scope: str) -> None:
        check_frames(spark, conf, frames, tables.declarations, scope=scope)

    return UpsertGold(
        tables,
        GoldSettings(
            lateness_s=conf.gold.allowed_lateness_minutes * 60,
            storage_options=conf.delta_rs_options(),
            check=check if conf.gold.check_quality_per_batch else None,
        ),
    )


def start_gold(
    spark: SparkSession,
    conf: LakehouseConf,
    stream_name: str = "orders",
    sink: UpsertGold | None = None,
    *,
    once: bool = False,
) -> StreamingQuery:
    """Start the gold query of one stream, reading its silver events as a stream."""
    tables = gold_tables(conf, stream_name)
    require_tables(spark, {tables.events: "run `lakehouse run silver` first"})
    require_dimensions(spark, tables)
    ensure_gold_tables(spark, conf, tables)
    return start_delta_to_batches(
        spark,
        tables.events,
        sink or gold_sink(conf, tables),
        name=f"gold_{stream_name}",
        checkpoint=tables.checkpoint,
        layer=conf.gold,
        once=once,
        written=[*tables.aggregates.values(), tables.late, tables.high_water],
    )


def run_gold(
    spark: SparkSession,
    conf: LakehouseConf,
    stream_name: str = "orders",
    *,
    once: bool = False,
    progress: bool = True,
) -> StreamingQuery:
    """Run gold until done (`once`) or until SIGINT/SIGTERM."""
    tables = gold_tables(conf, stream_name)
    sink = gold_sink(conf, tables)
    return run_query(
        spark,
        progress_table(spark, conf),
        lambda: start_gold(spark, conf, stream_name, sink, once=once),
        sink,
        name="gold",
        what=f"gold from {tables.events}",
        progress=progress,
    )
