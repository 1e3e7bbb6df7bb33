"""Gold layer: windowed aggregates, dimension joins and late events; one module per table."""
