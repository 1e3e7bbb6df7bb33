"""Running a streaming query to its end: progress, graceful stop on signals, readable failures."""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable

from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.progress import ConsoleProgress


def run_query(
    spark: SparkSession,
    start: Callable[[], StreamingQuery],
    *,
    name: str,
    progress: bool,
    explain: Callable[[StreamingQueryException], Exception],
) -> StreamingQuery:
    """Start a query and wait for it: to its end (available-now) or until SIGINT/SIGTERM.

    A signal stops the query between micro-batches, so nothing is half-written; a failure is
    re-raised as the readable error that `explain` makes of it. Returns the finished query.
    """
    listener = ConsoleProgress() if progress else None
    if listener:
        spark.streams.addListener(listener)
    stop_requested = threading.Event()

    def request_stop(signum, _frame):
        print(f"{name}: {signal.Signals(signum).name} received, stopping after the current batch",
              file=sys.stderr, flush=True)  # fmt: skip
        stop_requested.set()

    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, request_stop)
    try:
        query = start()
        while query.isActive and not stop_requested.is_set():
            query.awaitTermination(1)
        if stop_requested.is_set():
            query.stop()
        query.awaitTermination()
        return query
    except StreamingQueryException as e:
        raise explain(e) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if listener:
            spark.streams.removeListener(listener)


def first_line(message: str, limit: int = 500) -> str:
    """The first meaningful line of a (Java) error message."""
    return next((ln for ln in message.splitlines() if ln.strip()), message)[:limit]
