"""Each layer's queries and sinks: bronze, silver and gold tables from their sources, and the
data-quality checks of their tables. Built from the pure functions of `bronze/`, `silver/`, `gold/`."""
