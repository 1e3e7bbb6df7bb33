"""Every table the configured streams declare, by name: what the jobs that act on tables as they
are (quality checks, maintenance) know of each one."""

from __future__ import annotations

from pipelines.config import LakehouseConf
from pipelines.layers import bronze, gold, silver
from pipelines.streaming.tables import Table


def declared_tables(conf: LakehouseConf) -> dict[str, Table]:
    """Each stream's bronze, silver and gold tables (those it configures), by name."""
    tables: dict[str, Table] = {}
    for name, stream in conf.streams.items():
        tables.update((t.name, t) for t in bronze.declarations(stream))
        if stream.events_table and stream.quarantine_table:
            tables.update(
                (t.name, t) for t in silver.declarations(silver.silver_tables(conf, stream))
            )
        if stream.gold_tables:
            tables.update(gold.gold_tables(conf, name).declarations)
    return tables
