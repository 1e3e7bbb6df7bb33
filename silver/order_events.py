"""Silver order events: raw Kafka values parsed, typed and validated against the contract.

A value of the common shape is read in one pass over its bytes (`flat_texts`); every other one
goes through Spark's VARIANT type, which keeps each JSON value's own type (string, integer, exact
decimal, null) so that every rule of the contract (docs/orders-stream.md) can be checked exactly
and named. Money goes from JSON text to decimal(12,2) without ever being a float. A value holds
exactly one JSON object: what follows the object, which Spark's JSON parsers ignore, is checked
apart.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType

from bronze.ddl import column_names
from bronze.raw_records import COORDINATES
from declaration import Declaration
from silver.events import flat_object, per_jvm

EVENT_TYPES = ("created", "paid", "shipped", "cancelled")
CURRENCIES = ("EUR", "USD", "GBP")
MONEY = DecimalType(12, 2)
PRICE_READ = DecimalType(38, 10)  # the price as read, before its checks and its cast to MONEY
MAX_MONEY = 9_999_999_999.99
INEXACT_PRICE = "unit_price must be a plain decimal of at most 38 digits, without exponent"
TRAILING_CONTENT = (
    "value is a JSON object followed by more than whitespace: the contract allows exactly one "
    "JSON object per record"
)
TWO_DECIMALS = r"^-?\d+(\.\d{0,2}0*)?$"  # a number's text with no digit but 0 after the 2nd decimal
JSON_WHITESPACE = " \t\n\r"  # the only characters JSON allows around a value
YEARS = (1000, 9999)  # of event_time in UTC: four digits, and Python reads them all
# ISO-8601 instants with an offset or Z, with 0 to 9 fraction digits.
EVENT_TIME_FORMAT = "yyyy-MM-dd'T'HH:mm:ss[.SSSSSSSSS][.SSSSSS][.SSS][.SS][.S]XXX"

ID_FIELDS = ("event_id", "order_id", "customer_id", "product_id")  # non-empty strings
STRING_FIELDS = ("event_id", "order_id", "event_type", "customer_id", "product_id", "currency")
INTEGER_FIELDS = ("seq", "quantity")
TABLE = Declaration(
    schema=(
        "event_id string NOT NULL, order_id string NOT NULL, seq bigint NOT NULL, "
        "event_type string NOT NULL, customer_id string NOT NULL, product_id string NOT NULL, "
        "quantity bigint NOT NULL, unit_price decimal(12,2) NOT NULL, currency string NOT NULL, "
        "event_time timestamp NOT NULL, event_date string NOT NULL"
    ),
    partitioned_by=("event_date",),
    zorder_by=("event_id",),  # tight key ranges per file: the dedupe's anti-join skips files
    # the change feed gives each row its commit's time (`_commit_timestamp`): freshness per event
    properties={"delta.enableChangeDataFeed": "true"},
    expectations=(
        ("expect_column_values_to_not_be_null", {"column": "event_id"}),
        ("expect_column_values_to_be_unique", {"column": "event_id"}),
        ("expect_column_values_to_be_in_set", {"column": "event_type", "value_set": EVENT_TYPES}),
        ("expect_column_values_to_be_in_set", {"column": "currency", "value_set": CURRENCIES}),
        (
            "expect_column_values_to_be_between",
            {"column": "unit_price", "min_value": 0, "max_value": MAX_MONEY},
        ),
        ("expect_column_values_to_be_between", {"column": "quantity", "min_value": 1}),
        ("expect_column_values_to_be_between", {"column": "seq", "min_value": 1}),
    ),
)
KEY = "event_id"  # an event is stored once however often it is delivered
EVENT_COLUMNS = column_names(TABLE.schema)
REQUIRED_FIELDS = tuple(c for c in EVENT_COLUMNS if c != "event_date")  # all but the derived one


def is_one_object(value: Column) -> Column:
    """Whether a raw `value` (bytes) that parses as a JSON object holds nothing after that object
    but JSON whitespace (false, never null): Spark's JSON parsers read the first value and ignore
    the rest."""
    # Cheap and enough for most records: an object ends with a `}`, so when the only `}` is the
    # last byte, the object ends there. Read as bytes (a `}` byte is a `}` in UTF-8), which costs
    # a fraction of a search through characters; then the same with whitespace after it.
    brace = F.lit(bytearray(b"}"))
    first_is_last = F.endswith(value, brace) & ~F.contains(
        F.substr(value, F.lit(1), F.octet_length(value) - 1), brace
    )
    text = value.cast("string")
    through_first = F.octet_length(F.substring_index(text, "}", 1)) + 1
    # trimmed by a pattern: Spark's two-argument rtrim is deprecated (a warning in every job)
    trimmed = F.regexp_replace(text, f"[{JSON_WHITESPACE}]+\\z", "")
    then_whitespace = through_first == F.octet_length(trimmed)
    # Otherwise (a nested object, a `}` in a string, something after it), two Jackson passes: in
    # an array, the value alone makes one element, and followed by `,0` two, exactly when nothing
    # but whitespace follows it; after anything else one of the lengths is wrong or null.
    alone = F.json_array_length(F.concat(F.lit("["), text, F.lit("]"))) == 1
    then_one_more = F.json_array_length(F.concat(F.lit("["), text, F.lit(",0]"))) == 2
    return (
        F.when(first_is_last, True)
        .when(then_whitespace, True)
        .otherwise(F.coalesce(alone & then_one_more, F.lit(False)))
    )


def _reads(v: Column) -> dict[str, Column]:
    """What the field-by-field checks read of the parsed JSON `v`, each read once (a variant read
    builds Spark expressions per field and record): the JSON type of the value and of each
    required field (null: missing; VOID: JSON null), each field's text, the integers as bigint."""
    reads = {"top": F.schema_of_variant(v)}
    for n in REQUIRED_FIELDS:
        reads[f"type_{n}"] = F.schema_of_variant(F.variant_get(v, f"$.{n}", "variant"))
        reads[f"text_{n}"] = F.try_variant_get(v, f"$.{n}", "string")
    return reads | {f"int_{n}": F.try_variant_get(v, f"$.{n}", "bigint") for n in INTEGER_FIELDS}


def _typed(r: Callable[[str], Column]) -> dict[str, Column]:
    """Every field converted to its column's type from its reads `r` (`_reads`), null where the
    conversion fails: a record is valid only if every conversion succeeds (see `_checks`); and
    `price` (exact, an exponent form too, never a float) and `time` (any ISO-8601 form), which
    the checks read."""
    fields = {n: r(f"text_{n}") for n in STRING_FIELDS}
    fields |= {n: r(f"int_{n}") for n in INTEGER_FIELDS}
    price = r("text_unit_price").try_cast(PRICE_READ)
    time = F.try_to_timestamp(r("text_event_time"), F.lit(EVENT_TIME_FORMAT))
    fields["unit_price"] = price.try_cast(MONEY)
    fields["event_time"] = F.when(F.year(time).between(*YEARS), time)  # the session zone is UTC
    return fields | {"price": price, "time": time}


def _is_integer(t: Column) -> Column:
    return t.isin("BIGINT", "INT", "SMALLINT", "TINYINT") | t.rlike(r"^DECIMAL\(\d+,0\)$")


def _is_number(t: Column) -> Column:
    return _is_integer(t) | t.startswith("DECIMAL") | (t == "DOUBLE")


def _checks(
    value: Column, v: Column, r: Callable[[str], Column], typed: Callable[[str], Column]
) -> list[tuple[Column, Column]]:
    """Each check that makes a record invalid, with its message, in the order a person would
    look: encoding, JSON, object, presence, types, then the contract's rules. `r`: the record's
    reads (`_reads`), `typed`: its typed fields (`_typed`)."""

    def said(message: str, *values: Column) -> Column:  # values quoted up to 100 characters
        cut = [
            F.when(F.length(x) > 100, F.concat(F.left(x, F.lit(100)), F.lit("..."))) for x in values
        ]
        return F.concat(F.lit(message), *[c.otherwise(x) for c, x in zip(cut, values, strict=True)])

    def quoted(message: str, name: str) -> Column:
        return said(message, r(f"text_{name}"), F.lit("'"))

    top = r("top")
    checks = [
        (value.isNull(), F.lit("value is null")),
        (~F.is_valid_utf8(value.cast("string")), F.lit("value is not valid UTF-8")),
        (v.isNull(), F.lit("value is not JSON")),
        (~top.startswith("OBJECT<"), said("value is not a JSON object but ", F.lower(top))),
        (~is_one_object(value), F.lit(TRAILING_CONTENT)),
    ]
    checks += [(r(f"type_{n}").isNull(), F.lit(f"missing field '{n}'")) for n in REQUIRED_FIELDS]
    checks += [(r(f"type_{n}") == "VOID", F.lit(f"field '{n}' is null")) for n in REQUIRED_FIELDS]
    kinds = [(n, "a string", lambda t: t == "STRING") for n in (*STRING_FIELDS, "event_time")]
    kinds += [(n, "an integer", _is_integer) for n in INTEGER_FIELDS]
    for name, kind, is_kind in [*kinds, ("unit_price", "a number", _is_number)]:
        t = r(f"type_{name}")
        checks.append((~is_kind(t), said(f"field '{name}' must be {kind}, got ", F.lower(t))))
    checks += [(typed(n) == "", F.lit(f"field '{n}' is empty")) for n in ID_FIELDS]
    for name in INTEGER_FIELDS:
        text = r(f"text_{name}")
        checks.append((typed(name).isNull(), said(f"{name} does not fit a 64-bit integer: ", text)))
        checks.append((typed(name) < 1, said(f"{name} must be >= 1, got ", text)))
    price = typed("price")
    price_text = price.cast("string")
    checks += [
        # JSON parsing reads an exponent form or more than 38 digits as a double: not exact
        (r("type_unit_price") == "DOUBLE", F.lit(INEXACT_PRICE)),
        (price.isNull(), said("unit_price is not an exact decimal: ", r("text_unit_price"))),
        (price < 0, said("unit_price must be >= 0, got ", price_text)),
        # on its text: the price as read is rounded to 10 decimals
        (
            ~r("text_unit_price").rlike(TWO_DECIMALS),
            said("unit_price has more than 2 decimals: ", r("text_unit_price")),
        ),
        (typed("unit_price").isNull(), said("unit_price does not fit decimal(12,2): ", price_text)),
        (~r("text_event_type").isin(*EVENT_TYPES), quoted("unknown event_type '", "event_type")),
        (~r("text_currency").isin(*CURRENCIES), quoted("unknown currency '", "currency")),
        (
            typed("time").isNull(),
            quoted("event_time is not an ISO-8601 instant with offset: '", "event_time"),
        ),
        (
            typed("event_time").isNull(),
            quoted("event_time is outside the years 1000 to 9999 in UTC: '", "event_time"),
        ),
    ]
    # the last word: whatever the rules above missed, a value that did not convert is invalid
    return checks + [
        (typed(n).isNull(), F.lit(f"field '{n}' does not convert to its column's type"))
        for n in REQUIRED_FIELDS
    ]


def _field_by_field(
    only: Column | None = None,
) -> tuple[list[dict[str, Column]], dict[str, Column], Column]:
    """The projections that add the field-by-field reads and typed fields of each record (of
    those where `only` holds, null elsewhere) to a frame with the raw `value` and its parsed JSON
    `_json`, each a projection of its own that the next one reads many times, so that Spark
    computes it once per record; and the typed fields and the reason (why the value is not a
    valid order event, or null when it is) as columns on the result."""

    def stage(name: str, columns: dict[str, Column]) -> dict[str, Column]:
        struct = F.struct(*[c.alias(k) for k, c in columns.items()])
        return {name: struct if only is None else F.when(only, struct)}

    r = F.col("_reads").getField
    t = F.col("_typed").getField
    stages = [stage("_reads", _reads(F.col("_json"))), stage("_typed", _typed(r))]
    checks = _checks(F.col("value"), F.col("_json"), r, t)
    reason = F.coalesce(*[F.when(c, message) for c, message in checks])
    return stages, {n: t(n) for n in REQUIRED_FIELDS}, reason


# The common case, converted at once: a JSON object with each required field once, of its JSON
# type, and nothing but whitespace after it, read in one streaming pass over the bytes
# (`flat_object`) into the fields' texts, which convert as the checks convert them; an event time
# in the plain ISO form is a cast too. Every other record takes the field-by-field checks, which
# name what is wrong, and only those records are parsed into a VARIANT. Both give the same row for
# the same record (see the unit tests): the shortcut refuses what it is not sure of (a 65-bit
# integer, an exponent, a surrogate, a byte order mark) and leaves it to the checks.
_KINDS = {n: "string" for n in (*STRING_FIELDS, "event_time")}
_KINDS |= {n: "integer" for n in INTEGER_FIELDS} | {"unit_price": "number"}
PLAIN_TIME = (
    r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.(\d{9}|\d{6}|\d{3}|\d{2}|\d))?(Z|[+-]\d{2}:\d{2})$"
)


def flat_texts(value: Column) -> Column:
    """The texts of the required fields of a raw `value` when it is a JSON object with each of
    them once, of its JSON type, and nothing follows it; else null (see `flat_object`)."""
    return flat_object(value, {n: _KINDS[n] for n in REQUIRED_FIELDS})


def plain_shape(texts: Column) -> Column:
    """The required fields as one struct (integers as bigint, the price as read, times as text)
    from their `flat_texts`, null where those are."""
    fields = {n: texts[i] for i, n in enumerate(REQUIRED_FIELDS)}
    fields |= {n: fields[n].try_cast("bigint") for n in INTEGER_FIELDS}
    fields["unit_price_text"] = fields["unit_price"]
    fields["unit_price"] = fields["unit_price"].try_cast(PRICE_READ)
    return F.when(texts.isNotNull(), F.struct(*[c.alias(n) for n, c in fields.items()]))


def plain_fields(value: Column, shape: Column) -> tuple[dict[str, Column], Column]:
    """The typed fields of a raw `value` of the common shape (`shape`: its `plain_shape`), and
    whether it is one and valid (false, never null, when it is not)."""
    f = {n: shape.getField(n) for n in REQUIRED_FIELDS}
    price = f["unit_price"]
    time = F.when(f["event_time"].rlike(PLAIN_TIME), F.try_to_timestamp(f["event_time"]))
    fields = {n: f[n] for n in (*STRING_FIELDS, *INTEGER_FIELDS)}
    fields["unit_price"] = price.try_cast(MONEY)
    fields["event_time"] = F.when(F.year(time).between(*YEARS), time)
    valid = [F.is_valid_utf8(value.cast("string")), shape.isNotNull()]
    valid += [c.isNotNull() for c in fields.values()] + [f[n] != "" for n in ID_FIELDS]
    valid += [f["seq"] >= 1, f["quantity"] >= 1, price >= 0]
    valid += [shape.getField("unit_price_text").rlike(TWO_DECIMALS)]
    valid += [f["event_type"].isin(*EVENT_TYPES), f["currency"].isin(*CURRENCIES)]
    return fields, F.coalesce(reduce(operator.and_, valid), F.lit(False))


def parse_events(raw: DataFrame) -> DataFrame:
    """Bronze rows with the event's typed fields and `reason` (null when the record is valid)."""
    return _applied(raw, *_parse())


@per_jvm
def _parse() -> tuple[list[dict[str, Column]], list[Column]]:
    """The projections of `parse_events`, in order, and its rows' columns. Each step is its own
    projection, which Spark keeps apart because the next one reads its columns many times:
    inlined, the shape was computed once per field, much slower
    (bench/RESULTS.md, "Figures behind code choices")."""
    plain, is_plain = plain_fields(F.col("value"), F.col("_shape"))
    stages = [
        {"_texts": flat_texts(F.col("value"))},
        {"_shape": plain_shape(F.col("_texts"))},
        {"_plain": is_plain} | {f"_p_{n}": c for n, c in plain.items()},
        # the JSON is parsed into a variant, which the checks read, for the records off the
        # common path only, once: alone, the reason expression parsed it again per check
        {"_json": F.when(~F.col("_plain"), _variant(F.col("value")))},
    ]
    checks, slow, reason = _field_by_field(only=~F.col("_plain"))
    typed = {n: F.when(F.col("_plain"), F.col(f"_p_{n}")).otherwise(c) for n, c in slow.items()}
    return stages + checks, _row_columns(typed, F.when(~F.col("_plain"), reason))


def _variant(value: Column) -> Column:
    return F.try_parse_json(value.cast("string"))


def parse_events_checked(raw: DataFrame) -> DataFrame:
    """`parse_events` through the field-by-field checks only, for every record: the reference
    the fast common case is tested against."""
    return _applied(raw, *_parse_checked())


@per_jvm
def _parse_checked() -> tuple[list[dict[str, Column]], list[Column]]:
    checks, typed, reason = _field_by_field()
    return [{"_json": _variant(F.col("value"))}, *checks], _row_columns(typed, reason)


def _applied(raw: DataFrame, stages: list[dict[str, Column]], rows: list[Column]) -> DataFrame:
    """`raw` through each projection of `stages` in turn, then `rows`."""
    return reduce(DataFrame.withColumns, stages, raw).select(*rows)


def _row_columns(typed: dict[str, Column], reason: Column) -> list[Column]:
    """The parsed rows' columns: the record's coordinates, key and value, its typed fields, its
    event date and `reason`."""
    return [
        *[F.col(c) for c in (*COORDINATES, "kafka_timestamp", "key", "value")],
        *[column.alias(name) for name, column in typed.items()],
        F.date_format(typed["event_time"], "yyyy-MM-dd").alias("event_date"),
        reason.alias("reason"),
    ]
