"""Bronze raw records: one row per Kafka record, key and value as untouched bytes.

The same for every topic: a new stream needs only a config entry to land in bronze.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from bronze.ddl import column_names
from declaration import Declaration

TABLE = Declaration(
    schema=(
        "topic string NOT NULL, partition int NOT NULL, offset bigint NOT NULL, "
        "kafka_timestamp timestamp, key binary, value binary, "
        "headers array<struct<key:string,value:binary>>, ingested_at timestamp NOT NULL"
    ),
    # The change feed gives each row the commit that added it and that commit's time
    # (`_commit_timestamp`): freshness per record, at no cost to an append. Not row tracking:
    # Delta 4.4 rebuilds the table's whole state on every commit to a table that has it
    # (bench/RESULTS.md, "Figures behind code choices").
    properties={"delta.appendOnly": "true", "delta.enableChangeDataFeed": "true"},
)
RAW_COLUMNS = column_names(TABLE.schema)
# offsets Kafka deleted before bronze read them (retention), once each
GAPS = Declaration(
    schema=(
        "topic string NOT NULL, partition int NOT NULL, from_offset bigint NOT NULL, "
        "to_offset bigint NOT NULL, missing_records bigint NOT NULL, "
        "detected_at timestamp NOT NULL, detected_by string NOT NULL"
    )
)
COORDINATES = ["topic", "partition", "offset"]


def to_raw_records(kafka: DataFrame) -> DataFrame:
    """Kafka source rows (with headers) as bronze rows: bytes untouched, ingestion time added."""
    return kafka.select(
        F.col("topic"),
        F.col("partition"),
        F.col("offset"),
        F.col("timestamp").alias("kafka_timestamp"),
        F.col("key"),
        F.col("value"),
        F.col("headers"),
        F.current_timestamp().alias("ingested_at"),
    )


@dataclass(frozen=True)
class OffsetGap:
    """Offsets [from_offset, to_offset] of one partition that Kafka deleted before bronze read them."""

    topic: str
    partition: int
    from_offset: int
    to_offset: int

    @property
    def missing(self) -> int:
        return self.to_offset - self.from_offset + 1

    def describe(self) -> str:
        return (
            f"topic {self.topic!r} partition {self.partition}: offsets {self.from_offset}.."
            f"{self.to_offset} ({self.missing:,} records) were deleted by Kafka before bronze read them"
        )


def find_retention_gaps(
    topic: str, next_offsets: dict[int, int], log_start: dict[int, int], log_end: dict[int, int]
) -> list[OffsetGap]:
    """Gaps between where bronze resumes (`next_offsets`) and what Kafka still holds.

    A partition has a gap when Kafka's first retained offset is past the next offset bronze needs
    and something was written there (an empty, truncated partition loses nothing). A negative
    next offset (Kafka's "earliest") needs nothing that can be gone.
    """
    gaps = []
    for partition, needed in sorted(next_offsets.items()):
        start = log_start.get(partition)
        if start is None or needed < 0 or start <= needed:
            continue
        last_missing = min(start, log_end.get(partition, start)) - 1
        if last_missing >= needed:
            gaps.append(OffsetGap(topic, partition, needed, last_missing))
    return gaps


def resume_offsets_from_table(max_offsets: dict[int, int], partitions: list[int]) -> dict[int, int]:
    """Next offset per partition after the table's last row; -2 (earliest) where it has none."""
    return {p: (max_offsets[p] + 1 if p in max_offsets else -2) for p in partitions}
