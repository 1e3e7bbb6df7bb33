"""Order events enriched with the products and customers dimensions; unknown ids stay, as `unknown`."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from declaration import Declaration

UNKNOWN = "unknown"
MAX_SUM = 9_999_999_999_999_999.99  # decimal(18,2)
# The dimension tables by role (`streams.<s>.dimensions`): loaded from the seed files, read by
# every gold batch as they are then.
DIMENSIONS = {
    "products": Declaration(
        schema="product_id string, name string, category string, list_price decimal(12,2)"
    ),
    "customers": Declaration(
        schema="customer_id string, name string, country string, segment string"
    ),
}


def enrich(events: DataFrame, dimensions: dict[str, DataFrame]) -> DataFrame:
    """Each event with its product's `category` and its customer's `country` (from the
    `products` and `customers` dimensions).

    Left joins: an id missing from its dimension counts under `unknown`, never disappears.
    """
    p = dimensions["products"].select("product_id", "category")
    c = dimensions["customers"].select("customer_id", "country")
    return (
        events.join(p, "product_id", "left")
        .join(c, "customer_id", "left")
        .withColumn("category", F.coalesce(F.col("category"), F.lit(UNKNOWN)))
        .withColumn("country", F.coalesce(F.col("country"), F.lit(UNKNOWN)))
    )


def line_value(quantity: Column, unit_price: Column) -> Column:
    """quantity × unit_price, exact for any long quantity and decimal(12,2) price."""
    return quantity.cast("decimal(19,0)") * unit_price


def money_sum(values: Column) -> Column:
    """The exact sum as decimal(18,2), or null where it does not fit (gold keeps such a
    window's events out rather than fail)."""
    return F.try_sum(values).try_cast("decimal(18,2)")
