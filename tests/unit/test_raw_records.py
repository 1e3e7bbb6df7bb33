from datetime import datetime

from chispa import assert_df_equality
from pyspark.sql import functions as F

from bronze.raw_records import (
    RAW_COLUMNS,
    OffsetGap,
    find_retention_gaps,
    resume_offsets_from_table,
    to_raw_records,
)

KAFKA_SCHEMA = (
    "key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
    "timestampType int, headers array<struct<key:string,value:binary>>"
)
T0 = datetime(2026, 11, 22, 10, 0, 0)


def test_raw_records_keep_key_value_and_headers_byte_for_byte(spark):
    kafka = spark.createDataFrame(
        [
            (b"o-1", b'{"event_id": "e-1"}', "orders", 0, 0, T0, 0, [("source", b"gen")]),
            (None, b"\xff\xfe not utf-8", "orders", 3, 41, T0, 0, None),
            (b"o-\xc3\xa9", b"", "orders", 1, 7, T0, 0, []),
        ],
        KAFKA_SCHEMA,
    )
    raw = to_raw_records(kafka)
    expected = spark.createDataFrame(
        [
            ("orders", 0, 0, T0, b"o-1", b'{"event_id": "e-1"}', [("source", b"gen")]),
            ("orders", 3, 41, T0, None, b"\xff\xfe not utf-8", None),
            ("orders", 1, 7, T0, b"o-\xc3\xa9", b"", []),
        ],
        "topic string, partition int, offset long, kafka_timestamp timestamp, key binary, "
        "value binary, headers array<struct<key:string,value:binary>>",
    )
    assert raw.columns == RAW_COLUMNS
    assert_df_equality(
        raw.drop("ingested_at"), expected, ignore_nullable=True, ignore_row_order=True
    )
    assert raw.where(F.col("ingested_at").isNull()).count() == 0


def test_no_gap_when_kafka_still_holds_the_next_offset():
    assert find_retention_gaps("t", {0: 10, 1: 0}, {0: 10, 1: 0}, {0: 50, 1: 5}) == []


def test_gap_names_partition_and_missing_range():
    gaps = find_retention_gaps("t", {0: 10, 1: 3}, {0: 25, 1: 3}, {0: 40, 1: 9})
    assert gaps == [OffsetGap("t", 0, 10, 24)]
    assert gaps[0].missing == 15
    assert "partition 0: offsets 10..24 (15 records)" in gaps[0].describe()


def test_truncated_partition_beyond_its_end_loses_only_what_was_written():
    # log start moved to the log end (everything deleted): offsets 5..19 are gone
    assert find_retention_gaps("t", {2: 5}, {2: 20}, {2: 20}) == [OffsetGap("t", 2, 5, 19)]


def test_resume_offsets_follow_the_table_and_start_unknown_partitions_at_earliest():
    assert resume_offsets_from_table({0: 99, 2: 5}, [0, 1, 2, 3]) == {0: 100, 1: -2, 2: 6, 3: -2}
