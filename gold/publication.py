"""Gold rows and their changes as the Kafka messages the contract publishes: key = the row's key
columns as a JSON object, value = the whole row as a JSON object (decimals as strings, times as
ISO-8601 UTC), a deletion a tombstone (null value). Read from a table's change data feed, so
the messages follow the table's versions: folded by key, they give the table."""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, DateType, DecimalType, TimestampType

# the change data feed's own columns (Delta's), beside the table's
CHANGE_TYPE, VERSION, COMMIT_TIME = "_change_type", "_commit_version", "_commit_timestamp"
UPSERTS = ("insert", "update_postimage")  # the row as it is after the change
DELETE = "delete"
SNAPSHOT = "snapshot"  # the row as the table held it when publication began
MESSAGE_COLUMNS = ("key", "value", "version", "change")

_ISO = "yyyy-MM-dd'T'HH:mm:ss"


def iso_utc(ts: Column) -> Column:
    """A timestamp as ISO-8601 UTC text: `2026-11-22T10:15:00Z`, with its fraction if it has one
    (six digits). The session's zone is UTC."""
    whole = F.date_format(ts, f"{_ISO}'Z'")
    fraction = F.date_format(ts, f"{_ISO}.SSSSSS'Z'")
    return F.when(F.date_format(ts, "SSSSSS") == "000000", whole).otherwise(fraction)


def json_value(column: Column, data_type: DataType) -> Column:
    """A column as the contract writes it in JSON: decimals as strings (exact), timestamps as
    ISO-8601 UTC, dates as ISO dates; anything else as JSON has it."""
    if isinstance(data_type, DecimalType):
        return column.cast("string")
    if isinstance(data_type, TimestampType):
        return iso_utc(column)
    if isinstance(data_type, DateType):
        return F.date_format(column, "yyyy-MM-dd")
    return column


def _json_object(df: DataFrame, columns: list[str]) -> Column:
    types = {f.name: f.dataType for f in df.schema.fields}
    fields = [json_value(F.col(c), types[c]).alias(c) for c in columns]
    return F.to_json(F.struct(*fields), {"ignoreNullFields": "false"})


def table_columns(df: DataFrame) -> list[str]:
    """The table's own columns of a change data feed frame (without Delta's `_` columns)."""
    return [c for c in df.columns if c not in (CHANGE_TYPE, VERSION, COMMIT_TIME)]


def change_messages(changes: DataFrame, key_columns: list[str]) -> DataFrame:
    """A table's change data feed as messages, in version order then key: one per changed row
    (the row after an insert or update; a tombstone for a delete), `version` its commit."""
    kept = changes.where(F.col(CHANGE_TYPE).isin(*UPSERTS, DELETE))
    value = F.when(F.col(CHANGE_TYPE) != DELETE, _json_object(kept, table_columns(kept)))
    return (
        kept.select(
            _json_object(kept, key_columns).alias("key"),
            value.alias("value"),
            F.col(VERSION).alias("version"),
            F.col(CHANGE_TYPE).alias("change"),
        )
        .coalesce(1)  # a table's changes are few: one sorted partition, no shuffle to sort
        .sortWithinPartitions("version", "key")
    )


def snapshot_messages(rows: DataFrame, key_columns: list[str], version: int) -> DataFrame:
    """Every row of a table at `version` as a message: where publication of a table begins."""
    return (
        rows.select(
            _json_object(rows, key_columns).alias("key"),
            _json_object(rows, rows.columns).alias("value"),
            F.lit(version).cast("long").alias("version"),
            F.lit(SNAPSHOT).alias("change"),
        )
        .coalesce(1)
        .sortWithinPartitions("key")
    )
