import logging
import os
import signal
import threading

import pytest
from pyspark.errors import StreamingQueryException

from pipelines.errors import JobFailedError, QualityError
from pipelines.layers import progress_table
from pipelines.streaming.query import first_line
from pipelines.streaming.sink import STOPPING, IdempotentSink, StopRequested


class Failing(IdempotentSink):
    def write_batch(self, batch, batch_id):
        self.seen = self.cache(batch.selectExpr("id * 2 AS id"))
        assert self.seen.is_cached
        raise QualityError(f"batch {batch_id}: expect_column_values_to_be_unique failed")


def test_a_failure_inside_a_batch_is_kept_by_type_and_its_frames_are_released(spark):
    sink, batch = Failing("/nowhere"), spark.range(3)
    with pytest.raises(QualityError):
        sink(batch, 4)
    assert isinstance(sink.failure, QualityError)
    assert str(sink.failure) == "batch 4: expect_column_values_to_be_unique failed"
    assert not sink.seen.is_cached and not batch.is_cached


def test_a_batch_that_starts_after_a_stop_request_writes_nothing(spark):
    sink = Failing("/nowhere")
    STOPPING.set()
    try:
        with pytest.raises(StopRequested, match="batch 9 left for the next run"):
            sink(spark.range(1), 9)
    finally:
        STOPPING.clear()
    assert isinstance(sink.failure, StopRequested) and not hasattr(sink, "seen")


def test_other_failures_give_their_first_meaningful_line():
    assert (
        first_line("\n  \n[CAST_INVALID_INPUT] bad value\n\tat org.apache...")
        == "[CAST_INVALID_INPUT] bad value"
    )


class Appending(IdempotentSink):
    def write_batch(self, batch, batch_id):
        self.append(batch, "t/capped", f"{self.checkpoint}/table", batch_id)


def test_a_write_delta_refuses_stops_with_one_line_naming_table_batch_and_cause(spark, tmp_path):
    (tmp_path / "metadata").write_text('{"id": "q-1"}')
    spark.sql(f"CREATE TABLE delta.`{tmp_path}/table` (n bigint) USING delta")
    spark.sql(f"ALTER TABLE delta.`{tmp_path}/table` ADD CONSTRAINT cap CHECK (n < 10)")
    with pytest.raises(JobFailedError) as e:
        Appending(str(tmp_path))(spark.range(12, 13).toDF("n"), 3)
    assert str(e.value) == (
        "batch 3 could not be written to t/capped: DeltaInvariantViolationException: "
        "[DELTA_VIOLATE_CONSTRAINT_WITH_VALUES] CHECK constraint cap (n < 10) violated by row "
        "with values: - n : 12"
    )


class Idle(IdempotentSink):
    def write_batch(self, batch, batch_id):
        pass


def test_a_companion_query_that_cannot_start_leaves_no_query_running(spark, base_conf, tmp_path):
    from pipelines.streaming.query import run_query

    main, side = Idle(str(tmp_path / "main")), Idle(str(tmp_path / "side"))

    def start():
        return (
            spark.readStream.format("rate")
            .load()
            .writeStream.foreachBatch(main)
            .option("checkpointLocation", main.checkpoint)
            .trigger(processingTime="1 second")
            .start()
        )

    def cannot_start():
        raise JobFailedError("the side query cannot start")

    with pytest.raises(JobFailedError, match="the side query cannot start"):
        run_query(
            spark,
            progress_table(spark, base_conf),
            start,
            main,
            name="t",
            what="t",
            progress=False,
            companion=(cannot_start, side, "the side query", "side"),
        )
    assert spark.streams.active == []


class Counting(IdempotentSink):
    """Records the rows of each batch; `done` once it has seen `expected` rows."""

    def __init__(self, checkpoint: str, expected: int) -> None:
        super().__init__(checkpoint)
        self.rows, self.expected = 0, expected
        self.done = threading.Event()

    def write_batch(self, batch, batch_id):
        self.rows += batch.count()
        if self.rows >= self.expected:
            self.done.set()


def test_a_companion_querys_batches_are_reported_like_the_main_querys(
    spark, base_conf, tmp_path, caplog
):
    """The pipeline job's state query runs beside the main one: its batches get the same
    progress lines (and metrics, progress table rows) under the companion's name."""
    from pipelines.streaming.query import run_query

    source = str(tmp_path / "source")
    spark.range(7).write.format("delta").save(source)
    side = Counting(str(tmp_path / "side"), expected=7)

    class StopsOnceTheSideIsDone(IdempotentSink):
        def write_batch(self, batch, batch_id):
            if not side.done.wait(timeout=120):
                raise AssertionError(f"the side query saw {side.rows} rows of 7")
            os.kill(os.getpid(), signal.SIGTERM)  # as the job gets it

    main = StopsOnceTheSideIsDone(str(tmp_path / "main"))

    def start(sink, stream, trigger="1 second"):
        return (
            stream.writeStream.foreachBatch(sink)
            .option("checkpointLocation", sink.checkpoint)
            .trigger(processingTime=trigger)
            .start()
        )

    conf = base_conf.updated({"storage.root": str(tmp_path / "lake")})
    caplog.set_level(logging.INFO, logger="lakehouse.progress")
    try:
        run_query(
            spark,
            progress_table(spark, conf),
            lambda: start(main, spark.readStream.format("rate").load()),
            main,
            name="main",
            what="main",
            progress=True,
            companion=(
                lambda: start(side, spark.readStream.format("delta").load(source), "0 seconds"),
                side,
                "the side query",
                "side",
            ),
        )
    finally:
        STOPPING.clear()
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("[side] batch")]
    assert [line.split(" rows")[0] for line in lines] == ["[side] batch 0: 7"]
    assert side.rows == 7 and spark.streams.active == []


class Exiting(IdempotentSink):
    def write_batch(self, batch, batch_id):
        raise SystemExit(0)  # as an import can (pyspark's Spark Connect package, in a doctest)


def test_a_batch_ended_by_system_exit_fails_its_query_instead_of_hanging_it(spark, tmp_path):
    """py4j answers the JVM only when a callback raises an Exception: the sink turns anything
    else into one, or the query would wait for the batch for ever."""
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.json").write_text('{"id": 1}\n')
    sink = Exiting("/nowhere")
    query = (
        spark.readStream.schema("id INT")
        .json(str(tmp_path / "in"))
        .writeStream.foreachBatch(sink)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    with pytest.raises(StreamingQueryException) as raised:
        query.awaitTermination(120)
    assert "RuntimeError: batch 0 ended by SystemExit(0)" in str(raised.value)
    assert isinstance(sink.failure, SystemExit)


class _EndingQuery:
    """A query in a batch that ends it when asked to wait: as a state query whose next batch its
    sink refused after the stop request."""

    isActive = True
    status = {"isTriggerActive": True}

    def awaitTermination(self, timeout=None):
        self.isActive = False
        raise StreamingQueryException(message="batch 5 ended the query")

    def stop(self):
        pass


def test_a_companion_that_refuses_a_batch_while_being_stopped_stopped_cleanly():
    """The race a SIGTERM met in the publish test: the state query started a batch after the stop
    request, its sink refused it, and the query's end escaped as a failure of the job."""
    from pipelines.streaming.query import _stop_cleanly

    sink = IdempotentSink("/tmp/nowhere")
    sink.failure = StopRequested("stop requested: batch 5 left for the next run")
    _stop_cleanly(_EndingQuery(), sink, "silver state")  # nothing raised
    sink.failure = RuntimeError("disk full")
    with pytest.raises(JobFailedError, match="silver state failed: batch 5 ended the query"):
        _stop_cleanly(_EndingQuery(), sink, "silver state")
