"""gold/orders_by_country_5m: created orders per 5-minute window sliding every minute."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from gold.dimensions import line_value

KEY_COLUMNS = ["window_start", "window_end", "country"]
VALUE_COLUMNS = ["created_orders", "order_value"]


def orders_by_country_5m(events: DataFrame) -> DataFrame:
    """Per (window, country) of `created` events: count and exact order value; each event counts
    in the five windows that contain it."""
    w = F.window("event_time", "5 minutes", "1 minute")
    return (
        events.where(F.col("event_type") == "created")
        .groupBy(w.alias("w"), "country")
        .agg(
            F.count("*").alias("created_orders"),
            F.sum(line_value(F.col("quantity"), F.col("unit_price"))).cast("decimal(18,2)").alias("order_value"),
        )
        .select(
            F.col("w.start").alias("window_start"),
            F.col("w.end").alias("window_end"),
            "country",
            *VALUE_COLUMNS,
        )
    )
