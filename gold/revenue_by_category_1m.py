"""gold/revenue_by_category_1m: paid orders per 1-minute tumbling event-time window."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gold.dimensions import line_value

KEY_COLUMNS = ["window_start", "window_end", "category", "currency"]
VALUE_COLUMNS = ["paid_orders", "units", "revenue"]


def revenue_by_category_1m(events: DataFrame) -> DataFrame:
    """Per (window, category, currency) of `paid` events: count, units and exact revenue."""
    w = F.window("event_time", "1 minute")
    return (
        events.where(F.col("event_type") == "paid")
        .groupBy(w.alias("w"), "category", "currency")
        .agg(
            F.count("*").alias("paid_orders"),
            F.sum("quantity").alias("units"),
            F.sum(line_value(F.col("quantity"), F.col("unit_price"))).cast("decimal(18,2)").alias("revenue"),
        )
        .select(
            F.col("w.start").alias("window_start"),
            F.col("w.end").alias("window_end"),
            "category",
            "currency",
            *VALUE_COLUMNS,
        )
    )
