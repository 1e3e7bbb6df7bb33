"""Live progress of streaming queries on the console: batches, rows, rows/s and Kafka lag."""

from __future__ import annotations

import json
import logging
import sys

from pyspark.sql.streaming import StreamingQueryListener

log = logging.getLogger("lakehouse.progress")


def kafka_lag(latest: str | None, end: str | None) -> int | None:
    """Offsets behind the newest record, summed over partitions, from a source's progress."""
    if not latest or not end:
        return None
    try:
        latest_o, end_o = json.loads(latest), json.loads(end)
    except (TypeError, ValueError):
        return None
    lag = 0
    for topic, parts in latest_o.items():
        if not isinstance(parts, dict):
            return None
        for p, o in parts.items():
            lag += max(0, int(o) - int(end_o.get(topic, {}).get(p, 0)))
    return lag


class ConsoleProgress(StreamingQueryListener):
    """Prints one line per micro-batch, the way Spark users read progress."""

    def __init__(self, stream=None) -> None:
        self.stream = stream or sys.stderr
        self.rows = 0

    def onQueryStarted(self, event) -> None:
        print(f"[{event.name or event.id}] started (run {event.runId})", file=self.stream)

    def onQueryProgress(self, event) -> None:
        p = event.progress
        rows = p.numInputRows
        self.rows += rows
        lags = [kafka_lag(s.latestOffset, s.endOffset) for s in p.sources]
        lag = sum(x for x in lags if x is not None) if any(x is not None for x in lags) else None
        duration = p.durationMs.get("triggerExecution", 0) / 1000
        line = (
            f"[{p.name or p.id}] batch {p.batchId}: {rows:,} rows in {duration:.1f}s "
            f"({p.processedRowsPerSecond or 0:,.0f} rows/s), {self.rows:,} rows so far"
        )
        if lag is not None:
            line += f", lag {lag:,} offsets"
        print(line, file=self.stream, flush=True)

    def onQueryIdle(self, event) -> None:
        pass

    def onQueryTerminated(self, event) -> None:
        state = f"failed: {event.exception.splitlines()[0]}" if event.exception else "stopped"
        print(f"[{event.id}] {state}", file=self.stream, flush=True)
