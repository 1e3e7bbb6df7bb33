"""What runs inside a Spark driver: the session, the idempotent sink, the query runner, Delta I/O,
checkpoints, the progress table and console progress."""
