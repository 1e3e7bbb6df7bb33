"""Gold's pure functions: window edges, sliding-window membership, unknown ids, exact money."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal

from chispa import assert_df_equality

from gold.dimensions import enrich
from gold.orders_by_country_5m import aggregate as orders_by_country_5m
from gold.overflow import Range
from gold.revenue_by_category_1m import aggregate as revenue_by_category_1m


def with_dimensions(events, products, customers):
    return enrich(events, {"products": products, "customers": customers})


EVENTS = (
    "event_id string, order_id string, seq bigint, event_type string, customer_id string, "
    "product_id string, quantity bigint, unit_price decimal(12,2), currency string, "
    "event_time timestamp"
)


def ev(spark, rows):
    return spark.createDataFrame(
        [
            (f"e-{i}", f"o-{i}", 1, t, c, p, q, Decimal(price), cur, at)
            for i, (t, c, p, q, price, cur, at) in enumerate(rows)
        ],
        EVENTS,
    )


def dims(spark):
    products = spark.createDataFrame(
        [("p-1", "Tea", "drinks", Decimal("0.10")), ("p-2", "Cup", "kitchen", Decimal("5.00"))],
        "product_id string, name string, category string, list_price decimal(12,2)",
    )
    customers = spark.createDataFrame(
        [("c-1", "Ann", "FR", "retail"), ("c-2", "Bo", "DE", "pro")],
        "customer_id string, name string, country string, segment string",
    )
    return products, customers


def test_tumbling_windows_put_an_event_on_the_edge_in_the_window_it_opens(spark):
    rows = [
        ("paid", "c-1", "p-1", 3, "0.10", "EUR", datetime(2026, 11, 22, 10, 0, 59, 999999)),
        ("paid", "c-1", "p-1", 1, "0.10", "EUR", datetime(2026, 11, 22, 10, 1, 0)),
        ("paid", "c-1", "p-2", 2, "5.00", "USD", datetime(2026, 11, 22, 10, 1, 30)),
        ("created", "c-1", "p-1", 9, "9.99", "EUR", datetime(2026, 11, 22, 10, 1, 30)),
    ]
    products, customers = dims(spark)
    got = revenue_by_category_1m(with_dimensions(ev(spark, rows), products, customers))
    expected = spark.createDataFrame(
        [
            (
                datetime(2026, 11, 22, 10, 0),
                datetime(2026, 11, 22, 10, 1),
                "drinks",
                "EUR",
                1,
                3,
                Decimal("0.30"),
            ),
            (
                datetime(2026, 11, 22, 10, 1),
                datetime(2026, 11, 22, 10, 2),
                "drinks",
                "EUR",
                1,
                1,
                Decimal("0.10"),
            ),
            (
                datetime(2026, 11, 22, 10, 1),
                datetime(2026, 11, 22, 10, 2),
                "kitchen",
                "USD",
                1,
                2,
                Decimal("10.00"),
            ),
        ],
        "window_start timestamp, window_end timestamp, category string, currency string, "
        "paid_orders bigint, units bigint, revenue decimal(18,2)",
    )
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)


def test_a_created_order_counts_in_all_five_sliding_windows_that_hold_it(spark):
    rows = [("created", "c-2", "p-1", 3, "0.10", "EUR", datetime(2026, 11, 22, 10, 7, 0))]
    products, customers = dims(spark)
    got = orders_by_country_5m(with_dimensions(ev(spark, rows), products, customers))
    starts = [datetime(2026, 11, 22, 10, m) for m in (3, 4, 5, 6, 7)]
    expected = spark.createDataFrame(
        [(s, s.replace(minute=s.minute + 5), "DE", 1, Decimal("0.30")) for s in starts],
        "window_start timestamp, window_end timestamp, country string, created_orders bigint, "
        "order_value decimal(18,2)",
    )
    assert_df_equality(got, expected, ignore_row_order=True, ignore_nullable=True)


def test_unknown_product_and_customer_count_under_unknown(spark):
    rows = [
        ("paid", "c-404", "p-404", 1, "1.00", "GBP", datetime(2026, 11, 22, 10, 0, 1)),
        ("created", "c-404", "p-1", 1, "1.00", "GBP", datetime(2026, 11, 22, 10, 0, 1)),
    ]
    products, customers = dims(spark)
    enriched = with_dimensions(ev(spark, rows), products, customers)
    assert enriched.count() == 2
    assert [r["category"] for r in revenue_by_category_1m(enriched).collect()] == ["unknown"]
    assert {r["country"] for r in orders_by_country_5m(enriched).collect()} == {"unknown"}


def test_money_sums_exactly_without_float_drift(spark):
    rows = [
        ("paid", "c-1", "p-1", 1, "0.10", "EUR", datetime(2026, 11, 22, 10, 0, s)) for s in range(3)
    ]
    rows += [
        ("paid", "c-1", "p-1", 1000000, "9999999999.99", "EUR", datetime(2026, 11, 22, 10, 0, 5))
    ]
    products, customers = dims(spark)
    got = revenue_by_category_1m(with_dimensions(ev(spark, rows), products, customers)).first()
    assert got["revenue"] == Decimal("0.30") + Decimal("9999999999990000.00")
    assert got["units"] == 1000003


def test_gold_proves_cheaply_that_no_window_row_overflows_only_when_none_can(
    spark, base_conf, tmp_path
):
    from gold import orders_by_country_5m as countries
    from gold import revenue_by_category_1m as revenue
    from pipelines.layers.gold import ensure_gold_tables, gold_sink, gold_tables

    conf = base_conf.updated({"storage.root": str(tmp_path)})
    tables = gold_tables(conf)
    ensure_gold_tables(spark, conf, tables)
    sink, at = gold_sink(conf, tables), datetime(2026, 11, 22, 10, 0)
    huge = 6 * 10**18  # two of them exceed a long
    # the same job gives the batch's newest and oldest event times
    events = spark.createDataFrame([(at + timedelta(minutes=3),), (at,)], "event_time timestamp")

    def fit(units, order_value="1.00"):
        after, stats = sink._surely_fit(
            events,
            {
                "gold/revenue_by_category_1m": spark.createDataFrame(
                    [(at, at, "drinks", "EUR", 1, u, Decimal("1.00")) for u in units],
                    revenue.TABLE.schema,
                ),
                "gold/orders_by_country_5m": spark.createDataFrame(
                    [(at, at, "FR", 1, None if order_value is None else Decimal(order_value))],
                    countries.TABLE.schema,
                ),
            },
        )
        assert stats == (at + timedelta(minutes=3), at)
        return after is not None

    assert [fit([]), fit([huge]), fit([1, huge]), fit([1], None)] == [True, True, True, False]
    # what it proves of the table once the batch is added: each value column's range, a bound
    units, _ = sink._surely_fit(
        events,
        {
            "gold/revenue_by_category_1m": spark.createDataFrame(
                [(at, at, "drinks", "EUR", 1, u, Decimal("1.00")) for u in (-3, 7)],
                revenue.TABLE.schema,
            ),
            "gold/orders_by_country_5m": spark.createDataFrame(
                [(at, at, "FR", 1, Decimal("2.50"))], countries.TABLE.schema
            ),
        },
        {
            "gold/revenue_by_category_1m": {
                "paid_orders": Range(0, 4),
                "units": Range(-1, 10),
                "revenue": Range(0, 5),
            },
            "gold/orders_by_country_5m": {
                "created_orders": Range(0, 0),
                "order_value": Range(0, 0),
            },
        },
    )
    assert units["gold/revenue_by_category_1m"]["units"] == Range(-4, 17)
    assert units["gold/orders_by_country_5m"]["order_value"] == Range(0, Decimal("2.50"))
    table_row = [(at, at, "kitchen", "EUR", 1, huge, Decimal("1.00"))]
    revenue_path = tables.aggregates["gold/revenue_by_category_1m"]
    spark.createDataFrame(table_row, revenue.TABLE.schema).write.format("delta").mode(
        "append"
    ).save(revenue_path)
    # the table's row is in another group: the proof, table-wide, fails; the exact check decides
    assert [fit([1]), fit([huge]), fit([1], "9999999999999999.99")] == [True, False, True]
