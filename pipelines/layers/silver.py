"""The silver job: a stream's bronze raw records to typed events, current state and quarantine.

Generic over streams: the stream's events module parses and validates (`parse_events`, `KEY`), its
state module says what the current state is (`current_state`, `is_newer`, `KEY`). Each batch is
parsed once; invalid records and rows a table would refuse go to the quarantine, new events are
appended once each, and a query of its own MERGEs them into the state table (`UpsertState`).
How each write stays exactly once: docs/guarantees.md, "Silver".
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial

from delta.tables import DeltaTable
from pyspark.errors import AnalysisException
from pyspark.sql import Column, DataFrame, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

import silver.quarantine
from bronze.ddl import column_names
from pipelines.config import InvalidConfigError, LakehouseConf, SilverConf, StreamConf
from pipelines.layers import progress_table
from pipelines.streaming.delta import read_pinned, start_delta_to_batches
from pipelines.streaming.query import run_query, stop_was_requested
from pipelines.streaming.sink import IdempotentSink
from pipelines.streaming.storage import jvm_class
from pipelines.streaming.tables import (
    Table,
    constraints,
    declared,
    ensure_tables,
    require_tables,
)
from silver.events import (
    batch_keys,
    dedupe_events,
    key_condition,
    new_events,
    refused_reason,
    with_clock_bound,
)
from silver.quarantine import quarantined_records


@dataclass(frozen=True)
class SilverTables:
    bronze: str
    events: str
    state: str | None
    quarantine: str
    checkpoint: str
    state_checkpoint: str | None  # of the state query (`UpsertState`)
    names: tuple[str, str | None, str]  # events, state, quarantine as configured
    stream: StreamConf
    max_clock_skew_minutes: int  # an event_time further ahead of its Kafka timestamp is invalid


def silver_tables(conf: LakehouseConf, stream: StreamConf) -> SilverTables:
    events, state, quarantine = stream.events_table, stream.state_table, stream.quarantine_table
    if not events or not quarantine:
        raise InvalidConfigError(
            f"stream for topic {stream.topic!r} in {conf.source} has no silver tables: set "
            "events_table and quarantine_table (and state_table for a current-state table)"
        )
    return SilverTables(
        bronze=conf.table_path(stream.bronze_table),
        events=conf.table_path(events),
        state=conf.table_path(state) if state else None,
        quarantine=conf.table_path(quarantine),
        checkpoint=conf.checkpoint_path(events),
        state_checkpoint=conf.checkpoint_path(state) if state else None,
        names=(events, state, quarantine),
        stream=stream,
        max_clock_skew_minutes=conf.silver.max_clock_skew_minutes,
    )


def declarations(tables: SilverTables) -> list[Table]:
    """The events, state (if any) and quarantine tables of a stream."""
    events, state, quarantine = tables.names
    found = [declared(tables.stream.module(events), events)]
    found += [declared(tables.stream.module(state), state)] if state else []
    return [*found, declared(silver.quarantine, quarantine)]


def ensure_silver_tables(spark: SparkSession, conf: LakehouseConf, tables: SilverTables) -> None:
    """Create (or bring to their declarations) the events, state and quarantine tables."""
    ensure_tables(spark, {conf.table_path(t.name): t for t in declarations(tables)})


@dataclass(frozen=True)
class ParsedBatch:
    """A micro-batch parsed once for every silver write: its rows, cached, and its key ranges."""

    parsed: DataFrame
    keys: Row  # valid_records, invalid_records, partitions, min/max key
    events: DataFrame  # the valid events, deduplicated on their key


class UpsertSilver(IdempotentSink):
    """foreachBatch sink of the silver job; see the module docstring for what it guarantees."""

    cache_batch = False  # read once, into the parsed frame, which is the one cached

    def __init__(self, tables: SilverTables) -> None:
        super().__init__(tables.checkpoint)
        self.tables = tables
        events, state, _ = tables.names
        self.events = importlib.import_module(tables.stream.module(events))
        self.state = importlib.import_module(tables.stream.module(state)) if state else None
        declaration = declared(self.events, events)
        self.event_columns = column_names(declaration.schema)
        self.partition = next(iter(declaration.partitioned_by), None)

    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        parsed = self.parse(batch)
        self.write_quarantine(parsed, batch_id)
        self.write_events(self.new_events(parsed, cache=False), batch_id)

    def parse(self, batch: DataFrame) -> ParsedBatch:
        """The batch parsed and checked (cached until the batch ends), and its keys' ranges."""
        with self.step("silver.parse"):
            parsed = (
                batch.transform(self.events.parse_events)
                .transform(with_clock_bound, self.tables.max_clock_skew_minutes)
                .transform(self.refusing)
            )
            parsed = self.cache(parsed)
            keys = batch_keys(parsed, self.events.KEY, self.partition)
            events = dedupe_events(parsed, self.events.KEY, self.event_columns)
            return ParsedBatch(parsed, keys.first(), events)

    def write_quarantine(self, batch: ParsedBatch, batch_id: int) -> None:
        """Append the batch's invalid records, with their reason, to the quarantine table."""
        if batch.keys["invalid_records"]:
            quarantine = quarantined_records(batch.parsed)
            name = self.tables.names[2]  # events, state, quarantine
            self.append(quarantine, name, self.tables.quarantine, batch_id)

    def new_events(self, batch: ParsedBatch, *, cache: bool = True) -> DataFrame | None:
        """The batch's valid events that the events table does not hold yet (cached until the
        batch ends if `cache`), or None if the batch has no valid event. Read before the batch
        writes the events table, so a re-run of the batch before that write finds the same events."""
        keys, key = batch.keys, self.events.KEY
        if not keys["valid_records"]:
            return None
        stored = read_pinned(self.spark, self.tables.events)  # not re-planned by the append
        found = new_events(
            batch.events,
            stored,
            key,
            self.partition,
            keys["partitions"],
            keys["min_key"],
            keys["max_key"],
        )
        return self.cache(found) if cache else found

    def write_events(self, new: DataFrame | None, batch_id: int) -> None:
        """Append the batch's new events (`new_events`) to the events table, once per batch."""
        if new is not None:
            self.append(new, self.tables.names[0], self.tables.events, batch_id)

    def refusing(self, parsed: DataFrame) -> DataFrame:
        """`parsed` with a reason on each valid record whose row the events or the state table
        would refuse by the constraints it has now (an operator may add one at any time): the
        record goes to the quarantine and the rest of the batch is written."""
        spark, (events, state, _) = parsed.sparkSession, self.tables.names
        # an event's state row carries its fields, some under another name
        as_state = {s: F.col(e) for s, e in getattr(self.state, "FROM_EVENTS", {}).items()}
        typed, reasons = parsed.withColumns(as_state), []
        tables = {events: self.tables.events} | ({state: self.tables.state} if state else {})
        for name, path in tables.items():
            not_null, checks = constraints(spark, path)
            not_null = [c for c in not_null if c in typed.columns]
            # a check on columns the events do not carry is left to Delta: the write fails
            checks = {n: e for n, e in checks.items() if _resolves(typed, e)}
            reasons.append(refused_reason(name, not_null, checks, partial(_tried, spark)))
        return typed.withColumn("reason", F.coalesce("reason", *reasons)).drop(*as_state)


class UpsertState(UpsertSilver):
    """foreachBatch sink of the events table's new rows: their newest version per state key
    MERGEd into the state table. The silver and pipeline jobs run it as a query of its own beside
    the one that writes the events, so that a micro-batch does not wait for the state MERGE: the
    state table follows the events table a trigger behind, and knows what it consumed of it (its
    commits record the events table's offsets, as every layer's do)."""

    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        # unbounded: a key range would read the batch twice (and count its rows twice in the
        # query's progress), and the state table's files span every key family anyway
        self.merge_state(batch, batch_id)

    def merge_state(self, events: DataFrame, batch_id: int) -> None:
        """MERGE the newest version per state key of `events` into the state table, replacing a
        row only with a newer version."""
        current = self.state.current_state(events)
        on_key = key_condition(self.state.KEY)
        self.transaction(
            self.tables.names[1],
            batch_id,
            lambda session: (
                DeltaTable.forPath(session, self.tables.state)
                .alias("t")
                .merge(current.alias("s"), on_key)
                .whenMatchedUpdateAll(condition=self.state.is_newer("t", "s"))
                .whenNotMatchedInsertAll()
                .execute()
            ),
        )


def state_sink(tables: SilverTables) -> UpsertState | None:
    """The state query's sink for a stream's silver tables (None: no state table), under its own
    checkpoint: one for the silver and the pipeline jobs, whichever runs the root, so that the
    query never has two positions (and its lease keeps two jobs from running it at once)."""
    return (
        UpsertState(replace(tables, checkpoint=tables.state_checkpoint)) if tables.state else None
    )


def start_state(
    spark: SparkSession,
    conf: LakehouseConf,
    sink: UpsertState,
    *,
    once: bool,
    trigger_interval: str,
) -> StreamingQuery:
    """Start the query that MERGEs the events table's new rows into the state table."""
    tables = sink.tables
    return start_delta_to_batches(
        spark,
        tables.events,
        sink,
        name=f"silver_{tables.names[1].split('/')[-1]}_state",
        checkpoint=tables.checkpoint,
        layer=SilverConf(
            trigger_interval=trigger_interval,
            max_files_per_trigger=None,
            max_bytes_per_trigger=None,
        ),
        once=once,
        written=[tables.state],
    )


def run_with_state(
    spark: SparkSession,
    conf: LakehouseConf,
    state: UpsertState | None,
    run: Callable[[tuple | None], StreamingQuery],
    *,
    name: str,
    trigger_interval: str,
    once: bool,
    progress: bool,
) -> StreamingQuery:
    """Run a query that writes the events table (`run`, given the state query as its
    `run_query` companion, or None) with the state query (`state`) beside it, or after it with
    `once`: the state table then holds every event the run stored. Returns the first query."""
    if state is None:
        return run(None)
    what = f"silver state from {state.tables.events} into {state.tables.state}"
    start = partial(start_state, spark, conf, state, trigger_interval=trigger_interval)
    query = run(None if once else (partial(start, once=False), state, what, f"{name} state"))
    if once and not stop_was_requested():  # a stopped job leaves the state for its next run
        run_query(
            spark,
            progress_table(spark, conf),
            partial(start, once=True),
            state,
            name=f"{name} state",
            what=what,
            progress=progress,
        )
    return query


def _tried(spark: SparkSession, expression: str) -> Column:
    """`expression` as a column that is null on a row where it fails (a cast that ANSI refuses,
    a division by zero), so that such a row is quarantined instead of failing the batch: Catalyst's
    TryEval, the expression Spark's own try_* functions are made of. Where Spark's internals
    differ, the plain expression (a row on which it fails stops the batch)."""
    try:
        utils = jvm_class(spark, "org.apache.spark.sql.classic.ExpressionUtils")
        parsed = utils.expression(
            jvm_class(spark, "org.apache.spark.sql.functions").expr(expression)
        )
        try_eval = jvm_class(spark, "org.apache.spark.sql.catalyst.expressions.TryEval")
        return Column(utils.column(try_eval(parsed)))
    except Exception:  # noqa: BLE001 (internals of another Spark version)
        return F.expr(expression)


def _resolves(df: DataFrame, expression: str) -> bool:
    """Whether `expression` reads only columns of `df`."""
    try:
        df.select(F.expr(expression)).schema  # noqa: B018 (analysed, not run)
    except AnalysisException:
        return False
    return True


def start_silver(
    spark: SparkSession,
    conf: LakehouseConf,
    stream_name: str = "orders",
    sink: UpsertSilver | None = None,
    *,
    once: bool = False,
) -> StreamingQuery:
    """Start the silver query of one stream, reading its bronze table as a stream."""
    stream = conf.stream(stream_name)
    tables = silver_tables(conf, stream)
    require_tables(spark, {tables.bronze: "run `lakehouse run bronze` first"})
    ensure_silver_tables(spark, conf, tables)
    return start_delta_to_batches(
        spark,
        tables.bronze,
        sink or UpsertSilver(tables),
        name=f"silver_{tables.names[0].split('/')[-1]}",
        checkpoint=tables.checkpoint,
        layer=conf.silver,
        once=once,
        written=[tables.events, tables.quarantine],
    )


def run_silver(
    spark: SparkSession,
    conf: LakehouseConf,
    stream_name: str = "orders",
    *,
    once: bool = False,
    progress: bool = True,
) -> StreamingQuery:
    """Run silver until done (`once`) or until SIGINT/SIGTERM, with its state query beside it
    (after it with `once`)."""
    tables = silver_tables(conf, conf.stream(stream_name))
    sink = UpsertSilver(tables)
    state = state_sink(tables)
    return run_with_state(
        spark,
        conf,
        state,
        lambda companion: run_query(
            spark,
            progress_table(spark, conf),
            lambda: start_silver(spark, conf, stream_name, sink, once=once),
            sink,
            name="silver",
            what=f"silver from {tables.bronze} into {tables.names[0]}, {tables.names[2]}",
            progress=progress,
            companion=companion,
        ),
        name="silver",
        trigger_interval=conf.silver.state_trigger_interval,
        once=once,
        progress=progress,
    )
