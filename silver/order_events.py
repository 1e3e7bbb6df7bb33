"""Silver order events: raw Kafka values parsed, typed and validated against the spec.

Parsing goes through Spark's VARIANT type, which keeps each JSON value's own type (string,
integer, exact decimal, null) so that every rule of the spec can be checked exactly, and money
goes from JSON text to decimal(12,2) without ever being a float.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DecimalType

from bronze.ddl import column_names
from bronze.raw_records import COORDINATES

EVENT_TYPES = ("created", "paid", "shipped", "cancelled")
CURRENCIES = ("EUR", "USD", "GBP")
MONEY = DecimalType(12, 2)
MAX_MONEY = 9_999_999_999.99
# ISO-8601 instants with an offset or Z, with 0 to 9 fraction digits.
EVENT_TIME_FORMAT = "yyyy-MM-dd'T'HH:mm:ss[.SSSSSSSSS][.SSSSSS][.SSS][.SS][.S]XXX"

STRING_FIELDS = ("event_id", "order_id", "event_type", "customer_id", "product_id", "currency")
INTEGER_FIELDS = ("seq", "quantity")
REQUIRED_FIELDS = (
    "event_id",
    "order_id",
    "seq",
    "event_type",
    "customer_id",
    "product_id",
    "quantity",
    "unit_price",
    "currency",
    "event_time",
)
SCHEMA = (
    "event_id string NOT NULL, order_id string NOT NULL, seq bigint NOT NULL, "
    "event_type string NOT NULL, customer_id string NOT NULL, product_id string NOT NULL, "
    "quantity bigint NOT NULL, unit_price decimal(12,2) NOT NULL, currency string NOT NULL, "
    "event_time timestamp NOT NULL, event_date string NOT NULL"
)
PARTITIONED_BY = ("event_date",)
KEY = "event_id"  # an event is stored once however often it is delivered
EXPECTATIONS = (
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
)
EVENT_COLUMNS = column_names(SCHEMA)


def _field(v: Column, name: str) -> Column:
    return F.variant_get(v, f"$.{name}", "variant")


def _json_type(v: Column, name: str) -> Column:
    return F.schema_of_variant(_field(v, name))


def _is_integer(t: Column) -> Column:
    return t.isin("BIGINT", "INT", "SMALLINT", "TINYINT") | t.rlike(r"^DECIMAL\(\d+,0\)$")


def _is_number(t: Column) -> Column:
    return _is_integer(t) | t.startswith("DECIMAL") | (t == "DOUBLE")


def invalid_reason(value: Column, parsed: Column | None = None) -> Column:
    """Why a raw Kafka value is not a valid order event, or null when it is valid.

    The first failing check wins, in the order a person would look: encoding, JSON, object,
    presence, types, then the spec's rules. `parsed` is `try_parse_json` of the value when the
    caller has it as a column already: the checks then read it instead of parsing again.
    """
    return F.coalesce(*[F.when(c, message) for c, message in _checks(value, parsed)])


def _checks(value: Column, parsed: Column | None) -> list[tuple[Column, Column]]:
    text = value.cast("string")
    v = F.try_parse_json(text) if parsed is None else parsed
    top = F.schema_of_variant(v)
    checks: list[tuple[Column, Column]] = [
        (value.isNull(), F.lit("value is null")),
        (~F.is_valid_utf8(text), F.lit("value is not valid UTF-8")),
        (v.isNull(), F.lit("value is not JSON")),
        (
            ~top.startswith("OBJECT<"),
            F.concat(F.lit("value is not a JSON object but "), F.lower(top)),
        ),
    ]
    for name in REQUIRED_FIELDS:
        checks.append((_field(v, name).isNull(), F.lit(f"missing field '{name}'")))
    for name in REQUIRED_FIELDS:
        checks.append((F.is_variant_null(_field(v, name)), F.lit(f"field '{name}' is null")))
    for name in (*STRING_FIELDS, "event_time"):
        t = _json_type(v, name)
        checks.append(
            (t != "STRING", F.concat(F.lit(f"field '{name}' must be a string, got "), F.lower(t)))
        )
    for name in INTEGER_FIELDS:
        t = _json_type(v, name)
        checks.append(
            (
                ~_is_integer(t),
                F.concat(F.lit(f"field '{name}' must be an integer, got "), F.lower(t)),
            )
        )
    price_type = _json_type(v, "unit_price")
    checks.append(
        (
            ~_is_number(price_type),
            F.concat(F.lit("field 'unit_price' must be a number, got "), F.lower(price_type)),
        )
    )
    price = _exact_price(v)
    checks += [
        (
            F.try_variant_get(v, "$.seq", "decimal(38,0)") < 1,
            F.concat(F.lit("seq must be >= 1, got "), F.try_variant_get(v, "$.seq", "string")),
        ),
        (
            F.try_variant_get(v, "$.quantity", "decimal(38,0)") < 1,
            F.concat(
                F.lit("quantity must be >= 1, got "), F.try_variant_get(v, "$.quantity", "string")
            ),
        ),
        (
            price.isNull(),
            F.concat(
                F.lit("unit_price is not an exact decimal: "),
                F.try_variant_get(v, "$.unit_price", "string"),
            ),
        ),
        (price < 0, F.concat(F.lit("unit_price must be >= 0, got "), price.cast("string"))),
        (
            price != F.round(price, 2),
            F.concat(F.lit("unit_price has more than 2 decimals: "), price.cast("string")),
        ),
        (
            price >= 10**10,
            F.concat(F.lit("unit_price does not fit decimal(12,2): "), price.cast("string")),
        ),
        (
            ~F.try_variant_get(v, "$.event_type", "string").isin(*EVENT_TYPES),
            F.concat(
                F.lit("unknown event_type '"),
                F.try_variant_get(v, "$.event_type", "string"),
                F.lit("'"),
            ),
        ),
        (
            ~F.try_variant_get(v, "$.currency", "string").isin(*CURRENCIES),
            F.concat(
                F.lit("unknown currency '"),
                F.try_variant_get(v, "$.currency", "string"),
                F.lit("'"),
            ),
        ),
        (
            _event_time(v).isNull(),
            F.concat(
                F.lit("event_time is not an ISO-8601 instant with offset: '"),
                F.try_variant_get(v, "$.event_time", "string"),
                F.lit("'"),
            ),
        ),
    ]
    return checks


def _exact_price(v: Column) -> Column:
    """unit_price as an exact decimal from its JSON text (an exponent form too), never a float."""
    return F.try_variant_get(v, "$.unit_price", "string").try_cast(DecimalType(38, 10))


def _event_time(v: Column) -> Column:
    return F.try_to_timestamp(
        F.try_variant_get(v, "$.event_time", "string"), F.lit(EVENT_TIME_FORMAT)
    )


def parse_events(raw: DataFrame) -> DataFrame:
    """Bronze rows with the event's typed fields and `reason` (null when the record is valid)."""
    # The JSON is parsed once into its own column, which the dozens of checks read: alone, the
    # reason expression parsed it again per check (25 s instead of 7 s for 300,000 records).
    with_json = raw.withColumn("_json", F.try_parse_json(F.col("value").cast("string")))
    v = F.col("_json")
    event_time = _event_time(v)
    return with_json.select(
        *COORDINATES,
        "kafka_timestamp",
        "key",
        "value",
        *[F.try_variant_get(v, f"$.{name}", "string").alias(name) for name in STRING_FIELDS],
        *[F.try_variant_get(v, f"$.{name}", "bigint").alias(name) for name in INTEGER_FIELDS],
        _exact_price(v).try_cast(MONEY).alias("unit_price"),
        event_time.alias("event_time"),
        F.date_format(event_time, "yyyy-MM-dd").alias("event_date"),
        invalid_reason(F.col("value"), v).alias("reason"),
    )
