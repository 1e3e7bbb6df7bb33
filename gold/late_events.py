"""gold/late_events: events kept out of the windows because they came too late, with the reason."""

from __future__ import annotations

from datetime import datetime

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

LATE_COLUMNS = ["event_id", "order_id", "event_type", "event_time", "newest_event_time", "reason"]


def late_cutoff(newest_event_time: datetime | None, lateness_seconds: int) -> F.Column:
    """Event times before this are late; none is late before anything was processed."""
    if newest_event_time is None:
        return F.lit(None).cast("timestamp")
    return F.lit(newest_event_time) - F.make_interval(secs=F.lit(lateness_seconds))


def on_time_events(events: DataFrame, newest: datetime | None, lateness_seconds: int) -> DataFrame:
    """Events within the allowed lateness behind the newest event time already processed."""
    cutoff = late_cutoff(newest, lateness_seconds)
    return events.where(cutoff.isNull() | (F.col("event_time") >= cutoff))


def late_events(events: DataFrame, newest: datetime | None, lateness_seconds: int) -> DataFrame:
    """Events older than the allowed lateness, as gold/late_events rows with a readable reason."""
    cutoff = late_cutoff(newest, lateness_seconds)
    minutes = lateness_seconds / 60
    return events.where(F.col("event_time") < cutoff).select(
        "event_id",
        "order_id",
        "event_type",
        "event_time",
        F.lit(newest).cast("timestamp").alias("newest_event_time"),
        F.format_string(
            f"event_time %s is more than {minutes:g} minutes behind the newest event time "
            "already processed (%s): kept out of the gold windows",
            F.date_format("event_time", "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"),
            F.date_format(F.lit(newest).cast("timestamp"), "yyyy-MM-dd'T'HH:mm:ss.SSS'Z'"),
        ).alias("reason"),
    )
