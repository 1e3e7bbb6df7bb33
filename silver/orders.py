"""Silver orders: the current state of each order, from its valid event with the highest `seq`."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType, TimestampType

from silver.order_events import MONEY

ORDERS_SCHEMA = StructType(
    [
        StructField("order_id", StringType(), False),
        StructField("event_id", StringType(), False),
        StructField("seq", LongType(), False),
        StructField("status", StringType(), False),
        StructField("customer_id", StringType(), False),
        StructField("product_id", StringType(), False),
        StructField("quantity", LongType(), False),
        StructField("unit_price", MONEY, False),
        StructField("currency", StringType(), False),
        StructField("updated_at", TimestampType(), False),
    ]
)
ORDER_COLUMNS = [f.name for f in ORDERS_SCHEMA.fields]


def latest_versions(events: DataFrame) -> DataFrame:
    """One row per order: the event with the highest seq (ties: latest event_time, then event_id)."""
    as_order = F.struct(
        F.col("order_id"),
        F.col("event_id"),
        F.col("seq"),
        F.col("event_type").alias("status"),
        F.col("customer_id"),
        F.col("product_id"),
        F.col("quantity"),
        F.col("unit_price"),
        F.col("currency"),
        F.col("event_time").alias("updated_at"),
    )
    rank = F.struct(F.col("seq"), F.col("event_time"), F.col("event_id"))
    return events.groupBy("order_id").agg(F.max_by(as_order, rank).alias("o")).select("o.*")


def newer_version_condition(target: str = "t", source: str = "s") -> str:
    """True when the source row is a later version than the target row (never an older one)."""
    t, s = target, source
    return (
        f"{s}.seq > {t}.seq OR ({s}.seq = {t}.seq AND ({s}.updated_at > {t}.updated_at OR "
        f"({s}.updated_at = {t}.updated_at AND {s}.event_id > {t}.event_id)))"
    )


def order_key_condition(
    lo: str | None = None, hi: str | None = None, target: str = "t", source: str = "s"
) -> Column:
    """MERGE condition on the natural key, bounded by the batch's key range.

    With the table's files clustered by order_id, the range lets Delta skip every file whose
    min/max statistics fall outside it: the MERGE reads what the batch can touch. Keys that grow
    with time (sequences, ULIDs, snowflake ids, the reference stream's ids) keep that range narrow.
    """
    condition = F.col(f"{target}.order_id") == F.col(f"{source}.order_id")
    if lo is not None and hi is not None:
        condition = condition & F.col(f"{target}.order_id").between(F.lit(lo), F.lit(hi))
    return condition
