from pipelines.streaming.query import first_line

WRAPPED = """An exception was raised by the Python Proxy. Return Message: Traceback (most recent call last):
  File "/x/pipelines/layers/gold.py", line 163, in __call__
pipelines.layers.quality.QualityCheckFailedError: data-quality run 3a: 1 suite(s) failed:
  gold/revenue_by_category_1m (batch 1): expect_column_values_to_not_be_in_set on category failed
(results in /tmp/lake/quality/results)

\tat py4j.Protocol.getReturnValue(Protocol.java:476)"""


def test_our_error_inside_a_micro_batch_is_what_the_user_reads():
    assert first_line(WRAPPED) == (
        "pipelines.layers.quality.QualityCheckFailedError: data-quality run 3a: 1 suite(s) failed:\n"
        "  gold/revenue_by_category_1m (batch 1): expect_column_values_to_not_be_in_set on "
        "category failed\n(results in /tmp/lake/quality/results)"
    )


def test_other_failures_give_their_first_meaningful_line():
    assert (
        first_line("\n  \n[CAST_INVALID_INPUT] bad value\n\tat org.apache...")
        == "[CAST_INVALID_INPUT] bad value"
    )
