"""Late events: events kept out of the windows, with the reason: too late, or a window value
they would take beyond its column's type."""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from declaration import Declaration

TABLE = Declaration(
    schema=(
        "event_id string, order_id string, event_type string, event_time timestamp, "
        "newest_event_time timestamp, reason string"
    ),
    properties={"delta.appendOnly": "true"},
)
# gold's own state: the newest event time each batch had seen, so lateness survives restarts
HIGH_WATER = Declaration(
    schema="query_id string, batch_id bigint, newest_event_time timestamp",
    properties={"delta.appendOnly": "true"},
)


def late_cutoff(newest_event_time: datetime | None, lateness_seconds: int) -> Column:
    """Event times before this are late; none is late before anything was processed."""
    if newest_event_time is None:
        return F.lit(None).cast("timestamp")
    return F.lit(newest_event_time) - F.make_interval(secs=F.lit(lateness_seconds))


def on_time_events(events: DataFrame, newest: datetime | None, lateness_seconds: int) -> DataFrame:
    """Events within the allowed lateness behind the newest event time already processed."""
    cutoff = late_cutoff(newest, lateness_seconds)
    return events.where(cutoff.isNull() | (F.col("event_time") >= cutoff))


def kept_out(
    events: DataFrame, newest: datetime | None, columns: list[str], reason: Column
) -> DataFrame:
    """Events as late-events rows: `columns` of the event, then `newest_event_time` and `reason`."""
    return events.select(
        *[c for c in columns if c not in ("newest_event_time", "reason")],
        F.lit(newest).cast("timestamp").alias("newest_event_time"),
        reason.alias("reason"),
    )


def late_events(
    events: DataFrame, newest: datetime | None, lateness_seconds: int, columns: list[str]
) -> DataFrame:
    """Events older than the allowed lateness, as late-events rows with a readable reason."""
    cutoff = late_cutoff(newest, lateness_seconds)
    minutes = lateness_seconds / 60
    reason = F.format_string(
        f"event_time %s is more than {minutes:g} minutes behind the newest event time "
        "already processed (%s): kept out of the gold windows",
        F.date_format("event_time", "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"),
        F.date_format(F.lit(newest).cast("timestamp"), "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"),
    )
    return kept_out(events.where(F.col("event_time") < cutoff), newest, columns, reason)
