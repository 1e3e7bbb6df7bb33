"""Silver against a real broker and real Delta tables, compared with a plain-Python oracle."""

from __future__ import annotations

import json
import os
import re
from dataclasses import replace
from datetime import UTC, datetime
from decimal import Decimal

import pytest
from delta.tables import DeltaTable

from pipelines.config import LakehouseConf
from pipelines.layers.bronze import bronze_tables, run_bronze
from pipelines.layers.silver import (
    UpsertSilver,
    ensure_silver_tables,
    run_silver,
    silver_tables,
)
from pipelines.reference.orders_stream import (
    StreamOptions,
    StreamPlan,
    StreamRecord,
    generate_orders_stream,
)
from pipelines.reference.producer import ProduceReport, produce_plan
from silver.order_events import EVENT_COLUMNS
from silver.orders import ORDER_COLUMNS
from tests import helpers
from tests.conftest import subprocess_env

pytestmark = pytest.mark.integration

TWISTS = dict(
    redelivery_rate=0.15,
    out_of_order_rate=0.3,
    late_rate=0.03,
    invalid_rate=0.05,
    null_key_rate=0.05,
    extra_field_rate=0.1,
)


REASONS = {
    "not_json": re.compile(r"^value is not JSON$"),
    "not_object": re.compile(r"^value is not a JSON object but (array|string|bigint|void)"),
    "missing_field": re.compile(r"^missing field '\w+'$"),
    "null_field": re.compile(r"^field '\w+' is null$"),
    "wrong_type": re.compile(
        r"^field '(quantity|seq)' must be an integer, got (string|boolean|decimal)"
    ),
    "rule_broken": re.compile(r"^(seq must be >= 1|quantity must be >= 1|unit_price must be >= 0)"),
    "unknown_event_type": re.compile(r"^unknown event_type 'refunded'$"),
    "unknown_currency": re.compile(r"^unknown currency 'JPY'$"),
    "too_many_decimals": re.compile(r"^unit_price has more than 2 decimals: 12\.345"),
    "bad_event_time": re.compile(r"^event_time is not an ISO-8601 instant"),
    "invalid_utf8": re.compile(r"^value is not valid UTF-8$"),
    "trailing_content": re.compile(
        r"^value is a JSON object followed by more than whitespace: the contract allows exactly "
        r"one JSON object per record$"
    ),
    "future_event_time": re.compile(
        r"^event_time 21\d\d-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,3})?Z is ahead of the record's Kafka "
        r"timestamp 20\d\d-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d{1,3})?Z by more than the allowed clock "
        r"skew of 5 minutes: the producer's clock is wrong$"
    ),
}


def produce(conf: LakehouseConf, orders: int, seed: int) -> ProduceReport:
    return helpers.produce(conf, orders, seed, **TWISTS)


def _instant(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).astimezone(UTC).replace(tzinfo=None)


def _iso_z(t: datetime) -> str:
    """A naive UTC time as ISO-8601 with `Z`, with the fraction digits it needs."""
    text = t.isoformat()
    return (text.rstrip("0").rstrip(".") if "." in text else text) + "Z"


def oracle(*reports: ProduceReport) -> dict:
    """Expected silver tables, computed in plain Python from what the producer sent."""
    events: dict[str, tuple] = {}
    quarantine: dict[tuple[int, int], tuple[str, bytes | None, bytes]] = {}
    valid_records = 0
    for rep in reports:
        for d in rep.delivered:
            if d.kind not in ("event", "redelivery"):
                quarantine[(d.partition, d.offset)] = (d.kind, d.key, d.value)
                continue
            valid_records += 1
            e = json.loads(d.value, parse_float=Decimal)
            t = _instant(e["event_time"])
            events.setdefault(
                e["event_id"],
                (
                    e["event_id"],
                    e["order_id"],
                    e["seq"],
                    e["event_type"],
                    e["customer_id"],
                    e["product_id"],
                    e["quantity"],
                    Decimal(e["unit_price"]).quantize(Decimal("0.01")),
                    e["currency"],
                    t,
                    t.strftime("%Y-%m-%d"),
                ),
            )
    orders: dict[str, tuple] = {}
    for ev in events.values():
        o = (ev[1], ev[0], ev[2], ev[3], ev[4], ev[5], ev[6], ev[7], ev[8], ev[9])
        cur = orders.get(ev[1])
        if cur is None or (o[2], o[9], o[1]) > (cur[2], cur[9], cur[1]):
            orders[ev[1]] = o
    return {
        "events": events,
        "orders": orders,
        "quarantine": quarantine,
        "valid_records": valid_records,
    }


def table(spark, path: str, columns: list[str]) -> list[tuple]:
    return sorted(
        tuple(r) for r in spark.read.format("delta").load(path).select(*columns).collect()
    )


def assert_silver_matches(spark, conf: LakehouseConf, expected: dict) -> None:
    stream = conf.streams["orders"]
    tables = silver_tables(conf, stream)
    assert table(spark, tables.events, EVENT_COLUMNS) == sorted(expected["events"].values())
    assert table(spark, tables.state, ORDER_COLUMNS) == sorted(expected["orders"].values())
    q = spark.read.format("delta").load(tables.quarantine).collect()
    assert len(q) == len(expected["quarantine"])
    got = {
        (r["partition"], r["offset"]): (
            None if r["key"] is None else bytes(r["key"]),
            bytes(r["value"]),
        )
        for r in q
    }
    assert got == {k: (key, value) for k, (_, key, value) in expected["quarantine"].items()}
    for r in q:  # the reason says what is wrong, for every kind the producer made
        kind = expected["quarantine"][(r["partition"], r["offset"])][0]
        assert REASONS[kind].search(r["reason"]), (kind, r["reason"])
    # topic and Kafka timestamp are those of the bronze row at the same coordinates
    raw = spark.read.format("delta").load(bronze_tables(conf, stream).raw)
    coords = ["topic", "partition", "offset", "kafka_timestamp"]
    assert sorted(
        tuple(r)
        for r in raw.join(
            spark.read.format("delta").load(tables.quarantine).select("partition", "offset"),
            ["partition", "offset"],
        )
        .select(*coords)
        .collect()
    ) == sorted((r["topic"], r["partition"], r["offset"], r["kafka_timestamp"]) for r in q)
    # the contract's accounting identity, exactly
    bronze = spark.read.format("delta").load(bronze_tables(conf, stream).raw).count()
    redeliveries = expected["valid_records"] - len(expected["events"])
    assert bronze == len(q) + expected["valid_records"]
    assert expected["valid_records"] == len(expected["events"]) + redeliveries


def test_silver_equals_the_oracle_with_every_twist(spark, lake):
    report = produce(lake, orders=600, seed=71)
    assert report.counts["redeliveries"] and report.counts["invalid_records"]
    run_bronze(spark, lake, once=True, progress=False)
    run_silver(spark, lake, once=True, progress=False)
    expected = oracle(report)
    assert_silver_matches(spark, lake, expected)
    reasons = {
        r["reason"].split(":")[0].split(" '")[0]
        for r in spark.read.format("delta")
        .load(silver_tables(lake, lake.streams["orders"]).quarantine)
        .collect()
    }
    assert len(reasons) >= 8  # the kinds are told apart

    # more data later, re-deliveries of old events among it: still exact
    more = produce(lake, orders=200, seed=72)
    replay = generate_orders_stream(StreamOptions(orders=600, seed=71, **TWISTS))
    replay.records = [r for r in replay.records if r.kind == "event"][:100]
    again = produce_plan(lake, replay, lake.streams["orders"].topic)
    again.counts = {}
    again.delivered = [replace(d, kind="redelivery") for d in again.delivered]
    run_bronze(spark, lake, once=True, progress=False)
    run_silver(spark, lake, once=True, progress=False)
    assert_silver_matches(spark, lake, oracle(report, more, again))


def test_a_replayed_micro_batch_changes_no_table_version(spark, lake):
    produce(lake, orders=150, seed=73)
    run_bronze(spark, lake, once=True, progress=False)
    run_silver(spark, lake, once=True, progress=False)
    tables = silver_tables(lake, lake.streams["orders"])

    def versions() -> list[int]:
        return [
            DeltaTable.forPath(spark, p).history(1).first()["version"]
            for p in (tables.events, tables.state, tables.quarantine)
        ]

    before_versions = versions()
    before = [table(spark, tables.events, EVENT_COLUMNS), table(spark, tables.state, ORDER_COLUMNS)]
    sink = UpsertSilver(tables)
    batch = spark.read.format("delta").load(tables.bronze)
    sink(batch, 0)
    sink(batch, 0)
    assert versions() == before_versions
    assert [
        table(spark, tables.events, EVENT_COLUMNS),
        table(spark, tables.state, ORDER_COLUMNS),
    ] == before
    assert spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None
    # a new batch id does run, and its MERGEs still leave the content unchanged
    sink(batch, 10_000)
    assert [
        table(spark, tables.events, EVENT_COLUMNS),
        table(spark, tables.state, ORDER_COLUMNS),
    ] == before


def test_hostile_records_never_stop_silver_and_each_lands_where_the_contract_says(spark, lake):
    from pipelines.streaming.tables import constraints as constraints_of
    from tests.hostile import edge_values, hostile_values, oracle_row

    seed = int(os.environ.get("LAKEHOUSE_TEST_SEED", "1357"))
    # some event times are ahead of `now`, and every record is sent after it
    now, skew = datetime.now(UTC), lake.silver.max_clock_skew_minutes
    values = hostile_values(seed, 3000, now) + edge_values(seed, now, skew)
    records = [
        StreamRecord(None if i % 7 == 0 else f"k-{i}".encode(), v, i % 4, "hostile")
        for i, v in enumerate(values)
    ]
    report = produce_plan(lake, StreamPlan(StreamOptions(), records), lake.streams["orders"].topic)
    run_bronze(spark, lake, once=True, progress=False)
    # constraints an operator added: silver quarantines the records whose rows they refuse
    tables = silver_tables(lake, lake.streams["orders"])
    ensure_silver_tables(spark, lake, tables)
    # the last one fails on every USD row, where ANSI refuses to read the order id as a number
    # (no valid id here reads as one): Delta's write would fail on such a row. since_2000 refuses
    # the valid events of years 1000 to 1999 (the clock bound already refuses those of year 9999)
    usd = "currency <> 'USD' OR CAST(order_id AS BIGINT) < 0"
    events_name, state_name, _ = tables.names
    path = {events_name: tables.events, state_name: tables.state}
    constraints = [
        (events_name, "quantity_cap", "quantity < 1000000"),
        (state_name, "since_2000", "updated_at >= '2000-01-01'"),
        (state_name, "usd_by_number", usd),
    ]
    for table_name, name, check in constraints:
        spark.sql(f"ALTER TABLE delta.`{path[table_name]}` ADD CONSTRAINT {name} CHECK ({check})")
    run_silver(spark, lake, once=True, progress=False)

    candidates: dict[str, set[tuple]] = {}  # event_id -> the rows its valid records make
    invalid, refused = set(), {}  # refused: coordinates -> the reasons it may be given
    kept = {n: constraints_of(spark, path[t])[1][n] for t, n, _ in constraints}  # as Delta keeps it
    breaks = {n: f"breaks constraint {n} ({kept[n]}) of {t}" for t, n, _ in constraints}
    bronze = spark.read.format("delta").load(tables.bronze).collect()
    sent = {(r["partition"], r["offset"]): r["kafka_timestamp"] for r in bronze}
    for d in report.delivered:
        if (row := oracle_row(d.value, sent[(d.partition, d.offset)], skew)) is None:
            invalid.add((d.partition, d.offset))
        elif row[6] >= 1_000_000:
            refused[(d.partition, d.offset)] = {breaks["quantity_cap"]}
        elif row[9].year < 2000 or row[8] == "USD":  # a table's checks: in no promised order
            names = ["since_2000"] * (row[9].year < 2000) + ["usd_by_number"] * (row[8] == "USD")
            refused[(d.partition, d.offset)] = {breaks[n] for n in names}
        else:
            candidates.setdefault(row[0], set()).add(row)
    for name in ("since_2000", "usd_by_number"):  # the data exercises them
        assert any(breaks[name] in r for r in refused.values()), name
    assert {(r["partition"], r["offset"]): (r["key"], r["value"]) for r in bronze} == {
        (d.partition, d.offset): (d.key, d.value) for d in report.delivered
    }  # byte for byte, records of 9 MB too
    events = table(spark, tables.events, EVENT_COLUMNS)
    # one row per event_id; one sent with different contents keeps one of them (the contract
    # says an event_id is sent with the same content; which one wins is not promised)
    assert sorted(e[0] for e in events) == sorted(candidates)
    assert all(e in candidates[e[0]] for e in events)
    quarantine = spark.read.format("delta").load(tables.quarantine).collect()
    reasons = {(r["partition"], r["offset"]): r["reason"] for r in quarantine}
    assert len(quarantine) == len(reasons) == len(invalid) + len(refused)
    assert all(reasons[c] in refused[c] for c in refused), {
        c: reasons[c] for c in refused if reasons[c] not in refused[c]
    }
    assert reasons.keys() - refused.keys() == invalid
    assert all(reasons[c] and "constraint" not in reasons[c] for c in invalid)
    # a record invalid only by the clock bound is told so, with both instants
    ahead = {}
    for d in report.delivered:
        c = (d.partition, d.offset)
        if c in invalid and (row := oracle_row(d.value, None, skew)) is not None:
            ahead[c] = (
                f"event_time {_iso_z(row[9])} is ahead of the record's Kafka timestamp "
                f"{_iso_z(sent[c])} by more than the allowed clock skew of {skew} minutes: "
                "the producer's clock is wrong"
            )
    assert ahead and {c: reasons[c] for c in ahead} == ahead

    # gold too takes every valid event: counted in its windows, or kept out with a reason
    from pipelines.layers.gold import gold_tables, run_gold, seed_dimensions

    seed_dimensions(spark, lake)
    run_gold(spark, lake, once=True, progress=False)
    gold = gold_tables(lake)
    kept_out = spark.read.format("delta").load(gold.late)
    assert kept_out.where("reason IS NULL").count() == 0
    for name, event_type, count, windows in (
        ("gold/revenue_by_category_1m", "paid", "paid_orders", 1),
        ("gold/orders_by_country_5m", "created", "created_orders", 5),
    ):
        counted = spark.read.format("delta").load(gold.aggregates[name]).agg({count: "sum"})
        typed = [e for e in events if e[3] == event_type]
        out = kept_out.where(f"event_type = '{event_type}'").count()
        assert (counted.first()[0] or 0) == windows * (len(typed) - out), name


def test_two_silver_jobs_started_together_never_run_together(spark, lake, tmp_path):
    import signal
    import socket
    import time

    report = produce(lake, orders=150, seed=75)
    run_bronze(spark, lake, once=True, progress=False)
    env = subprocess_env(lake)
    logs = [tmp_path / f"silver-{i}.log" for i in (0, 1)]
    jobs = [helpers.start_job("pipelines.jobs.silver_job", env, log) for log in logs]
    try:
        deadline = time.monotonic() + 180
        while all(job.poll() is None for job in jobs):  # continuous: only a refusal ends one
            assert time.monotonic() < deadline, logs[0].read_text()[-2000:]
            time.sleep(0.2)
        loser = next(i for i, job in enumerate(jobs) if job.poll() is not None)
        winner = jobs[1 - loser]
        assert jobs[loser].returncode == 6, logs[loser].read_text()[-2000:]
        checkpoint = silver_tables(lake, lake.streams["orders"]).checkpoint
        assert (
            f"checkpoint {checkpoint} is in use by the silver job on {socket.gethostname()}, "
            f"pid {winner.pid}, since "
        ) in logs[loser].read_text()
        # the winner dies without a word; its lease is stale at once (same host, pid gone)
        os.killpg(winner.pid, signal.SIGKILL)
        winner.wait()
    finally:
        for job in jobs:
            if job.poll() is None:
                os.killpg(job.pid, signal.SIGKILL)
    final = helpers.start_job("pipelines.jobs.silver_job", env, logs[0], "--once")
    assert final.wait(timeout=300) == 0, logs[0].read_text()[-3000:]
    assert_silver_matches(spark, lake, oracle(report))
