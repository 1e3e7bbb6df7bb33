"""gold/late_clicks: clicks too late for the windows, with the reason."""

from declaration import Declaration

TABLE = Declaration(
    schema=(
        "click_id string, page string, event_time timestamp, newest_event_time timestamp, "
        "reason string"
    ),
    properties={"delta.appendOnly": "true"},
)
