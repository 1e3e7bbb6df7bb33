"""gold/revenue_by_category_1m: paid orders per 1-minute tumbling event-time window."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from declaration import Declaration
from gold.dimensions import MAX_SUM, UNKNOWN, line_value, money_sum
from silver.order_events import CURRENCIES

KEY_COLUMNS = ["window_start", "window_end", "category", "currency"]
VALUE_COLUMNS = ["paid_orders", "units", "revenue"]  # additive: a batch adds to its window rows
WINDOW_SECONDS = 60  # how far before its event time a window row an event touches starts


def with_window_seconds(windows: DataFrame) -> DataFrame:
    """Window rows with `window_seconds`, the length the expectations check."""
    return windows.withColumn(
        "window_seconds", F.col("window_end").cast("long") - F.col("window_start").cast("long")
    )


TABLE = Declaration(
    schema=(
        "window_start timestamp, window_end timestamp, category string, currency string, "
        "paid_orders bigint, units bigint, revenue decimal(18,2)"
    ),
    cluster_by=("window_start",),  # a batch's MERGE reads only the files of the windows it touches
    expectations=(
        ("expect_compound_columns_to_be_unique", {"column_list": KEY_COLUMNS}),
        (
            "expect_column_values_to_be_between",
            {"column": "window_seconds", "min_value": 60, "max_value": 60},
        ),
        (
            "expect_column_values_to_be_between",
            {"column": "revenue", "min_value": 0, "max_value": MAX_SUM},
        ),
        ("expect_column_values_to_be_between", {"column": "paid_orders", "min_value": 1}),
        ("expect_column_values_to_be_in_set", {"column": "currency", "value_set": CURRENCIES}),
        # `quality.known_share`: at least 1 - quality.unknown_share_max of the rows have a category
        (
            "expect_column_values_to_not_be_in_set",
            {"column": "category", "value_set": [UNKNOWN], "mostly": "quality.known_share"},
        ),
    ),
    prepare=with_window_seconds,
)


def aggregate(events: DataFrame) -> DataFrame:
    """Per (window, category, currency) of `paid` events: count, units and exact revenue."""
    w = F.window("event_time", "1 minute")
    return (
        events.where(F.col("event_type") == "paid")
        .groupBy(w.alias("w"), "category", "currency")
        .agg(
            F.count("*").alias("paid_orders"),
            F.try_sum("quantity").alias("units"),
            money_sum(line_value(F.col("quantity"), F.col("unit_price"))).alias("revenue"),
        )
        .select("w.*", "category", "currency", *VALUE_COLUMNS)
        .withColumnsRenamed({"start": "window_start", "end": "window_end"})
    )
