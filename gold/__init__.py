"""Gold layer: windowed aggregations, dimension joins and data quality (see issue 4)."""
