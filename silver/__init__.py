"""Silver layer: parse, validate, quarantine, dedupe and MERGE current state (see issue 3)."""
