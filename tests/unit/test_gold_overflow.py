"""Gold's overflow arithmetic: value ranges, the cheap proof, the exact check, window rows."""

from __future__ import annotations

from datetime import datetime
from decimal import Decimal

from chispa import assert_df_equality
from pyspark.sql.types import DecimalType, LongType

from gold.overflow import Range, column_types, in_window, proof, ranges_after, unfit, window_starts

LONG_MAX = 2**63 - 1
TYPES = {"units": LongType(), "revenue": DecimalType(18, 2)}
PARTIALS = "window_start timestamp, window_end timestamp, category string, units bigint, "
PARTIALS += "revenue decimal(38,2)"
AT, END = datetime(2026, 11, 22, 10, 0), datetime(2026, 11, 22, 10, 1)


def test_a_range_covers_the_files_statistics_and_zero_and_none_without_them():
    assert Range.covering([3, 5], [9, 7]) == Range(0, 9)
    assert Range.covering([-2, 5], [-1, 7]) == Range(-2, 7)
    assert Range.covering([Decimal("-1.50")], [Decimal("-0.50")]) == Range(Decimal("-1.50"), 0)
    assert Range.covering([], []) == Range(0, 0)  # an empty table: new rows start at 0
    assert Range.covering([1, None], [2, 3]) is None  # a file without statistics: no bound


def test_a_range_widens_by_what_a_batch_adds_on_either_side():
    assert Range(-1, 10).plus(-3, 7) == Range(-4, 17)
    assert Range(-1, 10).plus(2, 7) == Range(-1, 17)  # positive additions lower no row
    assert Range(-1, 10).plus(-3, -2) == Range(-4, 10)
    assert Range(0, 5).plus(None, None) == Range(0, 5)  # a batch without values for the table


def test_window_starts_reach_back_one_window_from_the_oldest_events_minute():
    oldest, newest = datetime(2026, 11, 22, 10, 3, 42, 5), datetime(2026, 11, 22, 10, 9)
    assert window_starts(oldest, newest, 300) == (datetime(2026, 11, 22, 9, 58), newest)
    assert window_starts(oldest, newest, 60) == (datetime(2026, 11, 22, 10, 2), newest)


def test_column_types_read_a_ddl_schema(spark):  # Spark parses the DDL
    assert column_types("units bigint, revenue decimal(18,2)") == TYPES


def test_the_proof_holds_only_when_every_extreme_plus_the_tables_fits(spark):
    def fits(rows, ranges):
        got = proof(spark.createDataFrame(rows, PARTIALS), ["units", "revenue"], TYPES, ranges)
        return got.first().asDict()

    rows = [(AT, END, "tea", 1, Decimal("2.00")), (AT, END, "cup", -3, Decimal("9.50"))]
    small = {"units": Range(-1, 10), "revenue": Range(0, 5)}
    assert fits(rows, small) == {
        "fit": True,
        "lo units": -3,
        "hi units": 1,
        "lo revenue": Decimal("2.00"),
        "hi revenue": Decimal("9.50"),
    }
    assert ranges_after(small, fits(rows, small)) == {
        "units": Range(-4, 11),
        "revenue": Range(0, Decimal("14.50")),
    }
    assert fits(rows, {"units": Range(-1, LONG_MAX), "revenue": Range(0, 5)})["fit"] is False
    assert fits(rows, {"units": Range(-1, 0), "revenue": Range(0, Decimal("1e16"))})["fit"] is False
    overflowed = [(AT, END, "tea", None, Decimal("1.00"))]  # a sum beyond a long within the batch
    assert fits(overflowed, small)["fit"] is False
    assert fits([], small) == {"fit": True} | dict.fromkeys(
        ["lo units", "hi units", "lo revenue", "hi revenue"]
    )


def test_unfit_names_the_window_rows_that_would_not_fit_once_added(spark):
    keys = ["window_start", "window_end", "category"]
    partials = spark.createDataFrame(
        [
            (AT, END, "tea", 5, Decimal("1.00")),  # fits its table row
            (AT, END, "cup", 5, Decimal("1.00")),  # its table row is near a long's end
            (AT, END, "pot", 1, Decimal("9999999999999999.99")),  # a new row at the decimal's end
            (AT, END, "jar", None, Decimal("1.00")),  # too big within the batch
            (AT, END, "mug", 1, Decimal("1.00")),  # decimal(18,2) overflows once added
        ],
        PARTIALS,
    )
    table = spark.createDataFrame(
        [
            (AT, END, "tea", 7, Decimal("3.00")),
            (AT, END, "cup", LONG_MAX - 4, Decimal("0.00")),
            (AT, END, "mug", 0, Decimal("9999999999999999.99")),
        ],
        "window_start timestamp, window_end timestamp, category string, units bigint, "
        "revenue decimal(18,2)",
    )
    got = unfit(partials, table, keys, ["units", "revenue"], TYPES)
    expected = spark.createDataFrame(
        [(AT, END, "cup"), (AT, END, "jar"), (AT, END, "mug")],
        "window_start timestamp, window_end timestamp, category string",
    )
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)


def test_an_event_falls_in_a_window_row_by_time_and_group_nulls_included(spark):
    events = spark.createDataFrame(
        [
            ("e-1", datetime(2026, 11, 22, 10, 0), "tea"),
            ("e-2", datetime(2026, 11, 22, 10, 0, 59, 999999), "tea"),
            ("e-3", END, "tea"),  # the window's end is outside it
            ("e-4", datetime(2026, 11, 22, 10, 0, 30), "cup"),  # another group
            ("e-5", datetime(2026, 11, 22, 10, 0, 30), None),  # the null group's row
        ],
        "event_id string, event_time timestamp, category string",
    )
    rows = spark.createDataFrame(
        [(AT, END, "tea"), (AT, END, None)],
        "window_start timestamp, window_end timestamp, category string",
    )
    cond = in_window(["window_start", "window_end", "category"])
    got = events.alias("e").join(rows.alias("g"), cond).select("e.event_id")
    assert sorted(r[0] for r in got.collect()) == ["e-1", "e-2", "e-5"]
