"""The one foreachBatch sink every layer plugs into: idempotent, retried, and stoppable.

Written once for every layer: the stop guard (a batch that starts after a stop request writes
nothing), the checkpoint's query id, Delta's transaction tags on every write (`txnAppId` = table
and query id, `txnVersion` = batch id, set through the session confs and unset after, so a
replayed batch changes nothing, not even a table version), the retry on write conflicts, and the
cached frames of a batch, unpersisted whatever happens. A layer writes only `write_batch`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager

from pyspark.sql import DataFrame, SparkSession

from pipelines.errors import JobFailedError, LakehouseError
from pipelines.streaming import checkpoints
from pipelines.streaming.delta import committed_txn, idempotent_txn, retry_on_conflict

log = logging.getLogger("lakehouse.batch")

# Set when this driver was asked to stop: sinks refuse to start a new micro-batch from then on.
STOPPING = threading.Event()


class StopRequested(RuntimeError):
    """Raised at the start of a micro-batch once a stop was requested: nothing of the batch is
    written, and the restarted query runs it again."""


def cause(e: Exception, limit: int = 2000) -> str:
    """What made a write fail, in one line: the innermost Java exception when there is one."""
    java = getattr(e, "java_exception", None) or getattr(e, "_origin", None)  # py4j's, pyspark's
    while java is not None and java.getCause() is not None:
        java = java.getCause()
    text = str(e) if java is None else f"{java.getClass().getSimpleName()}: {java.getMessage()}"
    return " ".join(text.split())[:limit]


class IdempotentSink:
    """Base of the layers' sinks: `sink(batch, batch_id)` runs `write_batch` safely."""

    cache_batch = True  # a sink that reads its batch once (bronze) keeps it uncached

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint
        self.failure: BaseException | None = None  # what stopped the query, by type
        self._query_id: str | None = None
        self._cached: list[DataFrame] = []
        self.spark: SparkSession | None = None  # the batch's own session: the txn confs go there
        self.ready: Future | None = None  # tables still being created: batches wait for them
        self.steps: dict[str, float] = {}  # seconds of each step of the batch running or last run
        self.timings: dict[int, dict[str, float]] = {}  # the steps of the last batches, by id

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time a step of the batch (added to `steps[name]`)."""
        started = time.perf_counter()
        try:
            yield
        finally:
            self.steps[name] = self.steps.get(name, 0.0) + time.perf_counter() - started

    def wait_until_ready(self) -> None:
        """Wait until the tables being created exist (raising what failed to create them)."""
        if self.ready is not None:
            with self.step("tables ready"):
                self.ready.result()
            self.ready = None

    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        raise NotImplementedError

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        self.spark = batch.sparkSession
        self.steps.clear()
        started = time.perf_counter()
        try:
            if STOPPING.is_set():
                raise StopRequested(f"stop requested: batch {batch_id} left for the next run")
            self.wait_until_ready()
            self.write_batch(self.cache(batch) if self.cache_batch else batch, batch_id)
        except BaseException as e:
            self.failure = e
            raise
        finally:
            while self._cached:
                self._cached.pop().unpersist()
            if self.steps:  # where the batch's time went: on the console, and logged
                self.timings[batch_id] = dict(self.steps)
                for old in sorted(self.timings)[:-20]:
                    del self.timings[old]
                parts = ", ".join(f"{k} {v:.2f}" for k, v in self.steps.items())
                log.info("batch %d: %.2f s (%s)", batch_id, time.perf_counter() - started, parts)

    def cache(self, df: DataFrame) -> DataFrame:
        """`df` persisted until the end of this batch (read more than once)."""
        self._cached.append(df.persist())
        return self._cached[-1]

    def query_id(self) -> str:
        """The id Spark keeps in the checkpoint: batch ids count from 0 again under a new one."""
        if self._query_id is None:
            self._query_id = checkpoints.query_id(self.checkpoint)
            if self._query_id is None:
                raise JobFailedError(f"no query id in checkpoint {self.checkpoint}")
        return self._query_id

    def app_id(self, table: str) -> str:
        """The writer id of this query's transactions on `table`."""
        return f"{table}:{self.query_id()}"

    def committed(self, table: str, path: str, batch_id: int) -> bool:
        """Whether this batch's write to `table` is committed already: the batch is a replay."""
        version = committed_txn(self.spark, path, self.app_id(table))
        return version is not None and version >= batch_id

    def transaction(self, table: str, batch_id: int, write: Callable[[], object]) -> None:
        """Run `write` (an append or a MERGE into `table`) tagged with this batch's transaction
        ids, retried on write conflicts; Delta skips it if this batch already committed it. Any
        other failure stops the job with one line naming the table, the batch and the cause."""
        # the context manager as a decorator: each attempt sets the tags and unsets them after
        record = json.dumps(checkpoints.batch_record(self.checkpoint, batch_id))
        tagged = idempotent_txn(self.spark, self.app_id(table), batch_id, record)(write)
        try:
            with self.step(table):
                retry_on_conflict(tagged, what=table)
        except LakehouseError:
            raise
        except Exception as e:
            raise JobFailedError(
                f"batch {batch_id} could not be written to {table}: {cause(e)}"
            ) from e

    def append(self, df: DataFrame, table: str, path: str, batch_id: int) -> None:
        """Append `df` to the Delta table at `path` once per batch."""
        self.transaction(
            table, batch_id, lambda: df.write.format("delta").mode("append").save(path)
        )
