"""silver/clicks: one row per click, parsed from its JSON; invalid records carry a reason."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from declaration import Declaration

TABLE = Declaration(
    schema=(
        "click_id string NOT NULL, visitor_id string NOT NULL, page string NOT NULL, "
        "event_time timestamp NOT NULL, event_date string NOT NULL"
    ),
    partitioned_by=("event_date",),
    expectations=(("expect_column_values_to_be_unique", {"column": "click_id"}),),
)
KEY = "click_id"


def parse_events(raw: DataFrame) -> DataFrame:
    """Bronze rows with the click's fields and `reason` (null when the record is valid)."""
    text = F.col("value").cast("string")
    fields = {n: F.get_json_object(text, f"$.{n}") for n in ("click_id", "visitor_id", "page")}
    event_time = F.try_to_timestamp(F.get_json_object(text, "$.ts"))
    reason = F.when(F.try_parse_json(text).isNull(), "value is not JSON")
    for name, value in fields.items():
        reason = reason.when(F.coalesce(value, F.lit("")) == "", f"missing field '{name}'")
    reason = reason.when(event_time.isNull(), "ts is not a timestamp")
    return raw.select(
        "topic",
        "partition",
        "offset",
        "kafka_timestamp",
        "key",
        "value",
        *[value.alias(name) for name, value in fields.items()],
        event_time.alias("event_time"),
        F.date_format(event_time, "yyyy-MM-dd").alias("event_date"),
        reason.alias("reason"),
    )
