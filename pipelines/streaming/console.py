"""Live progress of streaming queries on the console: batches, rows, rows/s and Kafka lag."""

from __future__ import annotations

import json

from pipelines import logs

log = logs.get("progress")


def kafka_lag_per_partition(latest: str | None, end: str | None) -> dict[str, int] | None:
    """`topic-partition` -> offsets behind the newest record, from a Kafka source's progress."""
    try:
        latest_o, end_o = json.loads(latest or ""), json.loads(end or "")
    except (TypeError, ValueError):
        return None
    if not isinstance(latest_o, dict) or not isinstance(end_o, dict):
        return None
    lags = {}
    for topic, parts in latest_o.items():
        if not isinstance(parts, dict):
            return None  # not a Kafka source: a Delta source reports other offsets
        for p, o in parts.items():
            lags[f"{topic}-{p}"] = max(0, int(o) - int(end_o.get(topic, {}).get(p, 0)))
    return lags


def kafka_lag(latest: str | None, end: str | None) -> int | None:
    """Offsets behind the newest record, summed over partitions, from a source's progress."""
    lags = kafka_lag_per_partition(latest, end)
    return None if lags is None else sum(lags.values())


def is_batch(progress) -> bool:
    """True for a report of a micro-batch that ran; an idle trigger's report carries the next
    batch's id and no `addBatch` duration."""
    return "addBatch" in (progress.durationMs or {})


class ConsoleProgress:
    """Follows a query's micro-batches and prints one line per batch (unless `quiet`).

    It polls the query's own progress reports from the thread that waits for the query, so no
    callback from the JVM is involved (nothing to race with at shutdown, Spark Connect-safe).
    """

    def __init__(self, name: str, *, quiet: bool = False, steps: dict | None = None) -> None:
        self.name, self.quiet = name, quiet
        self.steps = {} if steps is None else steps  # batch id -> seconds per step of the sink
        self.rows = self.batches = 0
        self.last_batch = -1

    def say(self, text: str, **ids) -> None:
        """Log `[name] text` (logger `lakehouse.progress`, INFO), unless quiet; `ids`: the
        query_id and batch_id the line is about."""
        if not self.quiet:
            log.info("[%s] %s", self.name, text, extra=ids)

    def update(self, query) -> list:
        """Print the batches that completed since the last call and return their progress
        reports; never fails the job."""
        new = []
        try:
            for p in query.recentProgress:
                # an idle trigger reports the next batch's id with nothing done: not a batch
                if p.batchId > self.last_batch and is_batch(p):
                    self.last_batch = p.batchId
                    new.append(p)
                    self._print(p)
        except Exception as e:  # progress is a courtesy: a surprise in a report must not stop a job
            log.warning("[%s] progress unavailable: %s", self.name, e)
        return new

    def _print(self, p) -> None:
        self.rows += p.numInputRows
        self.batches += 1
        lags = [kafka_lag(s.latestOffset, s.endOffset) for s in p.sources]
        known = [x for x in lags if x is not None]
        duration = p.durationMs.get("triggerExecution", 0) / 1000
        lag = f", lag {sum(known):,} offsets" if known else ""
        ids = {"query_id": str(getattr(p, "id", "") or "") or None, "batch_id": p.batchId}
        self.say(
            f"batch {p.batchId}: {p.numInputRows:,} rows in {duration:.1f}s "
            f"({p.processedRowsPerSecond or 0:,.0f} rows/s), {self.rows:,} rows so far{lag}",
            **ids,
        )
        steps = self.steps.get(p.batchId)
        if steps:
            where = ", ".join(f"{k} {v:.1f}s" for k, v in steps.items())
            self.say(f"  where the time went: {where}", **ids)
