"""Running a streaming query to its end: progress, graceful stop on signals, readable failures."""

from __future__ import annotations

import re
import signal
import sys
import threading
from collections.abc import Callable

from pyspark.errors import StreamingQueryException
from pyspark.sql.streaming import StreamingQuery

from pipelines.progress import ConsoleProgress


def run_query(
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
    console = ConsoleProgress(name) if progress else None
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
        if console:
            print(f"[{name}] query {query.name} started (id {query.id})", file=sys.stderr, flush=True)
        while query.isActive and not stop_requested.is_set():
            query.awaitTermination(1)
            if console:
                console.update(query)
        if stop_requested.is_set():
            query.stop()
        query.awaitTermination()
        if console:
            console.update(query)
            print(f"[{name}] done: {console.rows:,} rows in {console.batches} batches",
                  file=sys.stderr, flush=True)  # fmt: skip
        return query
    except StreamingQueryException as e:
        raise explain(e) from None
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def first_line(message: str, limit: int = 2000) -> str:
    """What a person needs from a streaming failure: our own error raised inside a micro-batch
    (with its indented detail lines), else the first meaningful line of the (Java) message."""
    lines = message.splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if re.match(r"^(pipelines\.[\w.]+\.)?\w+(Error|Exception): ", lines[i]) and "pipelines." in lines[i]:
            detail = [lines[i]]
            for line in lines[i + 1 :]:
                if not line.startswith(("  ", "(")):
                    break
                detail.append(line)
            return "\n".join(detail)[:limit]
    return next((ln for ln in lines if ln.strip()), message)[:limit]
