"""The pipeline job (one query through bronze, silver and gold) against the three layer jobs."""

from __future__ import annotations

import shutil

import pytest
from pyspark.sql import functions as F

from pipelines.layers.bronze import bronze_tables, run_bronze
from pipelines.layers.gold import gold_tables, run_gold, seed_dimensions
from pipelines.layers.pipeline import Pipeline, run_pipeline
from pipelines.layers.silver import run_silver, silver_tables
from tests import helpers
from tests.integration.test_gold import table
from tests.integration.test_silver import TWISTS, assert_silver_matches, oracle

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


def test_the_pipeline_writes_every_table_as_the_three_layer_jobs_do_and_survives_a_lost_checkpoint(
    spark, lake, tmp_path
):
    """The same stream, in the same micro-batches: once through the pipeline job, once through
    bronze, silver and gold one after the other. Every table is equal, late events and
    quarantine included; a lost pipeline checkpoint is rebuilt and the re-run changes nothing."""
    report = helpers.produce(lake, 300, 74, events_per_second=1.0, **TWISTS)
    seed_dimensions(spark, lake)
    reference = lake.updated({"storage.root": str(tmp_path / "ref")})
    seed_dimensions(spark, reference)
    # 5 batches of 200 records: bronze writes 4 files a batch, which silver takes as one batch,
    # whose events MERGE writes one file, which gold takes as one batch
    run_pipeline(
        spark, lake.updated({"pipeline.max_offsets_per_trigger": 200}), once=True, progress=False
    )
    run_bronze(
        spark, reference.updated({"bronze.max_offsets_per_trigger": 200}), once=True, progress=False
    )
    run_silver(
        spark, reference.updated({"silver.max_files_per_trigger": 4}), once=True, progress=False
    )
    run_gold(spark, reference.updated({"gold.max_files_per_trigger": 1}), once=True, progress=False)

    mine = every_table(spark, lake)
    assert mine == every_table(spark, reference)
    assert len(mine["bronze"]) == len(report.delivered)
    assert_silver_matches(spark, lake, oracle(report))
    assert any("more than 10 minutes behind" in r[-1] for r in mine["/gold/late_events"])
    progress = spark.read.format("delta").load(lake.table_path("system/query_progress"))
    pipeline_rows = progress.where(F.col("query_name") == "pipeline_orders")
    assert pipeline_rows.agg(F.sum("input_rows")).first()[0] == len(report.delivered)

    shutil.rmtree(Pipeline(lake, "orders").checkpoint)
    run_pipeline(spark, lake, once=True, progress=False)
    assert every_table(spark, lake) == mine
