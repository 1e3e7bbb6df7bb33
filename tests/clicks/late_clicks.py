"""gold/late_clicks: clicks too late for the windows, with the reason."""

SCHEMA = (
    "click_id string, page string, event_time timestamp, newest_event_time timestamp, reason string"
)
PROPERTIES = {"delta.appendOnly": "true"}
