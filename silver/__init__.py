"""Silver layer: parse, validate, quarantine, dedupe and MERGE current state; generic helpers in
`events.py`, one module per table of the reference stream."""
