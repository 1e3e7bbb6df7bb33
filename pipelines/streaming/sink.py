"""The one foreachBatch sink every layer plugs into: idempotent, retried, and stoppable.

A layer writes only `write_batch`; every write's commit records its batch, a MERGE also carries
Delta's transaction ids (in a session of the sink's own per table, so writes of one batch run side
by side), and an append is found by the batch its commit records (ARCHITECTURE.md, "One sink, one
way to declare a table"; docs/guarantees.md, "Bronze").
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

from pyspark import SparkContext
from pyspark.sql import DataFrame, SparkSession

from pipelines import logs
from pipelines.errors import JobFailedError, LakehouseError
from pipelines.streaming import checkpoints, lineage
from pipelines.streaming.delta import idempotent_txn, newest_tagged_batch, retry_on_conflict
from pipelines.streaming.spark import FACTORY_MODE, session_confs
from pipelines.streaming.storage import Files

log = logging.getLogger("lakehouse.batch")

# Set when this driver was asked to stop: sinks refuse to start a new micro-batch from then on.
STOPPING = threading.Event()


# A replay looks for its commits (back to the newest one of its query) no further back than its
# batch's planning time less this: room for a clock set back, or another writer's clock behind.
CLOCK_MARGIN_MS = 60 * 60 * 1000


DESCRIPTION = "spark.job.description"  # of a thread's Spark jobs: Spark's UI shows it


@contextmanager
def described(spark: SparkSession | None, what: str | None) -> Iterator[None]:
    """The Spark jobs this thread starts meanwhile described as its jobs' are, then `what`."""
    if spark is None or what is None:
        yield
        return
    sc = spark.sparkContext
    before = sc.getLocalProperty(DESCRIPTION)
    sc.setLocalProperty(DESCRIPTION, f"{before}\n{what}" if before else what)
    try:
        yield
    finally:
        sc.setLocalProperty(DESCRIPTION, before)  # type: ignore[arg-type]  # None unsets it


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


@dataclass
class BatchContext:
    """What the writes of one micro-batch share, whichever sink makes them: the batch's session,
    the frames cached for it, what its commits record of the checkpoint (read once per batch),
    and the seconds of each of its steps."""

    spark: SparkSession | None = None
    cached: list[DataFrame] = field(default_factory=list)
    records: dict[int, dict[str, object]] = field(default_factory=dict)
    steps: dict[str, float] = field(default_factory=dict)

    def begin(self, spark: SparkSession) -> None:
        """Start a batch run in `spark`."""
        self.spark = spark
        self.records.clear()
        self.steps.clear()

    def release(self) -> None:
        """Unpersist the frames cached for the batch."""
        while self.cached:
            self.cached.pop().unpersist()


class IdempotentSink:
    """Base of the layers' sinks: `sink(batch, batch_id)` runs `write_batch` safely."""

    cache_batch = True  # a sink that reads its batch once (bronze) keeps it uncached

    def __init__(self, checkpoint: str) -> None:
        self.checkpoint = checkpoint
        self.failure: BaseException | None = None  # what stopped the query, by type
        self._query_id: str | None = None
        self.context = BatchContext()  # of the batch running or last run
        self.ready: Future | None = None  # tables still being created: batches wait for them
        self.timings: dict[int, dict[str, float]] = {}  # the steps of the last batches, by id
        self._sessions: dict[str, SparkSession] = {}  # table -> session of its MERGEs
        self._sessions_of: SparkContext | None = None  # the context they belong to

    @property
    def spark(self) -> SparkSession:
        """The running batch's own session: the transaction confs go there (set by each batch
        before any use)."""
        return self.context.spark  # type: ignore[return-value]

    @property
    def steps(self) -> dict[str, float]:
        """Seconds of each step of the batch running or last run."""
        return self.context.steps

    def share(self, context: BatchContext) -> None:
        """Write as part of another sink's batches, in its batch context."""
        self.context = context

    @contextmanager
    def step(self, name: str) -> Iterator[None]:
        """Time a step of the batch (added to `steps[name]`); its Spark jobs carry its name
        after the batch's in their description (Spark's UI, the History Server)."""
        started = time.perf_counter()
        try:
            with described(self.context.spark, name):
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
        self.context.begin(batch.sparkSession)
        started = time.perf_counter()
        try:
            query_id = self.query_id()
        except Exception:  # a line's context only: the batch reads it again and says what failed
            query_id = None
        with logs.batch_context(query_id, batch_id), lineage.batch(batch_id, query_id):
            self._run(batch, batch_id, started)

    def _run(self, batch: DataFrame, batch_id: int, started: float) -> None:
        try:
            if STOPPING.is_set():
                raise StopRequested(f"stop requested: batch {batch_id} left for the next run")
            self.wait_until_ready()
            self.write_batch(self.cache(batch) if self.cache_batch else batch, batch_id)
        except Exception as e:
            self.failure = e
            raise
        except BaseException as e:  # py4j answers the JVM only for an Exception: the query
            self.failure = e  # would wait for this batch for ever
            raise RuntimeError(f"batch {batch_id} ended by {e!r}") from e
        finally:
            self.context.release()
            if self.steps:  # where the batch's time went: on the console, and logged
                self.timings[batch_id] = dict(self.steps)
                for old in sorted(self.timings)[:-20]:
                    del self.timings[old]
                parts = ", ".join(f"{k} {v:.2f}" for k, v in self.steps.items())
                log.debug("batch %d: %.2f s (%s)", batch_id, time.perf_counter() - started, parts)

    def cache(self, df: DataFrame) -> DataFrame:
        """`df` persisted until the end of this batch (read more than once)."""
        self.context.cached.append(df.persist())
        return self.context.cached[-1]

    def batch_record(self, batch_id: int) -> dict[str, object]:
        """What this batch's commits record of the checkpoint (`checkpoints.batch_record`)."""
        records = self.context.records
        if batch_id not in records:
            records[batch_id] = checkpoints.batch_record(
                Files(self.spark), self.checkpoint, batch_id
            )
        return records[batch_id]

    def query_id(self) -> str:
        """The id Spark keeps in the checkpoint: batch ids count from 0 again under a new one."""
        if self._query_id is None:
            self._query_id = checkpoints.query_id(Files(self.spark), self.checkpoint)
            if self._query_id is None:
                raise JobFailedError(f"no query id in checkpoint {self.checkpoint}")
        return self._query_id

    def app_id(self, table: str) -> str:
        """The writer id of this query's transactions on `table`."""
        return f"{table}:{self.query_id()}"

    def committed(self, path: str, batch_id: int) -> bool:
        """Whether this batch's write to the table at `path` is committed already (the batch is
        a replay): the newest commit of this query in the table, if no older than the batch's
        planning, records it."""
        offsets = self.batch_record(batch_id).get("offsets")
        planned = checkpoints.planned_ms(offsets) if isinstance(offsets, str) else None
        since = None if planned is None else planned - CLOCK_MARGIN_MS
        found = newest_tagged_batch(self.spark, path, self.query_id(), since)
        return found is not None and found >= batch_id

    def session_for(self, table: str) -> SparkSession:
        """This sink's own session for its MERGEs into `table`: a MERGE is tagged through session
        settings, so writes of one batch to different tables can run side by side (`in_parallel`)
        only each in a session of its own. Made once per Spark context (pyspark wraps each batch's
        session anew: a session per batch would build its analyzer and catalog each time)."""
        if self._sessions_of is not self.spark.sparkContext:
            self._sessions, self._sessions_of = {}, self.spark.sparkContext
        if table not in self._sessions:
            self._sessions[table] = self.spark.newSession()
        return self._sessions[table]

    def in_parallel(self, *writes: Callable[[], object]) -> None:
        """Run independent writes of the batch side by side, each on a thread of its own (its log
        lines still name the batch); wait for every one, then raise the first failure. Each write
        is once per batch on its own, so a failure leaves the others' commits for the batch's
        re-run to skip."""
        if len(writes) < 2:
            for write in writes:
                write()
            return
        spark = self.context.spark
        batch = None if spark is None else spark.sparkContext.getLocalProperty(DESCRIPTION)

        def run(write: Callable[[], object]) -> object:
            with described(spark, batch):  # the batch's jobs on any thread name it
                return write()

        with ThreadPoolExecutor(len(writes), thread_name_prefix="batch-write") as pool:
            futures = [pool.submit(logs.in_this_context(partial(run, w))) for w in writes]
        failures = [e for f in futures if (e := f.exception()) is not None]
        if failures:
            raise failures[0]

    def transaction(
        self, table: str, batch_id: int, write: Callable[[SparkSession], object]
    ) -> None:
        """Run `write` (a MERGE into `table`, in the session it is given: `session_for(table)`)
        recording this batch in its commit and tagged with this batch's transaction ids (Delta
        skips it if this batch committed it), retried on write conflicts."""
        # the context manager as a decorator: each attempt sets the tags and unsets them after
        record = json.dumps(self.batch_record(batch_id))
        session = self.session_for(table)
        tagged = idempotent_txn(session, self.app_id(table), batch_id, record)(write)
        # the batch's choice of compiled or interpreted projections (`spark.INTERPRETED`) holds
        mode = self.spark.conf.get(FACTORY_MODE, None)
        follow = session_confs(session, {FACTORY_MODE: mode} if mode else {})
        self._write(table, batch_id, lambda: follow(tagged)(session))

    def append(self, df: DataFrame, table: str, path: str, batch_id: int) -> None:
        """Append `df` to the Delta table at `path` once per batch (a replay whose append
        committed skips it), recording this batch in its commit."""
        with self.step(table):
            if self.committed(path, batch_id):
                return
        record = json.dumps(self.batch_record(batch_id))
        writer = df.write.format("delta").mode("append").option("userMetadata", record)
        self._write(table, batch_id, lambda: writer.save(path))

    def _write(self, table: str, batch_id: int, write: Callable[[], object]) -> None:
        """Run a write of the batch, retried on write conflicts. Any other failure stops the job
        with one line naming the table, the batch and the cause."""
        try:
            with self.step(table):
                retry_on_conflict(write, what=table)
        except LakehouseError:
            raise
        except Exception as e:
            raise JobFailedError(
                f"batch {batch_id} could not be written to {table}: {cause(e)}"
            ) from e
