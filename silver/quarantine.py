"""The quarantine of a stream: every invalid record, with its Kafka coordinates and a reason."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from bronze.ddl import column_names
from declaration import Declaration

TABLE = Declaration(
    schema=(
        "topic string NOT NULL, partition int NOT NULL, offset bigint NOT NULL, "
        "kafka_timestamp timestamp, key binary, value binary, reason string NOT NULL"
    ),
    properties={"delta.appendOnly": "true"},
)
QUARANTINE_COLUMNS = column_names(TABLE.schema)


def quarantined_records(parsed: DataFrame) -> DataFrame:
    """Invalid records (`reason` set) as quarantine rows: coordinates, raw key and value, reason."""
    return parsed.where(F.col("reason").isNotNull()).select(*QUARANTINE_COLUMNS)
