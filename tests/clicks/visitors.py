"""silver/visitors: each visitor's latest click."""

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from bronze.ddl import column_names
from declaration import Declaration

TABLE = Declaration(
    schema="visitor_id string NOT NULL, click_id string NOT NULL, page string NOT NULL, event_time timestamp NOT NULL"
)
KEY = "visitor_id"


def current_state(clicks: DataFrame) -> DataFrame:
    latest = F.max_by(F.struct(*column_names(TABLE.schema)), F.struct("event_time", "click_id"))
    return clicks.groupBy(KEY).agg(latest.alias("v")).select("v.*")


def is_newer(target: str, source: str) -> str:
    t, s = target, source
    return f"{s}.event_time > {t}.event_time OR ({s}.event_time = {t}.event_time AND {s}.click_id > {t}.click_id)"
