"""The pipeline job (one query through bronze, silver and gold) against the three layer jobs."""

from __future__ import annotations

import os
import random
import shutil
from datetime import timedelta

import pytest

from pipelines.layers.bronze import bronze_tables, run_bronze
from pipelines.layers.gold import gold_tables, run_gold, seed_dimensions
from pipelines.layers.pipeline import Pipeline, run_pipeline
from pipelines.layers.quality import QualityCheckFailedError
from pipelines.layers.silver import run_silver, silver_tables
from tests import helpers
from tests.conftest import subprocess_env
from tests.integration.test_gold import START, produce, table
from tests.integration.test_silver import TWISTS, assert_silver_matches, oracle
from tests.transactions import produce_mixed

pytestmark = pytest.mark.integration


def every_table(spark, conf) -> dict[str, list[tuple]]:
    """Every table the pipeline writes, as sorted rows (bronze without its ingestion time)."""
    stream = conf.streams["orders"]
    b, s, g = bronze_tables(conf, stream), silver_tables(conf, stream), gold_tables(conf)
    raw = spark.read.format("delta").load(b.raw).drop("ingested_at")
    rows = {"bronze": sorted(tuple(r) for r in raw.collect())}
    root = str(conf.root)
    paths = (s.events, s.state, s.quarantine, g.late)
    rows |= {p.removeprefix(root): table(spark, p) for p in paths}
    rows |= {name: table(spark, p) for name, p in g.aggregates.items()}
    return rows


def test_the_pipeline_sigkilled_at_random_instants_with_a_lost_checkpoint_writes_every_table_as_the_three_layer_jobs_do(  # noqa: E501
    spark, lake, tmp_path
):
    """The same stream, in the same micro-batches: once through the pipeline job, SIGKILLed at a
    random instant (in any of its writes, or between batches) and its checkpoint lost after the
    kill; once through bronze, silver and gold one after the other, uninterrupted. Two thirds of
    its records come in Kafka transactions, a third of those aborted (real events: read, they
    would count).
    Every table is equal, late events and quarantine included, bronze holds exactly the plain
    and committed records, and silver matches the oracle computed from those only."""
    report = produce_mixed(lake, 300, 74, events_per_second=1.0, **TWISTS)
    seed_dimensions(spark, lake)
    reference = lake.updated({"storage.root": str(tmp_path / "ref")})
    seed_dimensions(spark, reference)
    # 5 batches of 300 offsets (aborted records and transaction markers take offsets too): bronze
    # writes 4 files a batch, which silver takes as one batch, whose events append writes one
    # file, which gold takes as one batch
    env = subprocess_env(lake, LAKEHOUSE__PIPELINE__MAX_OFFSETS_PER_TRIGGER="300")
    job, log = "pipelines.jobs.pipeline_job", tmp_path / "pipeline.log"
    rng = random.Random(int(os.environ.get("LAKEHOUSE_TEST_SEED", "4321")))
    events = silver_tables(lake, lake.streams["orders"]).events

    def run_the_layers() -> None:  # uninterrupted, in this process, beside the pipeline job
        settings = {"bronze.max_offsets_per_trigger": 300, "silver.max_files_per_trigger": 4}
        same_batches = reference.updated(settings | {"gold.max_files_per_trigger": 1})
        for run_layer in (run_bronze, run_silver, run_gold):
            run_layer(spark, same_batches, once=True, progress=False)

    with helpers.running_beside(run_the_layers):
        # killed from the events table's second commit (a batch's first write) to 5 s after
        killed = helpers.kill_at_random_instants(
            job, env, log, events, rng, kills=1, batches=(2, 3), jitter_s=5.0
        )
        assert killed == 1, (
            f"the pipeline finished before it could be killed: {log.read_text()[-2000:]}"
        )
        pipeline = Pipeline(lake, "orders")
        checkpoint = pipeline.checkpoint
        shutil.rmtree(checkpoint)
        shutil.rmtree(pipeline.state.checkpoint, ignore_errors=True)  # the state query's, if any
        final = helpers.start_job(job, env, log, "--once")
        assert final.wait(timeout=600) == 0, log.read_text()[-3000:]
        assert f"checkpoint {checkpoint} was lost; rebuilt from the tables" in log.read_text()
    mine = every_table(spark, lake)
    assert mine == every_table(spark, reference)
    assert len(mine["bronze"]) == len(report.delivered)
    assert_silver_matches(spark, lake, oracle(report))
    assert any("more than 10 minutes behind" in r[-1] for r in mine["/gold/late_events"])


def test_a_batch_gold_refuses_stops_ingestion_before_bronze_and_the_rerun_writes_each_record_once(
    spark, lake
):
    """Gold refuses a batch (a per-batch quality check fails): the pipeline stops on it with the
    check's error, and ingestion stops with it: no table holds anything of the batch (its events
    are stored, and it lands in bronze, only once gold has it). Run again without the check: every
    table holds each record once."""
    conf = lake.updated({"gold.check_quality_per_batch": True})
    seed_dimensions(spark, conf)
    first = produce(conf, 96, 40, START, unknown_dimension_rate=0.0, **TWISTS)
    run_pipeline(spark, conf, once=True, progress=False)  # passes its checks
    b, s = bronze_tables(conf, conf.streams["orders"]), silver_tables(conf, conf.streams["orders"])
    before = {p: table(spark, p) for p in (b.raw, s.events, s.state, s.quarantine)}
    assert len(before[b.raw]) == len(first.delivered)

    second = produce(conf, 97, 40, START + timedelta(minutes=3), unknown_dimension_rate=1.0)
    with pytest.raises(
        QualityCheckFailedError,
        match=r"expect_column_values_to_not_be_in_set on (category|country) failed",
    ):
        run_pipeline(spark, conf, once=True, progress=False)
    assert {p: table(spark, p) for p in before} == before

    relaxed = conf.updated({"gold.check_quality_per_batch": False})
    run_pipeline(spark, relaxed, once=True, progress=False)
    raw = spark.read.format("delta").load(b.raw)
    assert raw.count() == len(first.delivered) + len(second.delivered)
    assert raw.select("partition", "offset").distinct().count() == raw.count()
    assert_silver_matches(spark, conf, oracle(first, second))
