"""Silver orders: the current state of each order, from its valid event with the highest `seq`."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from bronze.ddl import column_names
from declaration import Declaration
from silver.order_events import CURRENCIES, EVENT_TYPES, MAX_MONEY

TABLE = Declaration(
    schema=(
        "order_id string NOT NULL, event_id string NOT NULL, seq bigint NOT NULL, "
        "status string NOT NULL, customer_id string NOT NULL, product_id string NOT NULL, "
        "quantity bigint NOT NULL, unit_price decimal(12,2) NOT NULL, currency string NOT NULL, "
        "updated_at timestamp NOT NULL"
    ),
    cluster_by=("order_id",),  # each batch's MERGE reads only the files its orders can be in
    properties={"delta.enableChangeDataFeed": "true", "delta.enableDeletionVectors": "true"},
    expectations=(
        ("expect_column_values_to_not_be_null", {"column": "order_id"}),
        ("expect_column_values_to_be_unique", {"column": "order_id"}),
        ("expect_column_values_to_be_in_set", {"column": "status", "value_set": EVENT_TYPES}),
        ("expect_column_values_to_be_in_set", {"column": "currency", "value_set": CURRENCIES}),
        (
            "expect_column_values_to_be_between",
            {"column": "unit_price", "min_value": 0, "max_value": MAX_MONEY},
        ),
    ),
)
ORDER_COLUMNS = column_names(TABLE.schema)
KEY = "order_id"  # one row per order: its newest version
FROM_EVENTS = {"status": "event_type", "updated_at": "event_time"}  # its columns named otherwise


def current_state(events: DataFrame) -> DataFrame:
    """One row per order: the event with the highest seq (ties: latest event_time, then event_id)."""
    as_order = F.struct(*[F.col(FROM_EVENTS.get(c, c)).alias(c) for c in ORDER_COLUMNS])
    rank = F.struct(F.col("seq"), F.col("event_time"), F.col("event_id"))
    return events.groupBy("order_id").agg(F.max_by(as_order, rank).alias("o")).select("o.*")


def is_newer(target: str = "t", source: str = "s") -> str:
    """True when the source row is a later version than the target row (never an older one)."""
    t, s = target, source
    return (
        f"{s}.seq > {t}.seq OR ({s}.seq = {t}.seq AND ({s}.updated_at > {t}.updated_at OR "
        f"({s}.updated_at = {t}.updated_at AND {s}.event_id > {t}.event_id)))"
    )
