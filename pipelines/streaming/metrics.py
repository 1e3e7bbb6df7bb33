"""The lakehouse's own Prometheus metrics of a long-running layer job, at its fixed port.

Per query, from each micro-batch's progress; per topic it reads, its open transactions; per table
it writes, from the table's own log at each scrape (delta-rs, no Spark job); per data-quality
suite, its last verdict. Each metric: docs/monitoring.md, "Metrics for Prometheus".
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from deltalake import DeltaTable as DeltaLake
from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from pipelines import logs
from pipelines.kafka import StableOffsets
from pipelines.streaming.console import kafka_lag_per_partition

log = logs.get("metrics")
# The columns whose newest value is an event's time, by preference: the first a table has.
EVENT_TIME_COLUMNS = (
    "event_time",
    "kafka_timestamp",
    "window_end",
    "newest_event_time",
    "updated_at",
    "detected_at",
)

_current: JobMetrics | None = None


def observe_publication(done) -> None:
    """Count a publish job's transaction (a `publish.Round`) in this process's metrics."""
    if _current is not None:
        _current.observe_publication(done)


def observe(query_name: str, progress) -> None:
    """Count a micro-batch's progress in this process's job metrics (if they are served)."""
    if _current is not None:
        _current.observe(query_name, progress)


class JobMetrics:
    """A job's metrics registry: progress gauges and counters, and its tables' figures."""

    def __init__(self, figures: TableFigures, transactions: OpenTransactions) -> None:
        self.registry = r = CollectorRegistry()
        q = ["query"]
        self.batches = Counter("lakehouse_batches", "Micro-batches completed", q, registry=r)
        self.rows = Counter("lakehouse_input_rows", "Rows read by the micro-batches", q, registry=r)
        self.input_rate = Gauge(
            "lakehouse_input_rows_per_second", "Input rows/s of the last batch", q, registry=r
        )
        self.processed_rate = Gauge(
            "lakehouse_processed_rows_per_second", "Rows/s the last batch processed", q, registry=r
        )
        self.duration = Gauge(
            "lakehouse_batch_duration_seconds", "Duration of the last batch", q, registry=r
        )
        self.batch_id = Gauge("lakehouse_last_batch_id", "Id of the last batch", q, registry=r)
        self.lag = Gauge(
            "lakehouse_kafka_lag_offsets",
            "Offsets behind the newest record, per partition, after the last batch",
            ["query", "topic", "partition"],
            registry=r,
        )
        t = ["table"]
        self.published = Counter(
            "lakehouse_published_messages",
            "Messages published to Kafka, per gold table",
            t,
            registry=r,
        )
        self.published_version = Gauge(
            "lakehouse_published_version", "Newest table version committed to Kafka", t, registry=r
        )
        self.publish_delay = Gauge(
            "lakehouse_publish_delay_seconds",
            "From the commit of a table's newest version published to Kafka's commit of it",
            t,
            registry=r,
        )
        r.register(figures)
        if transactions.topics:
            r.register(transactions)

    def observe_publication(self, done) -> None:
        for table, (_, last) in done.versions.items():
            self.published.labels(table).inc(done.messages[table])
            self.published_version.labels(table).set(last)
        for table, delay in done.delays().items():
            self.publish_delay.labels(table).set(delay)

    def observe(self, query_name: str, p) -> None:
        q = query_name or "query"
        self.batches.labels(q).inc()
        self.rows.labels(q).inc(p.numInputRows)
        self.input_rate.labels(q).set(p.inputRowsPerSecond or 0)
        self.processed_rate.labels(q).set(p.processedRowsPerSecond or 0)
        self.duration.labels(q).set((p.durationMs or {}).get("triggerExecution", 0) / 1000)
        self.batch_id.labels(q).set(p.batchId)
        for source in p.sources:
            lags = kafka_lag_per_partition(source.latestOffset, source.endOffset) or {}
            for where, lag in lags.items():
                topic, _, partition = where.rpartition("-")
                self.lag.labels(q, topic, partition).set(lag)


class TableFigures(Collector):
    """At each scrape, the figures of the job's tables and of the quality suites on them, from
    the tables' logs (a table not created yet is left out)."""

    def __init__(self, tables: dict[str, str], quality_results: str, options: dict | None) -> None:
        self.tables, self.quality_results, self.options = tables, quality_results, options
        self._open: dict[str, DeltaLake] = {}

    def _table(self, path: str) -> DeltaLake | None:
        try:
            if (dt := self._open.get(path)) is None:
                dt = self._open[path] = DeltaLake(path, storage_options=self.options)
            else:
                dt.update_incremental()
            return dt
        except Exception as e:  # not created yet, or the storage did not answer: no figure
            log.debug("no figures for %s: %s", path, e)
            return None

    def collect(self) -> Iterator[GaugeMetricFamily]:
        t = ["table"]
        rows = GaugeMetricFamily("lakehouse_table_rows", "Rows in the table (its log)", labels=t)
        version = GaugeMetricFamily("lakehouse_table_version", "The table's version", labels=t)
        committed = GaugeMetricFamily(
            "lakehouse_table_last_commit_timestamp_seconds",
            "When the table's newest commit was made (Delta's history)",
            labels=t,
        )
        newest = GaugeMetricFamily(
            "lakehouse_table_newest_event_timestamp_seconds",
            "Event time of the newest row committed (the log's column statistics)",
            labels=t,
        )
        for name, path in self.tables.items():
            if (dt := self._table(path)) is None:
                continue
            actions = dt.get_add_actions(flatten=True)
            columns = actions.column_names
            rows.add_metric([name], sum(v or 0 for v in _values(actions, "num_records")))
            version.add_metric([name], dt.version())
            history = dt.history(1)
            if history:
                committed.add_metric([name], history[0]["timestamp"] / 1000)
            for column in EVENT_TIME_COLUMNS:
                if f"max.{column}" in columns:
                    times = [v for v in _values(actions, f"max.{column}") if v is not None]
                    if times:
                        newest.add_metric([name], max(times).timestamp())
                    break
        yield from (rows, version, committed, newest)
        yield from self._quality()

    def _quality(self) -> Iterator[GaugeMetricFamily]:
        passed = GaugeMetricFamily(
            "lakehouse_quality_suite_success",
            "1 if the suite's newest run passed, else 0",
            labels=["suite", "table"],
        )
        when = GaugeMetricFamily(
            "lakehouse_quality_suite_last_run_timestamp_seconds",
            "When the suite last ran",
            labels=["suite", "table"],
        )
        dt = self._table(self.quality_results)
        if dt is not None:
            results = dt.to_pyarrow_table(columns=["suite", "table", "run_at", "success"])
            newest: dict[tuple[str, str], tuple[Any, bool]] = {}  # run_at: a datetime
            for row in results.to_pylist():
                if row["table"] not in self.tables:
                    continue
                key = (row["suite"], row["table"])
                run_at, ok = newest.get(key, (None, True))
                if run_at is None or row["run_at"] > run_at:
                    newest[key] = (row["run_at"], bool(row["success"]))
                elif row["run_at"] == run_at:
                    newest[key] = (run_at, ok and bool(row["success"]))
            for (suite, table), (run_at, ok) in sorted(newest.items()):
                passed.add_metric([suite, table], 1 if ok else 0)
                when.add_metric([suite, table], run_at.timestamp())
        yield from (passed, when)


class OpenTransactions(Collector):
    """At each scrape, per partition of the topics a job reads (read_committed): the offsets a
    transaction still open holds back, and since when it is open. Kafka aborts a transaction
    after its producer's transaction.timeout.ms; until then every later record of the partition
    waits, and a read_committed job reads none of them."""

    def __init__(self, topics: list[str], offsets: Callable[[str], list[StableOffsets]]) -> None:
        self.topics, self.offsets = topics, offsets

    def describe(self) -> list[GaugeMetricFamily]:
        """The families, without samples (no Kafka request)."""
        labels = ["topic", "partition"]
        return [
            GaugeMetricFamily(
                "lakehouse_kafka_open_transaction_offsets",
                "Offsets a Kafka transaction still open holds back (log end less last stable "
                "offset)",
                labels=labels,
            ),
            GaugeMetricFamily(
                "lakehouse_kafka_open_transaction_age_seconds",
                "How long the oldest transaction still open in the partition has been open",
                labels=labels,
            ),
        ]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        held, age = self.describe()
        for topic in self.topics:
            try:
                found = self.offsets(topic)
            except Exception as e:  # Kafka did not answer: no figure this time
                log.debug("no transaction figures for %s: %s", topic, e)
                continue
            now_ms = time.time() * 1000
            for t in found:
                since = t.open_since_ms
                held.add_metric([topic, str(t.partition)], t.held_back)
                age.add_metric([topic, str(t.partition)], max(0, now_ms - (since or now_ms)) / 1000)
        yield from (held, age)


def _values(actions, column: str) -> list:
    return actions.column(column).to_pylist()


@contextmanager
def serve(metrics: JobMetrics, job: str, host: str, port: int) -> Iterator[JobMetrics | None]:
    """Serve `metrics` at host:port while in the block. A port that is taken (another copy of the
    job, waiting for its checkpoint) leaves this copy without metrics: never a reason to stop."""
    global _current
    try:
        server, thread = start_http_server(port, addr=host, registry=metrics.registry)
    except OSError as e:
        log.warning("no metrics for job %s: port %s:%d: %s", job, host, port, e)
        yield None
        return
    log.info("metrics of job %s at http://%s:%d/metrics", job, host, port)
    _current = metrics
    try:
        yield metrics
    finally:
        _current = None
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
