"""Gold through all three layers against a real broker, compared with a Decimal oracle."""

from __future__ import annotations

import csv
import json
import os
import random
import shutil
from collections import defaultdict
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from functools import partial
from pathlib import Path

import pytest
from delta.tables import DeltaTable
from pyspark.sql import functions as F

from pipelines.layers.bronze import run_bronze
from pipelines.layers.gold import gold_sink, gold_tables, run_gold, seed_dimensions
from pipelines.layers.silver import run_silver, silver_tables
from pipelines.reference.orders_stream import StreamOptions, generate_orders_stream
from pipelines.reference.producer import produce_plan
from tests import helpers
from tests.conftest import subprocess_env
from tests.integration.test_silver import TWISTS, assert_silver_matches, oracle

pytestmark = pytest.mark.integration

START = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
DAY = datetime(2026, 11, 23)  # a day after START: the overflow test's events (as Spark returns it)


def seeds(conf, name: str) -> dict[str, dict]:
    with (conf.seed_dir / f"{name}.csv").open() as f:
        rows = list(csv.DictReader(f))
    return {r[f"{name[:-1]}_id"]: r for r in rows}


def gold_oracle(*phases: tuple[list[tuple], dict, dict]):
    """Both gold tables in plain Python with Decimal, from silver-shaped event tuples, each
    phase joined with the dimensions as they were when it ran."""
    revenue: dict[tuple, list] = defaultdict(lambda: [0, 0, Decimal("0.00")])
    countries: dict[tuple, list] = defaultdict(lambda: [0, Decimal("0.00")])
    for events, products, customers in phases:
        _add_phase(revenue, countries, events, products, customers)
    return (
        sorted((*k, v[0], v[1], v[2]) for k, v in revenue.items()),
        sorted((*k, v[0], v[1]) for k, v in countries.items()),
    )


def _add_phase(revenue, countries, events, products, customers) -> None:
    for e in events:
        _, _, _, etype, customer, product, qty, price, currency, t, _ = e
        minute = t.replace(second=0, microsecond=0)
        if etype == "paid":
            category = products.get(product, {}).get("category", "unknown")
            r = revenue[(minute, minute + timedelta(minutes=1), category, currency)]
            r[0] += 1
            r[1] += qty
            r[2] += qty * price
        if etype == "created":
            country = customers.get(customer, {}).get("country", "unknown")
            for k in range(5):
                ws = minute - timedelta(minutes=k)
                c = countries[(ws, ws + timedelta(minutes=5), country)]
                c[0] += 1
                c[1] += qty * price


def table(spark, path: str) -> list[tuple]:
    return sorted(tuple(r) for r in spark.read.format("delta").load(path).collect())


def run_all(spark, conf) -> None:
    run_bronze(spark, conf, once=True, progress=False)
    run_silver(spark, conf, once=True, progress=False)
    run_gold(spark, conf, once=True, progress=False)


def plan(seed: int, orders: int, start: datetime, **twists):
    return generate_orders_stream(
        StreamOptions(orders=orders, seed=seed, start_time=start, events_per_second=0.5, **twists)
    )


def produce(conf, seed: int, orders: int, start: datetime, **twists):
    return produce_plan(conf, plan(seed, orders, start, **twists), conf.streams["orders"].topic)


def test_gold_is_exact_late_events_are_traced_and_dimension_updates_apply(spark, lake):
    conf = lake.updated({"gold.max_files_per_trigger": None})
    tables = gold_tables(conf)
    assert seed_dimensions(spark, conf) == {"products": 300, "customers": 3000}
    products, customers = seeds(conf, "products"), seeds(conf, "customers")

    # 1. a first stream, ~25 minutes of event time, with unknown ids and re-deliveries
    first = produce(
        conf,
        81,
        300,
        START,
        redelivery_rate=0.1,
        out_of_order_rate=0.2,
        unknown_dimension_rate=0.05,
        invalid_rate=0.02,
    )
    run_all(spark, conf)
    events1 = list(oracle(first)["events"].values())
    phase1 = (events1, dict(products), dict(customers))
    assert (
        table(spark, tables.aggregates["gold/revenue_by_category_1m"]),
        table(spark, tables.aggregates["gold/orders_by_country_5m"]),
    ) == gold_oracle(phase1)
    assert table(spark, tables.late) == []

    # 2. events from the start of the stream arrive now: those 10+ minutes behind are late
    newest = max(e[9] for e in events1)
    second = produce(conf, 82, 120, newest.replace(tzinfo=UTC) - timedelta(minutes=15))
    events2 = list(oracle(second)["events"].values())
    late = {e[0] for e in events2 if e[9] < newest - timedelta(minutes=10)}
    assert 0 < len(late) < len(events2)
    run_all(spark, conf)
    on_time = [e for e in events2 if e[0] not in late]
    phase2 = (on_time, dict(products), dict(customers))
    assert (
        table(spark, tables.aggregates["gold/revenue_by_category_1m"]),
        table(spark, tables.aggregates["gold/orders_by_country_5m"]),
    ) == gold_oracle(phase1, phase2)
    late_rows = spark.read.format("delta").load(tables.late).collect()
    assert {r["event_id"] for r in late_rows} == late
    assert all("more than 10 minutes behind" in r["reason"] for r in late_rows)
    silver_ids = {
        r["event_id"]
        for r in spark.read.format("delta").load(tables.events).select("event_id").collect()
    }
    assert late <= silver_ids  # late events still reach silver

    # 3. a dimension changes: the next micro-batch uses the new value
    third = plan(83, 150, newest.replace(tzinfo=UTC) - timedelta(minutes=2))
    import json

    target = next(
        json.loads(r.value)["product_id"]
        for r in third.records
        if r.kind == "event" and json.loads(r.value)["event_type"] == "paid"
    )
    DeltaTable.forPath(spark, tables.dimensions["products"]).update(
        f"product_id = '{target}'", {"category": "'relabelled'"}
    )
    products[target] = {**products[target], "category": "relabelled"}
    report3 = produce_plan(conf, third, conf.streams["orders"].topic)
    events3 = list(oracle(report3)["events"].values())
    run_all(spark, conf)
    phase3 = (events3, dict(products), dict(customers))
    revenue = table(spark, tables.aggregates["gold/revenue_by_category_1m"])
    assert (revenue, table(spark, tables.aggregates["gold/orders_by_country_5m"])) == gold_oracle(
        phase1, phase2, phase3
    )
    assert any(r[2] == "relabelled" for r in revenue)


def test_a_gold_sink_reads_each_dimension_once_per_version(spark, lake):
    """The dimensions are cached while they do not change (a batch plans no scan of them), and
    the first batch after a change reads them again."""
    seed_dimensions(spark, lake)
    tables = gold_tables(lake)
    sink = gold_sink(lake, tables)
    first = sink.dimensions(spark)
    assert sink.dimensions(spark) is first
    assert [f.storageLevel.useMemory for f in first.values()] == [True, True]
    product = first["products"].orderBy("product_id").first()["product_id"]
    DeltaTable.forPath(spark, tables.dimensions["products"]).update(
        f"product_id = '{product}'", {"category": "'relabelled'"}
    )
    second = sink.dimensions(spark)
    # the old version of products left the cache; customers, unchanged, is cached once (its
    # frames before and after read the same version: one plan, one cache entry)
    assert first["products"].storageLevel.useMemory is False
    assert [f.storageLevel.useMemory for f in second.values()] == [True, True]
    relabelled = second["products"].where(F.col("category") == "relabelled")
    assert [r["product_id"] for r in relabelled.collect()] == [product]
    assert second["customers"].count() == 3000


def test_sigkill_silver_then_gold_on_s3_at_random_instants_and_lost_checkpoints_equal_a_local_run(
    spark, s3_lake, tmp_path
):
    """One stream through both layers, its tables and checkpoints on the S3 endpoint: each layer
    is SIGKILLed at a random instant (mid-batch or between batches), loses its checkpoint right
    after the kill, and is run to the end; every table then equals an uninterrupted
    run's on a local disk, quarantine and late events included."""
    lake = s3_lake
    # ~16 minutes of event time, late events among them; bronze in 4 batches of 4 files, so that
    # silver (4 files a batch) has 4 micro-batches to do, and gold (1 file a batch) as many
    report = helpers.produce(lake, 300, 74, events_per_second=1.0, **TWISTS)
    run_bronze(
        spark, lake.updated({"bronze.max_offsets_per_trigger": 250}), once=True, progress=False
    )
    seed_dimensions(spark, lake)
    stream = lake.streams["orders"]
    silver, gold = silver_tables(lake, stream), gold_tables(lake)
    reference = lake.updated({"storage.root": str(tmp_path / "ref")})
    ref_silver, ref_gold = silver_tables(reference, stream), gold_tables(reference)
    helpers.download(silver.bronze, ref_silver.bronze)
    rng = random.Random(int(os.environ.get("LAKEHOUSE_TEST_SEED", "4321")))
    log = tmp_path / "jobs.log"

    def kill_then_lose_checkpoint(
        job: str,
        watched: str,
        checkpoint: str,
        reference_run: Callable[[], object],
        *others: str,
        **env: str,
    ) -> None:
        """Kill `job`, lose its checkpoint (and `others`), run it to the end; `reference_run`
        runs beside it."""
        env = subprocess_env(lake, **env)
        with helpers.running_beside(reference_run):
            # killed from its second commit (its first batch: the first may create the table,
            # and a checkpoint lost before any batch leaves nothing to rebuild) to 5 s after
            killed = helpers.kill_at_random_instants(
                job, env, log, watched, rng, kills=1, batches=(2, 3), jitter_s=5.0
            )
            assert killed == 1, f"{job} finished before it could be killed"
            for lost in (checkpoint, *others):  # right after the kill: rebuilt from the tables
                helpers.remove_tree(lost)
            final = helpers.start_job(job, env, log, "--once")
            assert final.wait(timeout=600) == 0, log.read_text()[-3000:]
            assert f"checkpoint {checkpoint} was lost; rebuilt from the tables" in log.read_text()

    # silver: its last write of a batch is to the events table (its state query's, if it ran,
    # to the state table: both checkpoints are lost); the reference runs beside it
    kill_then_lose_checkpoint(
        "pipelines.jobs.silver_job",
        silver.events,
        silver.checkpoint,
        partial(run_silver, spark, reference, once=True, progress=False),
        silver.state_checkpoint,
        LAKEHOUSE__SILVER__MAX_FILES_PER_TRIGGER="4",
    )
    for mine, theirs in (
        (silver.events, ref_silver.events),
        (silver.state, ref_silver.state),
        (silver.quarantine, ref_silver.quarantine),
    ):
        assert table(spark, mine) == table(spark, theirs)
    assert_silver_matches(spark, lake, oracle(report))

    # gold, on the events silver wrote (the reference reads the same commits: the same batches)
    shutil.rmtree(ref_silver.events)
    helpers.download(silver.events, ref_silver.events)
    for role, path in gold.dimensions.items():
        helpers.download(path, ref_gold.dimensions[role])
    same_batches = reference.updated({"gold.max_files_per_trigger": 1})
    kill_then_lose_checkpoint(
        "pipelines.jobs.gold_job",
        gold.high_water,
        gold.checkpoint,
        partial(run_gold, spark, same_batches, once=True, progress=False),
        LAKEHOUSE__GOLD__MAX_FILES_PER_TRIGGER="1",
    )
    for name, path in gold.aggregates.items():
        assert table(spark, path) == table(spark, ref_gold.aggregates[name]), name
    late = table(spark, gold.late)
    assert late == table(spark, ref_gold.late)
    assert any("more than 10 minutes behind" in r[-1] for r in late)  # the late path ran too


def test_quality_suites_and_per_batch_checks_pass_on_good_tables_and_name_what_fails(
    spark, lake, monkeypatch, capsys
):
    """One lake for both kinds of checks: gold's per-batch checks (a bad batch is not written)
    and the table suites of `lakehouse dq` (a broken table is named)."""
    from pipelines import cli
    from pipelines.layers.declared import declared_tables
    from pipelines.layers.quality import QualityCheckFailedError, run_quality

    conf = lake.updated({"gold.max_files_per_trigger": None, "gold.check_quality_per_batch": True})
    seed_dimensions(spark, conf)
    produce(conf, 95, 150, START, unknown_dimension_rate=0.0)
    run_all(spark, conf)  # passes its per-batch checks
    results = spark.read.format("delta").load(conf.table_path("quality/results"))
    assert [r["scope"] for r in results.select("scope").distinct().collect()] == ["batch 0"]
    assert not (Path(conf.root) / "_quality").exists()  # a batch's results: no Data Docs page
    tables_runs = results.where("scope = 'table'")
    # `lakehouse dq --json`, in this process (its session is this one)
    for key, value in subprocess_env(conf).items():
        if key.startswith("LAKEHOUSE"):
            monkeypatch.setenv(key, value)
    capsys.readouterr()
    assert cli.main(["dq", "--env", "test", "--json"]) == 0
    outcomes = json.loads(capsys.readouterr().out)
    assert [(o["suite"], o["table"], o["success"], o["failures"]) for o in outcomes] == [
        ("silver_order_events", "silver/order_events", True, []),
        ("silver_orders", "silver/orders", True, []),
        ("gold_revenue_by_category_1m", "gold/revenue_by_category_1m", True, []),
        ("gold_orders_by_country_5m", "gold/orders_by_country_5m", True, []),
    ]
    assert tables_runs.count() == 23 and tables_runs.where("success").count() == 23
    index = Path(conf.root) / "_quality/gx/uncommitted/data_docs/local_site/index.html"
    assert all(o["suite"] in index.read_text() for o in outcomes)  # each run's page, listed

    # a batch whose partial aggregates fail a per-batch check stops gold before it is written
    tables = gold_tables(conf)
    before = (
        table(spark, tables.aggregates["gold/revenue_by_category_1m"]),
        table(spark, tables.aggregates["gold/orders_by_country_5m"]),
    )
    assert before[0] and before[1]
    produce(conf, 97, 60, START + timedelta(minutes=3), unknown_dimension_rate=1.0)
    run_bronze(spark, conf, once=True, progress=False)
    run_silver(spark, conf, once=True, progress=False)
    with pytest.raises(
        QualityCheckFailedError,
        match=r"expect_column_values_to_not_be_in_set on (category|country) failed",
    ):
        run_gold(spark, conf, once=True, progress=False)
    assert (
        table(spark, tables.aggregates["gold/revenue_by_category_1m"]),
        table(spark, tables.aggregates["gold/orders_by_country_5m"]),
    ) == before
    scopes = {r["scope"] for r in results.select("scope").distinct().collect()}
    assert scopes == {"batch 0", "batch 1", "table"}

    # a table that breaks its suite is named, with its version
    orders = conf.table_path("silver/orders")
    spark.read.format("delta").load(orders).limit(1).write.format("delta").mode("append").save(
        orders
    )
    version = helpers.delta_commits(orders) - 1
    with pytest.raises(QualityCheckFailedError) as e:
        run_quality(spark, conf, declared_tables(conf), ["silver/orders"])
    assert (
        f"silver/orders (version {version}): expect_column_values_to_be_unique on order_id "
        "failed" in str(e.value)
    )
    failed = tables_runs.where("not success").select("table", "expectation", "column").collect()
    assert [tuple(r) for r in failed] == [
        ("silver/orders", "expect_column_values_to_be_unique", "order_id")
    ]
    assert tables_runs.select("run_id").distinct().count() == 2


def _event(n: int, event_type: str, quantity: int, price: str, second: int, product: str):
    """A StreamRecord of one valid order event at `DAY` 10:00:`second`."""
    from pipelines.reference.orders_stream import StreamRecord

    value = (
        f'{{"event_id": "big-{n}", "order_id": "big-o-{n}", "seq": 1, "event_type": '
        f'"{event_type}", "customer_id": "c-00001", "product_id": "{product}", "quantity": '
        f'{quantity}, "unit_price": {price}, "currency": "EUR", '
        f'"event_time": "2026-11-23T10:00:{second:02d}Z"}}'
    )
    return StreamRecord(f"big-o-{n}".encode(), value.encode(), 0, "event", f"big-{n}")


def test_a_replayed_gold_batch_adds_nothing_twice_and_values_that_would_overflow_keep_their_events_out(
    spark, lake, monkeypatch
):
    from pipelines.layers.gold import TOO_BIG, UpsertGold, gold_sink
    from pipelines.reference.orders_stream import StreamPlan

    conf = lake.updated({"gold.max_files_per_trigger": None})
    seed_dimensions(spark, conf)
    tables = gold_tables(conf)
    huge = 6 * 10**18  # two of them in one window's `units` exceed a long

    def send(*records):
        topic = conf.streams["orders"].topic
        produce_plan(conf, StreamPlan(StreamOptions(), list(records)), topic)

    produce(conf, 91, 120, START)
    send(_event(1, "paid", huge, "0.00", 10, "p-0001"))  # a day later, alone in its window
    run_all(spark, conf)
    revenue_path = tables.aggregates["gold/revenue_by_category_1m"]
    paths = (revenue_path, tables.aggregates["gold/orders_by_country_5m"], tables.late)

    def state():
        versions = [DeltaTable.forPath(spark, p).history(1).first()["version"] for p in paths]
        return versions + [table(spark, p) for p in paths]

    # 1. the one batch this checkpoint ran, once more: nothing changes, not even a version
    before = state()
    gold_sink(conf, tables)(spark.read.format("delta").load(tables.events), 0)
    assert state() == before
    assert spark.conf.get("spark.databricks.delta.write.txnAppId", None) is None
    on_the_day = [r for r in table(spark, revenue_path) if r[0] >= DAY]
    assert [r[5] for r in on_the_day] == [huge]

    # 2. batch 1: two more in that window row (too big together with it), one in another row,
    # and a created event; gold is killed after its first table's MERGE, then runs the batch again
    send(
        _event(2, "paid", huge, "0.00", 20, "p-0001"),
        _event(3, "paid", 1, "1.00", 30, "p-0001"),
        _event(4, "paid", 2, "3.50", 40, "p-0002"),
        _event(5, "created", 1, "9999999999.99", 50, "p-0002"),
    )
    run_bronze(spark, conf, once=True, progress=False)
    run_silver(spark, conf, once=True, progress=False)
    batch = spark.read.format("delta").load(tables.events)
    batch = batch.where(F.col("event_id").isin([f"big-{n}" for n in range(2, 6)]))
    real_add, calls = UpsertGold._add, []

    def killed_at_the_second_merge(self, *args):
        calls.append(args)
        if len(calls) == 2:
            raise RuntimeError("killed")
        return real_add(self, *args)

    monkeypatch.setattr(UpsertGold, "_add", killed_at_the_second_merge)
    with pytest.raises(RuntimeError):
        gold_sink(conf, tables)(batch, 1)
    monkeypatch.undo()
    gold_sink(conf, tables)(batch, 1)

    late = spark.read.format("delta").load(tables.late).where("event_id LIKE 'big-%'").collect()
    assert sorted((r["event_id"], r["reason"]) for r in late) == [
        (f"big-{n}", f"{TOO_BIG} of gold/revenue_by_category_1m: kept out of the gold windows")
        for n in (2, 3)
    ]
    revenue = [r for r in table(spark, revenue_path) if r[0] >= DAY]
    assert sorted(r[4:] for r in revenue) == [(1, 2, Decimal("7.00")), (1, huge, Decimal("0.00"))]
    countries = table(spark, tables.aggregates["gold/orders_by_country_5m"])
    assert [r[3:] for r in countries if r[0] >= DAY] == [(1, Decimal("9999999999.99"))] * 5
