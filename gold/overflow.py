"""Whether a batch's partial aggregates, added to a gold table's window rows, fit their columns:
a cheap `proof` from value ranges, else the exact check `unfit` (docs/guarantees.md, "Values that
would overflow").
"""

from __future__ import annotations

import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from functools import reduce
from typing import cast

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import DataType, StructType

Number = int | Decimal


@dataclass(frozen=True)
class Range:
    """A bound on a value column: every row's value lies in [lo, hi], and so does 0 (a new row)."""

    lo: Number
    hi: Number

    @staticmethod
    def covering(lows: Sequence[Number | None], highs: Sequence[Number | None]) -> Range | None:
        """The range of files' (min, max) statistics, widened to 0; None if a file has none."""
        found_lows, found_highs = (
            [v for v in lows if v is not None],
            [v for v in highs if v is not None],
        )
        if len(found_lows) < len(lows) or len(found_highs) < len(highs):
            return None
        return Range(min([0, *found_lows]), max([0, *found_highs]))

    def plus(self, lo: Number | None, hi: Number | None) -> Range:
        """The bound once values in [lo, hi] (None: no value) are added to rows within this one."""
        return Range(self.lo + min(0, lo or 0), self.hi + max(0, hi or 0))


TableRanges = dict[str, Range]  # value column → its range over one table


def column_types(schema: str) -> dict[str, DataType]:
    """Each column's type in a DDL schema."""
    return {f.name: f.dataType for f in cast(StructType, StructType.fromDDL(schema)).fields}


def proof(
    partials: DataFrame, values: Sequence[str], types: Mapping[str, DataType], ranges: TableRanges
) -> DataFrame:
    """One row over a batch's partial aggregates: `fit` is true when every row surely fits (no
    value null, each column's extremes plus the table's fit its type); `lo v`, `hi v` are each
    value column's extremes in the batch."""
    fits, extremes = [], []
    for v in values:
        fits.append(F.count(v) == F.count("*"))
        fits += [
            F.try_add(F.coalesce(agg(v), F.lit(0)), F.lit(bound)).try_cast(types[v]).isNotNull()
            for agg, bound in ((F.min, ranges[v].lo), (F.max, ranges[v].hi))
        ]
        extremes += [F.min(v).alias(f"lo {v}"), F.max(v).alias(f"hi {v}")]
    return partials.agg(reduce(operator.and_, fits).alias("fit"), *extremes)


def ranges_after(ranges: TableRanges, row: Mapping[str, object]) -> dict[str, Range]:
    """The table's ranges once a batch is added, from its `proof` row."""
    return {v: r.plus(row[f"lo {v}"], row[f"hi {v}"]) for v, r in ranges.items()}  # type: ignore[arg-type]


def window_starts(
    oldest: datetime, newest: datetime, window_seconds: int
) -> tuple[datetime, datetime]:
    """The window starts events from `oldest` to `newest` can fall in (windows start on minutes)."""
    return oldest.replace(second=0, microsecond=0) - timedelta(seconds=window_seconds), newest


def unfit(
    partials: DataFrame,
    table: DataFrame,
    keys: Sequence[str],
    values: Sequence[str],
    types: Mapping[str, DataType],
) -> DataFrame:
    """The keys of window rows in `partials` that do not fit: a value null (too big within the
    batch), or beyond its column's type once added to the table's row."""
    both = partials.alias("s").join(table.alias("t"), list(keys), "left")
    fits = [
        F.try_add(F.col(f"s.{v}"), F.coalesce(F.col(f"t.{v}"), F.lit(0)))
        .try_cast(types[v])
        .isNotNull()
        for v in values
    ]
    return both.where(~reduce(operator.and_, fits)).select(*keys)


def in_window(keys: Sequence[str]) -> Column:
    """An event `e` falls in window row `g`: by time, and by group (`keys` after the window's)."""
    e_time = F.col("e.event_time")
    cond = (e_time >= F.col("g.window_start")) & (e_time < F.col("g.window_end"))
    for k in keys[2:]:
        cond = cond & F.col(f"e.{k}").eqNullSafe(F.col(f"g.{k}"))
    return cond
