"""gold/clicks_per_page_1m: clicks per page per 1-minute tumbling window."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from declaration import Declaration

TABLE = Declaration(
    schema="window_start timestamp, window_end timestamp, page string, clicks bigint"
)
KEY_COLUMNS = ["window_start", "window_end", "page"]
VALUE_COLUMNS = ["clicks"]
WINDOW_SECONDS = 60


def aggregate(clicks: DataFrame) -> DataFrame:
    return (
        clicks.groupBy(F.window("event_time", "1 minute").alias("w"), "page")
        .agg(F.count("*").alias("clicks"))
        .select(
            F.col("w.start").alias("window_start"),
            F.col("w.end").alias("window_end"),
            "page",
            "clicks",
        )
    )
