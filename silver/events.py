"""What silver does with any stream's parsed events: the clock bound on their event time, dedupe
on the natural key, and the keys of a batch that prune its dedupe check. A stream's events module
supplies `parse_events`, `KEY` and its declaration; its state module `current_state`, `is_newer`
and `KEY` (see ARCHITECTURE.md)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from functools import wraps
from typing import Any, TypeVar

from pyspark import SparkContext
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from bronze.raw_records import COORDINATES

T = TypeVar("T")


def per_jvm(build: Callable[[], T]) -> Callable[[], T]:
    """`build` (which returns columns) run once per JVM: a column is a JVM object that any frame
    may use, and a parse of a few hundred columns, each built through py4j, costs seconds per
    micro-batch in a driver that has just started."""
    built: list[tuple[object, T]] = []  # (the gateway the columns live in, the columns)

    @wraps(build)
    def columns() -> T:
        gateway = SparkContext._gateway
        if not built or built[0][0] is not gateway:
            built[:] = [(gateway, build())]
        return built[0][1]

    return columns


def with_clock_bound(parsed: DataFrame, max_skew_minutes: int) -> DataFrame:
    """`parsed` with a reason on each valid event whose `event_time` is more than
    `max_skew_minutes` ahead of its record's `kafka_timestamp` (none where that is null): one
    producer with a broken clock must not make every later event late."""
    event_time, sent = F.col("event_time"), F.col("kafka_timestamp")
    ahead = event_time > sent + F.lit(timedelta(minutes=max_skew_minutes))
    skew = f"{max_skew_minutes} minute{'' if max_skew_minutes == 1 else 's'}"
    reason = F.concat(
        F.lit("event_time "),
        _iso_instant(event_time),
        F.lit(" is ahead of the record's Kafka timestamp "),
        _iso_instant(sent),
        F.lit(f" by more than the allowed clock skew of {skew}: the producer's clock is wrong"),
    )
    return parsed.withColumn("reason", F.coalesce(F.col("reason"), F.when(ahead, reason)))


def _iso_instant(t: Column) -> Column:
    """`t` as ISO-8601 text with its offset (`Z` in a UTC session), fraction digits as needed:
    2026-11-26T15:00:00Z, 2026-11-26T15:00:00.123Z."""
    seconds = F.regexp_replace(F.date_format(t, "yyyy-MM-dd'T'HH:mm:ss.SSSSSS"), r"\.?0+$", "")
    return F.concat(seconds, F.date_format(t, "XXX"))


# A SQL function of the project's JVM classes, which every session built by pipelines has (see
# `pipelines/resources/java/lakehouse/json/FlatObject.java`).
FLAT_OBJECT = "lakehouse_flat_object"
FLAT_KINDS = ("string", "integer", "number")


def flat_object(value: Column, fields: Mapping[str, str]) -> Column:
    """The texts of `fields` (name -> kind: string, integer or number) in a raw JSON `value`
    (bytes), as an array in their order, when the value is one JSON object that has those fields,
    each once and of its kind (an integer of at most 64 bits; a number of at most 38 digits
    without exponent), and nothing but whitespace after it; other fields may be there. Else null.
    One streaming pass over the bytes: a fast path for the common shape, never a judge of what is
    valid; it refuses (null) whatever it is not sure Spark reads the same way."""
    unknown = {k for k in fields.values() if k not in FLAT_KINDS}
    if unknown:
        raise ValueError(f"flat_object: kinds {sorted(unknown)} are not among {FLAT_KINDS}")
    spec = ",".join(f"{name}:{kind}" for name, kind in fields.items())
    return F.call_function(FLAT_OBJECT, value, F.lit(spec))


def dedupe_events(parsed: DataFrame, key: str, columns: list[str]) -> DataFrame:
    """Valid events, one row per `key`: the first delivery by Kafka coordinates wins."""
    first = F.min_by(F.struct(*columns), F.struct(*COORDINATES))
    return parsed.where(F.col("reason").isNull()).groupBy(key).agg(first.alias("e")).select("e.*")


def refused_reason(
    table: str,
    not_null: Iterable[str],
    checks: Mapping[str, str],
    evaluate: Callable[[str], Column] = F.expr,
) -> Column:
    """Why `table` would refuse a typed row, or null: the first of its NOT NULL columns the row
    leaves null, or of its CHECK constraints (name -> SQL expression, as Delta keeps them) the
    row breaks. Delta refuses a row whose check is null as one whose check is false; `evaluate`
    makes a check's column, and one that is null where the check fails (a cast ANSI refuses)
    refuses the rows on which Delta's write would fail too."""
    refusals = [
        F.when(F.col(c).isNull(), f"field '{c}' is null, which {table} does not allow")
        for c in not_null
    ]
    refusals += [
        F.when(~F.coalesce(evaluate(e), F.lit(False)), f"breaks constraint {n} ({e}) of {table}")
        for n, e in checks.items()
    ]
    return F.coalesce(*refusals, F.lit(None).cast("string"))


def batch_keys(parsed: DataFrame, key: str, partition: str | None) -> DataFrame:
    """One row about a parsed batch: how many records are invalid, and the partitions and key
    range of its valid events, to prune the dedupe check's read of the events table."""
    valid = F.col("reason").isNull()
    return parsed.agg(
        F.count_if(~valid).alias("invalid_records"),
        F.count_if(valid).alias("valid_records"),
        F.sort_array(F.collect_set(F.when(valid, F.col(partition) if partition else None))).alias(
            "partitions"
        ),
        F.min(F.when(valid, F.col(key))).alias("min_key"),
        F.max(F.when(valid, F.col(key))).alias("max_key"),
    )


LONGEST_BOUND = 100  # characters of a string key a key range keeps (Delta's statistics: 32)


def key_range(column: Column, lo: Any = None, hi: Any = None) -> Column | None:
    """`column` within the batch's key range [lo, hi], or None for no range.

    The literal range lets Delta skip every file whose min/max statistics fall outside it, so a
    write reads what the batch can touch. Keys that grow with time (sequences, ULIDs, snowflake
    ids, the reference stream's ids) keep that range narrow. A huge key would be copied into the
    plan and into the commit's record of the condition: a string lower bound is cut to its first
    LONGEST_BOUND characters (still a lower bound), and a longer upper bound is left out.
    """
    if lo is None or hi is None:
        return None
    condition = column >= F.lit(lo[:LONGEST_BOUND] if isinstance(lo, str) else lo)
    return (
        condition if isinstance(hi, str) and len(hi) > LONGEST_BOUND else condition & (column <= hi)
    )


def key_condition(
    key: str, lo: Any = None, hi: Any = None, target: str = "t", source: str = "s"
) -> Column:
    """MERGE condition on the natural key, bounded by a key range (`key_range`) if given."""
    t = F.col(f"{target}.{key}")
    condition = t == F.col(f"{source}.{key}")
    bounded = key_range(t, lo, hi)
    return condition if bounded is None else condition & bounded


def stored_bounds(
    key: str,
    partition: str | None,
    partitions: list[Any],
    lo: Any = None,
    hi: Any = None,
    table: str | None = None,
) -> Column | None:
    """What of the stored events a batch can match: its partitions (the event's own partition,
    e.g. its date) and its key range, on the columns of `table` (an alias) or unqualified; None
    if nothing bounds it."""
    col = (lambda c: F.col(f"{table}.{c}")) if table else F.col
    bounds = key_range(col(key), lo, hi)
    if partition:
        pruned = col(partition).isin(*partitions)
        bounds = pruned if bounds is None else pruned & bounds
    return bounds


def new_events(
    events: DataFrame,
    stored: DataFrame,
    key: str,
    partition: str | None,
    partitions: list[Any],
    lo: Any = None,
    hi: Any = None,
) -> DataFrame:
    """The `events` (one per key) that `stored` does not hold yet: an event is stored once
    however late its re-delivery comes. `stored` is read only within the batch's `stored_bounds`:
    the check costs what the batch touches, not what the table holds."""
    on = [key, partition] if partition else [key]
    bounds = stored_bounds(key, partition, partitions, lo, hi)
    if bounds is not None:
        stored = stored.where(bounds)
    return events.join(stored.select(*on), on, "left_anti")
