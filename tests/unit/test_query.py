import pytest

from pipelines.errors import QualityError
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
