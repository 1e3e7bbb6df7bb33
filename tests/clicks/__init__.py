"""A second stream, declared only in the tests: clicks on pages, through bronze, silver and gold
with nothing but a config entry (test_second_stream.py), these pure functions and declarations."""
