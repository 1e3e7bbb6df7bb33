"""Gold's changes as Kafka messages: the JSON the contract publishes, in version order; and the
publisher's record of what it published."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from chispa import assert_df_equality

from gold.publication import change_messages, snapshot_messages
from pipelines.config import LakehouseConf, StreamConf, duration_seconds
from pipelines.layers.publish import Position, decode_positions, encode_positions

CHANGES = (
    "window_start timestamp, category string, revenue decimal(18,2), units bigint, "
    "_change_type string, _commit_version bigint, _commit_timestamp timestamp"
)
MESSAGES = "key string, value string, version bigint, change string"
T = datetime(2026, 11, 22, 10, 15)
T_FRACTION = datetime(2026, 11, 22, 10, 15, 3, 120000)
COMMITTED = datetime(2026, 11, 26, 12, 0)


def test_changes_become_one_message_per_row_after_its_change_in_version_then_key_order(spark):
    changes = spark.createDataFrame(
        [
            (T, "toys", Decimal("10.50"), 2, "update_preimage", 3, COMMITTED),
            (T, "toys", Decimal("12.00"), 3, "update_postimage", 3, COMMITTED),
            (T_FRACTION, "books", Decimal("0.10"), None, "insert", 2, COMMITTED),
            (T, "books", Decimal("1.00"), 1, "delete", 3, COMMITTED),
        ],
        CHANGES,
    )
    got = change_messages(changes, ["window_start", "category"])
    book = '{"window_start":"2026-11-22T10:15:03.120000Z","category":"books"}'
    toys = '{"window_start":"2026-11-22T10:15:00Z","category":"toys"}'
    expected = spark.createDataFrame(
        [
            (
                book,
                '{"window_start":"2026-11-22T10:15:03.120000Z","category":"books",'
                '"revenue":"0.10","units":null}',
                2,
                "insert",
            ),
            ('{"window_start":"2026-11-22T10:15:00Z","category":"books"}', None, 3, "delete"),
            (
                toys,
                '{"window_start":"2026-11-22T10:15:00Z","category":"toys","revenue":"12.00",'
                '"units":3}',
                3,
                "update_postimage",
            ),
        ],
        MESSAGES,
    )
    assert_df_equality(got, expected, ignore_nullable=True)


def test_a_snapshot_is_every_row_as_a_message_at_its_version_in_key_order(spark):
    rows = spark.createDataFrame(
        [(T, "toys", Decimal("-3.00"), 7), (T, "books", Decimal("99999999.99"), 1)],
        "window_start timestamp, category string, revenue decimal(18,2), units bigint",
    )
    got = snapshot_messages(rows, ["category"], 12)
    expected = spark.createDataFrame(
        [
            (
                '{"category":"books"}',
                '{"window_start":"2026-11-22T10:15:00Z","category":"books",'
                '"revenue":"99999999.99","units":1}',
                12,
                "snapshot",
            ),
            (
                '{"category":"toys"}',
                '{"window_start":"2026-11-22T10:15:00Z","category":"toys","revenue":"-3.00",'
                '"units":7}',
                12,
                "snapshot",
            ),
        ],
        MESSAGES,
    )
    assert_df_equality(got, expected, ignore_nullable=True)


def test_the_published_record_keeps_every_tables_position_and_reads_back_the_same():
    positions = {
        "gold/a": Position("gold/a", "id-a", 41),
        "gold/b": Position("gold/b", "id-b", 0),
    }
    value = encode_positions(positions, {"gold/a": "/lake/gold/a", "gold/b": "/lake/gold/b"})
    assert decode_positions(value) == positions
    assert b'"path": "/lake/gold/a"' in value and b'"published_at": "' in value


def test_gold_topics_and_the_published_topic_follow_the_stream_unless_named():
    stream = StreamConf(
        topic="orders.events",
        bronze_table="bronze/orders_raw",
        gold_tables=["gold/revenue_by_category_1m", "gold/orders_by_country_5m"],
        gold_topics={"gold/orders_by_country_5m": "orders.by_country"},
    )
    assert stream.gold_topic("gold/revenue_by_category_1m") == (
        "orders.events.gold.revenue_by_category_1m"
    )
    assert stream.gold_topic("gold/orders_by_country_5m") == "orders.by_country"
    assert stream.published_versions_topic == "_lakehouse.published.orders.events"
    named = stream.model_copy(update={"published_topic": "orders.published"})
    assert named.published_versions_topic == "orders.published"
    assert LakehouseConf().publish.partitions == 1
    assert LakehouseConf().streams == {}
    assert [duration_seconds(d) for d in ("1 second", "500 milliseconds", "2 minutes")] == [
        1.0,
        0.5,
        120.0,
    ]
