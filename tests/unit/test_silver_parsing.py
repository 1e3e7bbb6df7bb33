"""Parsing and validation of raw order events: every invalid kind, and the valid edge cases."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

import pytest
from chispa import assert_df_equality
from pyspark.sql import Row
from pyspark.sql import functions as F

from silver.events import (
    dedupe_events,
    key_condition,
    new_events,
    refused_reason,
    with_clock_bound,
)
from silver.order_events import (
    EVENT_COLUMNS,
    INEXACT_PRICE,
    KEY,
    TRAILING_CONTENT,
    flat_texts,
    parse_events_checked,
    plain_fields,
    plain_shape,
)
from silver.order_events import parse_events as parse_order_events
from silver.orders import current_state as latest_versions

VALID = (
    '{"event_id": "e-1", "order_id": "o-1", "seq": 1, "event_type": "created", '
    '"customer_id": "c-1", "product_id": "p-1", "quantity": 2, "unit_price": 12.30, '
    '"currency": "EUR", "event_time": "2026-11-22T10:15:03.123Z"}'
)
RAW_SCHEMA = (
    "topic string, partition int, offset long, kafka_timestamp timestamp, key binary, value binary"
)
T0 = datetime(2026, 11, 22, 10, 0, 0)


def with_field(name: str, text: str | None) -> str:
    """VALID with one field's JSON text replaced (None: the field removed)."""
    import json
    import re

    if text is None:
        return re.sub(rf', ?"{name}": [^,}}]+|"{name}": [^,}}]+, ?', "", VALID, count=1)
    current = json.loads(VALID)[name]
    old = f'"{name}": ' + (json.dumps(current) if not isinstance(current, float) else "12.30")
    assert old in VALID, old
    return VALID.replace(old, f'"{name}": {text}')


def parse(spark, values: list[bytes]):
    raw = spark.createDataFrame(
        [("orders", 0, i, T0, b"k", v) for i, v in enumerate(values)], RAW_SCHEMA
    )
    return parse_order_events(raw)


def encoded(value: bytes | str) -> bytes:
    return value.encode() if isinstance(value, str) else value


INVALID = [
    (b'{"event_id": "\xff\xfe"}', "value is not valid UTF-8"),
    ("{not json", "value is not JSON"),
    ("", "value is not JSON"),
    ("[1, 2]", "value is not a JSON object but array<bigint>"),
    ('"a string"', "value is not a JSON object but string"),
    ("42", "value is not a JSON object but bigint"),
    ("null", "value is not a JSON object but void"),
    (with_field("seq", None), "missing field 'seq'"),
    (with_field("event_time", None), "missing field 'event_time'"),
    (with_field("currency", "null"), "field 'currency' is null"),
    (with_field("quantity", '"3"'), "field 'quantity' must be an integer, got string"),
    (with_field("seq", "1.5"), "field 'seq' must be an integer, got decimal(2,1)"),
    (with_field("seq", "true"), "field 'seq' must be an integer, got boolean"),
    (with_field("event_id", "42"), "field 'event_id' must be a string, got bigint"),
    (with_field("unit_price", '"12.30"'), "field 'unit_price' must be a number, got string"),
    (with_field("seq", "0"), "seq must be >= 1, got 0"),
    (
        with_field("seq", "9223372036854775808"),
        "seq does not fit a 64-bit integer: 9223372036854775808",
    ),
    (
        with_field("quantity", "1" + "0" * 30),
        "quantity does not fit a 64-bit integer: 1" + "0" * 30,
    ),
    (
        with_field("seq", "-9223372036854775809"),
        "seq does not fit a 64-bit integer: -9223372036854775809",
    ),
    (with_field("event_id", '""'), "field 'event_id' is empty"),
    (with_field("unit_price", "1.5e1"), INEXACT_PRICE),
    (with_field("unit_price", "1." + "0" * 41 + "1"), INEXACT_PRICE),
    (
        with_field("event_time", '"1000-01-01T00:30:00+01:00"'),
        "event_time is outside the years 1000 to 9999 in UTC: '1000-01-01T00:30:00+01:00'",
    ),
    (
        with_field("event_time", '"+12026-11-22T10:15:03Z"'),
        "event_time is outside the years 1000 to 9999 in UTC: '+12026-11-22T10:15:03Z'",
    ),
    (with_field("product_id", '""'), "field 'product_id' is empty"),
    (
        with_field("event_time", '"2026-02-30T10:00:00Z"'),
        "event_time is not an ISO-8601 instant with offset: '2026-02-30T10:00:00Z'",
    ),
    (with_field("quantity", "0"), "quantity must be >= 1, got 0"),
    (with_field("unit_price", "-1.00"), "unit_price must be >= 0, got -1.0000000000"),
    (with_field("unit_price", "12.345"), "unit_price has more than 2 decimals: 12.345"),
    (
        with_field("unit_price", "12345678901.00"),
        "unit_price does not fit decimal(12,2): 12345678901.0000000000",
    ),
    (with_field("event_type", '"refunded"'), "unknown event_type 'refunded'"),
    (with_field("currency", '"JPY"'), "unknown currency 'JPY'"),
    (with_field("currency", f'"{"Y" * 5000}"'), f"unknown currency '{'Y' * 100}...'"),
    (
        with_field("event_time", '"yesterday"'),
        "event_time is not an ISO-8601 instant with offset: 'yesterday'",
    ),
    (
        with_field("event_time", '"2026-13-45T99:00:00Z"'),
        "event_time is not an ISO-8601 instant with offset: '2026-13-45T99:00:00Z'",
    ),
    (
        with_field("event_time", '"2026-11-22 10:15:03"'),
        "event_time is not an ISO-8601 instant with offset: '2026-11-22 10:15:03'",
    ),
]


@pytest.mark.parametrize(("value", "reason"), INVALID)
def test_invalid_record_gets_a_readable_reason(parsed_cases, value, reason):
    assert parsed_cases[encoded(value)]["reason"] == reason


def test_null_value_is_invalid(spark):
    raw = spark.createDataFrame([("orders", 0, 0, T0, None, None)], RAW_SCHEMA)
    assert parse_order_events(raw).first()["reason"] == "value is null"


EDGE_CASES = [
    ("order_id", '"ordre-é-ü-订单"', "order_id", "ordre-é-ü-订单"),
    ("unit_price", "0.10", "unit_price", Decimal("0.10")),
    ("seq", "9223372036854775807", "seq", 9223372036854775807),
    ("unit_price", "9999999999.99", "unit_price", Decimal("9999999999.99")),
    ("unit_price", "1234567.89", "unit_price", Decimal("1234567.89")),
    ("unit_price", "7", "unit_price", Decimal("7.00")),
    ("unit_price", "12.300", "unit_price", Decimal("12.30")),
    ("event_time", '"2026-11-22T10:15:00Z"', "event_time", datetime(2026, 11, 22, 10, 15, 0)),
    (
        "event_time",
        '"2026-11-22T11:15:59.999+01:00"',
        "event_time",
        datetime(2026, 11, 22, 10, 15, 59, 999000),
    ),
    ("event_time", '"2026-11-22T23:59:59.999999-02:00"', "event_date", "2026-11-23"),
]


@pytest.fixture(scope="module")
def parsed_cases(spark) -> dict[bytes, Row]:
    """Every value of INVALID and EDGE_CASES parsed in one frame (a record's parse reads that
    record only), by value: one Spark job for all the cases below, not one each."""
    values = [encoded(v) for v, _ in INVALID]
    values += [with_field(field, text).encode() for field, text, _, _ in EDGE_CASES]
    return {values[r["offset"]]: r for r in parse(spark, values).collect()}


@pytest.mark.parametrize(("field", "text", "column", "expected"), EDGE_CASES)
def test_valid_edge_cases(parsed_cases, field, text, column, expected):
    row = parsed_cases[with_field(field, text).encode()]
    assert row["reason"] is None
    assert row[column] == expected


def test_fields_the_spec_does_not_know_are_tolerated(spark):
    value = VALID[:-1] + ', "channel": "web", "note": {"gift": true, "seq": "x"}}'
    row = parse(spark, [value.encode()]).first()
    assert row["reason"] is None
    assert (row["seq"], row["unit_price"]) == (1, Decimal("12.30"))


def test_valid_record_is_typed_exactly(spark):
    parsed = parse(spark, [VALID.encode()]).select(*EVENT_COLUMNS, "reason")
    expected = spark.createDataFrame(
        [
            (
                "e-1",
                "o-1",
                1,
                "created",
                "c-1",
                "p-1",
                2,
                Decimal("12.30"),
                "EUR",
                datetime(2026, 11, 22, 10, 15, 3, 123000),
                "2026-11-22",
                None,
            )
        ],
        "event_id string, order_id string, seq bigint, event_type string, customer_id string, "
        "product_id string, quantity bigint, unit_price decimal(12,2), currency string, "
        "event_time timestamp, event_date string, reason string",
    )
    assert_df_equality(parsed, expected, ignore_nullable=True)


def event(event_id: str, order_id: str, seq: int, event_type: str, minute: int) -> str:
    return (
        f'{{"event_id": "{event_id}", "order_id": "{order_id}", "seq": {seq}, '
        f'"event_type": "{event_type}", "customer_id": "c-1", "product_id": "p-1", '
        f'"quantity": 1, "unit_price": 0.10, "currency": "EUR", '
        f'"event_time": "2026-11-22T10:{minute:02d}:00Z"}}'
    )


def test_dedupe_keeps_one_row_per_event_id(spark):
    values = [
        event("e-1", "o-1", 1, "created", 1),
        event("e-2", "o-1", 2, "paid", 2),
        event("e-1", "o-1", 1, "created", 1),
        "{bad",
        event("e-1", "o-1", 1, "created", 1),
    ]
    deduped = dedupe_events(parse(spark, [v.encode() for v in values]), KEY, EVENT_COLUMNS)
    assert sorted(r["event_id"] for r in deduped.collect()) == ["e-1", "e-2"]
    assert deduped.columns == EVENT_COLUMNS


def test_latest_version_wins_whatever_the_arrival_order(spark):
    values = [
        event("e-3", "o-1", 3, "shipped", 3),
        event("e-1", "o-1", 1, "created", 1),
        event("e-2", "o-1", 2, "paid", 2),
        event("e-5", "o-2", 1, "created", 5),
    ]
    latest = latest_versions(
        dedupe_events(parse(spark, [v.encode() for v in values]), KEY, EVENT_COLUMNS)
    )
    got = {r["order_id"]: (r["event_id"], r["seq"], r["status"]) for r in latest.collect()}
    assert got == {"o-1": ("e-3", 3, "shipped"), "o-2": ("e-5", 1, "created")}


def test_ties_on_seq_go_to_the_later_event_time_then_the_greater_event_id(spark):
    values = [
        event("e-a", "o-1", 2, "paid", 4),
        event("e-b", "o-1", 2, "cancelled", 3),  # same seq, earlier time
        event("e-c", "o-2", 2, "paid", 4),
        event("e-d", "o-2", 2, "cancelled", 4),  # same seq and time, greater event_id
    ]
    latest = latest_versions(
        dedupe_events(parse(spark, [v.encode() for v in values]), KEY, EVENT_COLUMNS)
    )
    got = {r["order_id"]: r["event_id"] for r in latest.collect()}
    assert got == {"o-1": "e-a", "o-2": "e-d"}


def test_a_row_the_table_would_refuse_gets_the_first_constraint_it_breaks(spark):
    rows = spark.createDataFrame([(1, 5), (None, 5000), (2, 5000), (3, None)], "a bigint, q bigint")
    refused = rows.withColumn("reason", refused_reason("t/x", ["a"], {"q_cap": "q < 1000"}))
    broken = "breaks constraint q_cap (q < 1000) of t/x"
    expected = spark.createDataFrame(
        [(1, 5, None), (None, 5000, "field 'a' is null, which t/x does not allow")]
        + [(2, 5000, broken), (3, None, broken)],  # a null check breaks it too, as in Delta
        "a bigint, q bigint, reason string",
    )
    assert_df_equality(refused, expected, ignore_nullable=True)
    unconstrained = rows.withColumn("reason", refused_reason("t/x", [], {}))
    assert unconstrained.where("reason IS NOT NULL").count() == 0


def test_a_huge_key_is_kept_out_of_the_merge_condition_which_still_matches_it(spark):
    huge = "x" * 1_000_000
    condition = key_condition("id", "a" + huge, "b" + huge)
    assert len(str(condition)) < 300
    keys = spark.createDataFrame([("a" + huge,), ("b" + huge,), ("a",)], "id string")
    assert keys.alias("t").join(keys.alias("s"), condition).count() == 2  # "a" is out of range


TRICKY = [
    VALID,
    VALID[:-1] + ', "channel": "web"}',
    VALID[:-1] + ', "a, seq: BIGINT": 1}',
    '{"event_id": "e-1", "event_id": "e-2"}',
    VALID.replace('"seq": 1', '"seq": 1, "seq": 2'),
    *(with_field("seq", t) for t in ("1", "-1", "0", "1.0", "1e0", '"1"', "null", "[1]")),
    *(with_field("quantity", t) for t in ("127", "32768", "2147483648", "9223372036854775807")),
    *(
        with_field("unit_price", t)
        for t in ("0", "0.0", "-0.00", "12", "12.3", "12.30", "12.301", "1e1", '"1"', "99999999999")
    ),
    # more than 10 decimals: the price as read is rounded, its text is not
    *(with_field("unit_price", t) for t in ("1.00000000001", "1.00000000005", "2.999999999999")),
    *(with_field("unit_price", "9" * n) for n in (28, 29, 38, 39)),
    *(with_field("seq", t) for t in ("9223372036854775808", "12345678901234567890123")),
    *(with_field("customer_id", t) for t in ('"123"', "123", '"true"', "true", '"{}"', "[]")),
    *(with_field("product_id", t) for t in ('"p\\\\"', '"p\\u0000"', '"\\ud800"', '"p\\""')),
    *(with_field("event_id", t) for t in ('""', '" "', '"\\u00e9"', "{}", "false")),
    *(
        with_field("event_time", f'"{t}"')
        for t in (
            "2026-11-22T10:15:03Z",
            "2026-11-22T10:15:03.1Z",
            "2026-11-22T10:15:03.12Z",
            "2026-11-22T10:15:03.1234Z",
            "2026-11-22T10:15:03.123456789+05:30",
            "2026-11-22T10:15:03.1234567890Z",
            "2026-11-22T24:00:00Z",
            "2026-11-22T10:15:60Z",
            "2026-11-22T10:15:03-00:00",
            "2026-11-22T10:15:03+18:00",
            "2026-11-22T10:15:03+19:00",
            "2026-11-22T10:15:03z",
            "2026-11-22T10:15:03+0100",
            "2026-02-29T10:15:03Z",
            "2028-02-29T10:15:03Z",
            "9999-12-31T23:59:59-01:00",
            "1000-01-01T00:00:00Z",
            "0999-12-31T23:59:59Z",
        )
    ),
]


def test_the_common_case_shortcut_gives_what_the_field_by_field_checks_give(spark):
    """Records of the common shape take a one-cast shortcut; on every tricky record, valid or
    not, parse_events must give exactly the rows of the field-by-field checks."""
    raw = spark.createDataFrame(
        [("orders", 0, i, T0, b"k", v.encode()) for i, v in enumerate(TRICKY)], RAW_SCHEMA
    )
    fast, checked = parse_order_events(raw), parse_events_checked(raw)
    assert_df_equality(fast, checked, ignore_row_order=True, ignore_nullable=True)
    assert fast.where("reason IS NULL").count() == 33
    # the shortcut really ran: on all valid ones but an integer
    # written with a fraction (seq 1.0, an integer to the checks, not to the shortcut) or an event
    # time in another form that the checks accept (4 fraction digits, a lowercase z)
    shape = plain_shape(flat_texts(F.col("value")))
    _, plain = plain_fields(F.col("value"), shape)
    assert raw.where(plain).count() == 30


# what a streaming JSON reader may read otherwise than Spark: other encodings, a byte order mark,
# escapes, numbers at the edges, JSON that is not quite JSON
ODD_BYTES = [
    b"\xef\xbb\xbf" + VALID.encode(),
    VALID.encode("utf-16-le"),
    VALID.encode("utf-16"),
    VALID.encode("utf-32"),
    VALID.encode() + b"\x00",
    VALID.replace("c-1", "c-\x001").encode(),
    VALID.replace("c-1", "c-\t1").encode(),
    VALID.replace("c-1", "c-\\ud83d\\ude00").encode(),
    VALID.replace("c-1", "c-\U0001f600").encode(),
    VALID.replace("c-1", "c-\\udc00\\ud83d").encode(),
    VALID.replace("c-1", "c-\\u0063").encode(),
    VALID.replace("c-1", "c-\u00e9").encode("latin-1"),
    VALID.replace("c-1", "c-\xed\xa0\x80").encode("utf-8", "surrogatepass"),
    VALID.replace('"c-1"', "'c-1'").encode(),
    VALID.replace(", ", " , ").replace(": ", " :\n ").encode(),
    VALID[:-1].encode() + b",}",
    VALID[:-1].encode() + b" /* c */}",
    b"{" + VALID[1:].replace('"', "", 2).encode(),
    *(
        with_field("unit_price", t).encode()
        for t in ("01", "1.", ".5", "+1", "-0", "NaN", "Infinity", "0x10", "1E2", "1e-2")
    ),
    *(with_field("unit_price", "0." + "0" * n + "1").encode() for n in (35, 36, 37, 38)),
    *(with_field("unit_price", "1." + "0" * n).encode() for n in (36, 37, 38)),
    *(with_field("seq", t).encode() for t in ("-0", "00", "2147483648", "-9223372036854775808")),
    *(with_field("seq", t).encode() for t in ("9223372036854775807", "1 ", " 1")),
]
# fields the contract does not name, with what may be in them
EXTRA = [
    '"note": {"gift": {"wrap": true}, "tags": ["a", 1, 2.5, null, false, [], {}]}',
    '"n": 12345678901234567890',
    '"n": 1.5e3',
    '"n": 1E400',
    '"n": -0.0000000000000000000000000000000000000001',
    '"n": "\\ud800"',
    '"n": {"\\ud800": 1}',
    '"\\ud83d\\ude00": 1',
    '"n": "\\ud83d\\ude00"',
    '"n": {"a": 1, "a": 2}',
    '"n": [{"a": 1}, {"a": 2}]',
    '"n": 1, "n": 1',
    '"s\\u0065q": 2',
    '"n": ' + "[" * 40 + "]" * 40,
    '"n": ' + "[" * 20 + "]" * 20,
    '"n": "' + "x" * (5 << 20) + '"',
    '"": null',
]
ODD_BYTES += [(VALID[:-1] + ", " + extra + "}").encode() for extra in EXTRA]


def test_the_shortcut_agrees_with_the_checks_on_odd_bytes(spark):
    raw = spark.createDataFrame(
        [("orders", 0, i, T0, b"k", v) for i, v in enumerate(ODD_BYTES)], RAW_SCHEMA
    )
    fast, checked = parse_order_events(raw), parse_events_checked(raw)
    assert_df_equality(fast, checked, ignore_row_order=True, ignore_nullable=True)
    # valid: the escapes (a pair makes one character, `\u0063` a `c`, the raw emoji), the
    # spaced-out one, -0 as a price, 1.00...0 up to 38 digits, seq at the limits; a price with a
    # digit beyond its 2nd decimal is not, however far (0.00...01)
    valid = fast.where("reason IS NULL").orderBy("offset").select("offset").collect()
    assert [r.offset for r in valid] == [7, 8, 10, 12, 14, 22, 32, 33, 37, 39, 40, 41] + [
        *(42, 43, 44, 45, 46, 49, 50, 52, 55, 56, 57, 58)  # EXTRA: all but the repeated names
    ]  # and lone surrogates, which Spark does not read as JSON
    # the shortcut takes them all but surrogates (7, 8, 49, 50), 65-bit integers, exponents and
    # numbers of 39 digits in another field, nesting over 32 and a value over 4 MiB
    plain = plain_fields(F.col("value"), plain_shape(flat_texts(F.col("value"))))[1]
    taken = raw.where(plain).orderBy("offset").collect()
    assert [r.offset for r in taken] == [10, 12, 14, 22, 32, 33, 37, 39, 40, 41, 42, 52, 56, 58]


def test_the_shortcut_agrees_with_the_checks_on_mutated_records(spark):
    """Every record a seeded fuzzer makes of valid ones (bytes dropped, doubled, replaced by JSON's
    own characters) parses the same both ways."""
    import random

    rng = random.Random(38)
    alphabet = b' {}[]":,.-+0123456789eE\\u\x00\xff\xc3\xa9tnfalr'
    values = []
    for i in range(3000):
        plain = event(f"e-{i}", f"o-{i % 7}", 1 + i % 5, "paid", i % 60)
        extra = plain[:-1] + ', "note": {"gift": [true, 1.5, "x"]}}'
        v = bytearray((extra if i % 2 else plain).encode())
        for _ in range(rng.randint(1, 3)):
            at = rng.randrange(len(v))
            what = rng.randrange(3)
            if what == 0:
                del v[at]
            elif what == 1:
                v.insert(at, v[at])
            else:
                v[at] = rng.choice(alphabet)
        values.append(bytes(v))
    raw = spark.createDataFrame(
        [("orders", 0, i, T0, b"k", v) for i, v in enumerate(values)], RAW_SCHEMA
    )
    fast, checked = parse_order_events(raw), parse_events_checked(raw)
    assert_df_equality(fast, checked, ignore_row_order=True, ignore_nullable=True)
    valid = fast.where("reason IS NULL").count()
    plain = raw.where(
        plain_fields(F.col("value"), plain_shape(flat_texts(F.col("value"))))[1]
    ).count()
    assert (valid, plain) == (188, 188)  # the shortcut takes every valid one


def test_new_events_are_those_the_table_lacks_in_their_partition_read_only_in_the_batch_range(
    spark,
):
    schema = "event_id string, event_date string, n int"
    stored = spark.createDataFrame(
        [("e-2", "d1", 0), ("e-3", "d2", 0), ("e-4", "d1", 0), ("e-9", "d1", 0)], schema
    )
    batch = spark.createDataFrame(
        [("e-1", "d1", 1), ("e-2", "d1", 2), ("e-3", "d1", 3), ("e-4", "d1", 4)], schema
    )
    found = new_events(batch, stored, "event_id", "event_date", ["d1"], "e-1", "e-4")
    expected = spark.createDataFrame([("e-1", "d1", 1), ("e-3", "d1", 3)], schema)
    assert_df_equality(found, expected, ignore_row_order=True)
    # the read of the table is bounded by the batch's partitions and key range
    plan = found._jdf.queryExecution().optimizedPlan().toString()
    assert "e-1" in plan and "e-4" in plan and "d1" in plan
    unbounded = new_events(batch, stored, "event_id", None, [])
    assert sorted(r.event_id for r in unbounded.collect()) == ["e-1"]


# a `}` in a string, and a nested object: the object does not end at the first `}`
BRACE_IN_STRING = with_field("product_id", '"p-}{1}"')
NESTED = VALID[:-1] + ', "note": {"gift": {"wrap": true}}}'
AFTER_THE_OBJECT = [
    ' {"x": 1}',
    '{"x": 1}',
    " " + VALID,
    "garbage",
    "x",
    "]",
    ",0]",
    ",{}",
    ",",
    " ,",
    "/*c*/",
    "\u0000",
    "\u00a0",
    "\u2028",
    "\x0b",
    "\x0c",
    " \n x",
]


def parsed_both_ways(spark, values: list[str]):
    """The rows of `values` through parse_events, checked to be those of the field-by-field
    checks, with whether each took the common case's shortcut."""
    raw = spark.createDataFrame(
        [("orders", 0, i, T0, b"k", v.encode()) for i, v in enumerate(values)], RAW_SCHEMA
    )
    fast, checked = parse_order_events(raw), parse_events_checked(raw)
    assert_df_equality(fast, checked, ignore_row_order=True, ignore_nullable=True)
    shape = plain_shape(flat_texts(F.col("value")))
    plain = raw.select(plain_fields(F.col("value"), shape)[1].alias("plain"))
    return fast.orderBy("offset").collect(), [r["plain"] for r in plain.collect()]


@pytest.mark.parametrize("base", [VALID, BRACE_IN_STRING, NESTED])
def test_a_json_object_followed_by_more_than_whitespace_is_invalid(spark, base):
    rows, plain = parsed_both_ways(spark, [base + after for after in AFTER_THE_OBJECT])
    assert [r["reason"] for r in rows] == [TRAILING_CONTENT] * len(AFTER_THE_OBJECT)
    assert plain == [False] * len(AFTER_THE_OBJECT)


@pytest.mark.parametrize("base", [VALID, BRACE_IN_STRING, NESTED])
def test_whitespace_around_the_object_is_allowed(spark, base):
    values = [base + " ", base + "\t\r\n", " \n" + base, "\t " + base + " \r\n\t ", base]
    rows, plain = parsed_both_ways(spark, values)
    assert [r["reason"] for r in rows] == [None] * len(values)
    assert {(r["event_id"], r["seq"], r["unit_price"], r["event_time"]) for r in rows} == {
        ("e-1", 1, Decimal("12.30"), datetime(2026, 11, 22, 10, 15, 3, 123000))
    }
    assert plain == [True] * len(values)  # the shortcut takes them all


KAFKA = datetime(2026, 11, 26, 15, 0, 0, 123000)
BOUND_SCHEMA = "offset long, kafka_timestamp timestamp, event_time timestamp, reason string"


def ahead(event_time: str, kafka_timestamp: str, skew: str) -> str:
    return (
        f"event_time {event_time} is ahead of the record's Kafka timestamp {kafka_timestamp} by "
        f"more than the allowed clock skew of {skew}: the producer's clock is wrong"
    )


@pytest.mark.parametrize(
    ("skew", "rows", "reasons"),
    [
        (
            5,
            [
                (KAFKA, datetime(2026, 11, 26, 15, 5, 0, 123000), None),  # at the bound
                (KAFKA, datetime(2026, 11, 26, 15, 5, 0, 123001), None),  # a microsecond beyond
                (KAFKA, datetime(1000, 1, 1), None),  # far in the past
                (None, datetime(9999, 12, 31, 23, 59, 59), None),  # no Kafka timestamp: no bound
                (KAFKA, None, "value is not JSON"),  # invalid already
                (KAFKA, datetime(9999, 6, 1), "breaks constraint x"),  # its first reason stays
                (datetime(2026, 11, 26, 15, 0), datetime(9999, 6, 1), None),
            ],
            [
                None,
                ahead("2026-11-26T15:05:00.123001Z", "2026-11-26T15:00:00.123Z", "5 minutes"),
                None,
                None,
                "value is not JSON",
                "breaks constraint x",
                ahead("9999-06-01T00:00:00Z", "2026-11-26T15:00:00Z", "5 minutes"),
            ],
        ),
        (
            0,
            [(KAFKA, KAFKA, None), (KAFKA, datetime(2026, 11, 26, 15, 0, 0, 124000), None)],
            [None, ahead("2026-11-26T15:00:00.124Z", "2026-11-26T15:00:00.123Z", "0 minutes")],
        ),
        (
            1,
            [(KAFKA, datetime(2026, 11, 26, 15, 1, 0, 200000), None)],
            [ahead("2026-11-26T15:01:00.2Z", "2026-11-26T15:00:00.123Z", "1 minute")],
        ),
        (
            60,
            [
                (KAFKA, datetime(2026, 11, 26, 15, 10), None),  # beyond 5 minutes, within 60
                (KAFKA, datetime(2026, 11, 26, 16, 0, 0, 123000), None),
                (KAFKA, datetime(2026, 11, 26, 16, 0, 0, 123001), None),
            ],
            [
                None,
                None,
                ahead("2026-11-26T16:00:00.123001Z", "2026-11-26T15:00:00.123Z", "60 minutes"),
            ],
        ),
    ],
)
def test_an_event_time_beyond_the_clock_skew_ahead_of_its_kafka_timestamp_is_invalid(
    spark, skew, rows, reasons
):
    parsed = spark.createDataFrame([(i, *row) for i, row in enumerate(rows)], BOUND_SCHEMA)
    expected = spark.createDataFrame(
        [(i, *row[:2], reason) for i, (row, reason) in enumerate(zip(rows, reasons, strict=True))],
        BOUND_SCHEMA,
    )
    assert_df_equality(with_clock_bound(parsed, skew), expected, ignore_nullable=True)


def test_the_clock_bound_applies_to_parsed_events_with_the_configured_skew(spark, base_conf):
    from pipelines.layers.silver import silver_tables

    conf = base_conf.updated({"silver.max_clock_skew_minutes": 60})
    skew = silver_tables(conf, conf.stream("orders")).max_clock_skew_minutes
    assert (skew, silver_tables(base_conf, base_conf.stream("orders")).max_clock_skew_minutes) == (
        60,
        5,
    )
    raw = spark.createDataFrame(
        [
            ("orders", 0, 0, datetime(2026, 11, 22, 9, 15, 3, 123000), b"k", VALID.encode()),
            ("orders", 0, 1, datetime(2026, 11, 22, 9, 15, 3, 122000), b"k", VALID.encode()),
        ],
        RAW_SCHEMA,
    )
    reasons = [r["reason"] for r in with_clock_bound(parse_order_events(raw), skew).collect()]
    assert reasons == [
        None,
        ahead("2026-11-22T10:15:03.123Z", "2026-11-22T09:15:03.122Z", "60 minutes"),
    ]
