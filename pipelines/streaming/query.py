"""Running a streaming query to its end: progress, graceful stop on signals, readable failures."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from pyspark import SparkContext
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines import logs
from pipelines.errors import JobFailedError, LakehouseError
from pipelines.streaming import metrics
from pipelines.streaming.console import ConsoleProgress
from pipelines.streaming.lease import CheckpointInUseError, CheckpointLease
from pipelines.streaming.progress_table import ProgressTable
from pipelines.streaming.sink import STOPPING, IdempotentSink, StopRequested

log = logs.get("query")
_STOP_REQUESTED = threading.Event()  # by a signal, in the last `run_query` of this process


def stop_was_requested() -> bool:
    """Whether a signal stopped the last query `run_query` ran: a job with more to run stops too."""
    return _STOP_REQUESTED.is_set()


def jvm_ignores_sigterm() -> Callable[[], None]:
    """Make the driver's JVM ignore SIGTERM while a query runs; returns the undo.

    A whole process group gets SIGTERM at once (a job runner, systemd, Kubernetes): the JVM would
    run its shutdown hooks and stop the SparkContext under the running micro-batch. Ignoring it
    leaves the stop to this Python driver, which ends the query between micro-batches; the JVM
    goes when the driver does. (SIGINT already skips pyspark's JVM.)
    """
    sc: Any = SparkContext._active_spark_context  # None: no JVM, caught below
    try:
        jvm_signal = sc._jvm.sun.misc.Signal
        term = jvm_signal("TERM")
        previous = jvm_signal.handle(term, sc._jvm.sun.misc.SignalHandler.SIG_IGN)
    except Exception:  # no JVM (sc is None), or one that does not allow it: keep its default
        return lambda: None
    return lambda: jvm_signal.handle(term, previous)


def run_query(
    spark: SparkSession,
    progress_table: ProgressTable | None,
    start: Callable[[], StreamingQuery],
    sink: IdempotentSink,
    *,
    name: str,
    what: str,
    progress: bool,
    explain: Callable[[StreamingQueryException], Exception | None] = lambda e: None,
    companion: tuple[Callable[[], StreamingQuery], IdempotentSink, str, str] | None = None,
) -> StreamingQuery:
    """Start a query and wait for it: to its end (available-now) or until SIGINT/SIGTERM.

    A signal stops the query between micro-batches, so nothing is half-written: the batch in
    flight finishes and commits, a batch starting after the signal writes nothing (its sink
    refuses it), and the query is stopped only while no trigger is active. A failure raised in
    the sink is re-raised as itself (by type); any other becomes a JobFailedError naming `what`
    (or the error `explain` makes of it). Each batch's progress goes to `progress_table` too.
    Returns the finished query.

    A `companion` (start, sink, what, name) is a second query started after the first, under its
    own checkpoint lease, and stopped with it the same way; its failure stops both, named by
    `what`; its batches are reported as the first's are, under `name`.
    """
    console = ConsoleProgress(name, quiet=not progress, steps=sink.timings)

    def report(query: StreamingQuery, on: ConsoleProgress = console) -> None:
        for p in on.update(query):
            metrics.observe(query.name, p)
            if progress_table is not None:
                progress_table.record(p)

    stop_requested = threading.Event()

    def request_stop(signum, _frame):
        log.warning(
            "%s: %s received, stopping after the current batch", name, signal.Signals(signum).name
        )
        STOPPING.set()
        stop_requested.set()
        _STOP_REQUESTED.set()

    _STOP_REQUESTED.clear()

    lease = CheckpointLease(spark, sink.checkpoint, f"the {name} job").__enter__()
    leases = [lease]
    side: StreamingQuery | None = None
    side_console = None
    if companion is not None:  # both checkpoints held before either query starts
        start_side, side_sink, side_what, side_name = companion
        side_console = ConsoleProgress(side_name, quiet=not progress, steps=side_sink.timings)
        try:
            leases.append(
                CheckpointLease(spark, side_sink.checkpoint, f"the {name} job").__enter__()
            )
        except BaseException:
            lease.__exit__()
            raise
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, request_stop)
    restore_jvm = lambda: None  # noqa: E731
    try:
        query = start()
        if previous:
            restore_jvm = jvm_ignores_sigterm()
        console.say(f"query {query.name} started (id {query.id})")
        if companion is not None:
            try:
                side = start_side()
            except BaseException:
                _stop_between_batches(query)  # no query outlives the leases released below
                raise
            console.say(f"query {side.name} started (id {side.id})")
        try:  # a batch its sink refused after a stop request ends the query: a clean stop
            while query.isActive and not stop_requested.is_set():
                query.awaitTermination(1)
                report(query)
                if side is not None:
                    report(side, side_console or console)
                try:
                    for held in leases:
                        held.renew()
                except CheckpointInUseError:  # another job took the checkpoint over: leave it
                    query.stop()
                    raise
                # a side query that refused a batch after a stop request ended cleanly
                if (
                    side is not None
                    and not side.isActive
                    and not isinstance(side_sink.failure, StopRequested)
                ):
                    _stop_between_batches(query)
                    _raise_failure(side, side_sink, side_what)
            if stop_requested.is_set():
                _stop_between_batches(query)
            query.awaitTermination()
        except StreamingQueryException:
            if not isinstance(sink.failure, StopRequested):
                raise
        finally:
            if side is not None and side.isActive:
                _stop_cleanly(side, side_sink, side_what)
        if side is not None:
            report(side, side_console or console)
        report(query)
        console.say(f"done: {console.rows:,} rows in {console.batches} batches")
        return query
    except StreamingQueryException as e:
        raise _failure(e, sink, what, explain) from None
    finally:
        for held in reversed(leases):
            held.__exit__()
        if progress_table is not None:
            progress_table.flush()
        restore_jvm()
        STOPPING.clear()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop_between_batches(query: StreamingQuery) -> None:
    """Stop a query once no batch is running (Spark's stop() interrupts a running batch)."""
    while query.isActive and query.status["isTriggerActive"]:
        query.awaitTermination(0.1)  # type: ignore[arg-type]  # seconds: pyspark takes a float
    query.stop()


def _stop_cleanly(query: StreamingQuery, sink: IdempotentSink, what: str) -> None:
    """Stop a query between batches after a stop request: a batch its sink refused meanwhile
    (StopRequested) ended it cleanly; any other failure is raised, named by `what`."""
    try:
        _stop_between_batches(query)
    except StreamingQueryException as e:
        if not isinstance(sink.failure, StopRequested):
            raise _failure(e, sink, what) from None


def _failure(
    e: StreamingQueryException,
    sink: IdempotentSink,
    what: str,
    explain: Callable[[StreamingQueryException], Exception | None] = lambda e: None,
) -> Exception:
    """The error to raise for a failed query: its sink's own (by type), or one line naming `what`."""
    if isinstance(sink.failure, LakehouseError):
        return sink.failure
    return explain(e) or JobFailedError(f"{what} failed: {first_line(str(e))}")


def _raise_failure(query: StreamingQuery, sink: IdempotentSink, what: str) -> None:
    """A query that ended by itself: raise what stopped it, named by `what`."""
    try:
        query.awaitTermination()
    except StreamingQueryException as e:
        raise _failure(e, sink, what) from None
    raise JobFailedError(f"{what} stopped")


def first_line(message: str, limit: int = 2000) -> str:
    """What a person needs from a (Java) streaming failure: its first meaningful line."""
    return next((ln for ln in message.splitlines() if ln.strip()), message)[:limit]
