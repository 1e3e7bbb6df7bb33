"""gold/orders_by_country_5m: created orders per 5-minute window sliding every minute."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from declaration import Declaration
from gold.dimensions import MAX_SUM, UNKNOWN, line_value, money_sum
from gold.revenue_by_category_1m import with_window_seconds

KEY_COLUMNS = ["window_start", "window_end", "country"]
VALUE_COLUMNS = ["created_orders", "order_value"]  # additive: a batch adds to its window rows
WINDOW_SECONDS = 300  # how far before its event time a window row an event touches starts
TABLE = Declaration(
    schema=(
        "window_start timestamp, window_end timestamp, country string, created_orders bigint, "
        "order_value decimal(18,2)"
    ),
    cluster_by=("window_start",),  # a batch's MERGE reads only the files of the windows it touches
    expectations=(
        ("expect_compound_columns_to_be_unique", {"column_list": KEY_COLUMNS}),
        (
            "expect_column_values_to_be_between",
            {"column": "window_seconds", "min_value": 300, "max_value": 300},
        ),
        (
            "expect_column_values_to_be_between",
            {"column": "order_value", "min_value": 0, "max_value": MAX_SUM},
        ),
        ("expect_column_values_to_be_between", {"column": "created_orders", "min_value": 1}),
        (
            "expect_column_values_to_not_be_in_set",
            {"column": "country", "value_set": [UNKNOWN], "mostly": "quality.known_share"},
        ),
    ),
    prepare=with_window_seconds,
)


def aggregate(events: DataFrame) -> DataFrame:
    """Per (window, country) of `created` events: count and exact order value; each event counts
    in the five windows that contain it."""
    w = F.window("event_time", "5 minutes", "1 minute")
    return (
        events.where(F.col("event_type") == "created")
        .groupBy(w.alias("w"), "country")
        .agg(
            F.count("*").alias("created_orders"),
            money_sum(line_value(F.col("quantity"), F.col("unit_price"))).alias("order_value"),
        )
        .select("w.*", "country", *VALUE_COLUMNS)
        .withColumnsRenamed({"start": "window_start", "end": "window_end"})
    )
