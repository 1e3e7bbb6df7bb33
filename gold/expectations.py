"""Data-quality expectations (Great Expectations 1.x) for the silver and gold tables.

Pure definitions: each suite is a table, a function that prepares the DataFrame it checks (derived
columns such as a window's length), and its expectations. Running them is `pipelines/layers/quality.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from silver.order_events import CURRENCIES, EVENT_TYPES

MAX_MONEY = 9_999_999_999.99
MAX_SUM = 9_999_999_999_999_999.99


@dataclass(frozen=True)
class Suite:
    name: str
    table: str
    expectations: list
    prepare: Callable[[DataFrame], DataFrame] = lambda df: df


def _with_window_seconds(df: DataFrame) -> DataFrame:
    return df.withColumn(
        "window_seconds", F.col("window_end").cast("long") - F.col("window_start").cast("long")
    )


def suites(unknown_share_max: float) -> list[Suite]:
    """Every suite; `unknown_share_max` bounds the share of `unknown` dimension matches."""
    import great_expectations.expectations as gxe  # heavy: imported only when checks run

    mostly_known = 1.0 - unknown_share_max
    return [
        Suite("silver_order_events", "silver/order_events", [
            gxe.ExpectColumnValuesToNotBeNull(column="event_id"),
            gxe.ExpectColumnValuesToBeUnique(column="event_id"),
            gxe.ExpectColumnValuesToBeInSet(column="event_type", value_set=list(EVENT_TYPES)),
            gxe.ExpectColumnValuesToBeInSet(column="currency", value_set=list(CURRENCIES)),
            gxe.ExpectColumnValuesToBeBetween(column="unit_price", min_value=0, max_value=MAX_MONEY),
            gxe.ExpectColumnValuesToBeBetween(column="quantity", min_value=1),
            gxe.ExpectColumnValuesToBeBetween(column="seq", min_value=1),
        ]),
        Suite("silver_orders", "silver/orders", [
            gxe.ExpectColumnValuesToNotBeNull(column="order_id"),
            gxe.ExpectColumnValuesToBeUnique(column="order_id"),
            gxe.ExpectColumnValuesToBeInSet(column="status", value_set=list(EVENT_TYPES)),
            gxe.ExpectColumnValuesToBeInSet(column="currency", value_set=list(CURRENCIES)),
            gxe.ExpectColumnValuesToBeBetween(column="unit_price", min_value=0, max_value=MAX_MONEY),
        ]),
        Suite("gold_revenue_by_category_1m", "gold/revenue_by_category_1m", [
            gxe.ExpectCompoundColumnsToBeUnique(
                column_list=["window_start", "window_end", "category", "currency"]),
            gxe.ExpectColumnValuesToBeBetween(column="window_seconds", min_value=60, max_value=60),
            gxe.ExpectColumnValuesToBeBetween(column="revenue", min_value=0, max_value=MAX_SUM),
            gxe.ExpectColumnValuesToBeBetween(column="paid_orders", min_value=1),
            gxe.ExpectColumnValuesToBeInSet(column="currency", value_set=list(CURRENCIES)),
            gxe.ExpectColumnValuesToNotBeInSet(column="category", value_set=["unknown"],
                                               mostly=mostly_known),
        ], _with_window_seconds),
        Suite("gold_orders_by_country_5m", "gold/orders_by_country_5m", [
            gxe.ExpectCompoundColumnsToBeUnique(column_list=["window_start", "window_end", "country"]),
            gxe.ExpectColumnValuesToBeBetween(column="window_seconds", min_value=300, max_value=300),
            gxe.ExpectColumnValuesToBeBetween(column="order_value", min_value=0, max_value=MAX_SUM),
            gxe.ExpectColumnValuesToBeBetween(column="created_orders", min_value=1),
            gxe.ExpectColumnValuesToNotBeInSet(column="country", value_set=["unknown"],
                                               mostly=mostly_known),
        ], _with_window_seconds),
    ]  # fmt: skip
