"""The notebooks run headless against real tables, so they never rot."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from pipelines.layers.bronze import run_bronze
from pipelines.layers.gold import run_gold, seed_dimensions
from pipelines.layers.silver import run_silver
from tests import helpers
from tests.conftest import subprocess_env
from tests.helpers import produce

pytestmark = pytest.mark.integration
NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"


def _outputs(nb) -> str:
    return "\n".join(
        o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
        for cell in nb.cells
        if cell.cell_type == "code"
        for o in cell.get("outputs", [])
    )


def test_the_explore_notebook_runs_on_the_pipeline_tables_on_s3(spark, s3_lake, monkeypatch):
    lake = s3_lake
    produce(lake, orders=200, seed=61, redelivery_rate=0.05, invalid_rate=0.03)
    seed_dimensions(spark, lake)
    for run in (run_bronze, run_silver, run_gold):
        run(spark, lake, once=True, progress=False)
    produce(lake, orders=100, seed=62, redelivery_rate=0.05)
    for run in (run_bronze, run_silver, run_gold):
        run(spark, lake, once=True, progress=False)
    # `lakehouse dq` as a user runs it: its results and Data Docs are on the endpoint too
    env = subprocess_env(lake)
    dq = helpers.run_module("pipelines.cli", env, "dq")
    assert dq.returncode == 0, dq.stdout[-2000:] + dq.stderr[-3000:]
    assert dq.stderr.count(" passed") == 4, dq.stderr
    results = spark.read.format("delta").load(lake.table_path("quality/results"))
    assert results.select("suite").distinct().count() == 4
    docs = helpers.files().names(f"{lake.root}/_quality/gx/uncommitted/data_docs/local_site")
    assert "index.html" in docs, docs
    bronze_rows = spark.read.format("delta").load(lake.table_path("bronze/orders_raw")).count()
    quarantined = (
        spark.read.format("delta").load(lake.table_path("silver/orders_quarantine")).count()
    )
    # by name, from the CLI and from Spark's own spark-sql shell
    sql = helpers.run_module(
        "pipelines.cli", env, "sql", "--json", "SELECT count(*) AS n FROM bronze.orders_raw"
    )
    assert sql.returncode == 0, sql.stderr[-3000:]
    assert json.loads(sql.stdout) == [{"n": bronze_rows}]
    shell = helpers.run_module(
        "pipelines.cli",
        env,
        "spark-sql",
        "-S",
        "-e",
        "SHOW TABLES IN gold; SELECT count(*) FROM silver.orders_quarantine",
    )
    assert shell.returncode == 0, shell.stderr[-3000:]
    assert shell.stdout.split() == [
        "late_events",
        "late_events_high_water",
        "orders_by_country_5m",
        "revenue_by_category_1m",
        str(quarantined),
    ], shell.stdout

    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("DISPLAY", raising=False)
    nb = nbformat.read(NOTEBOOKS / "explore_lakehouse.ipynb", as_version=4)
    NotebookClient(
        nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": os.getcwd()}}
    ).execute()

    text = _outputs(nb)
    assert f"{'bronze.orders_raw':<30} {bronze_rows:>10,} rows, version 2" in text, text[:3000]
    listed = re.findall(r"^([a-z_]+[.][a-z_0-9]+) +[0-9,]+ rows, version", text, re.MULTILINE)
    assert listed == [
        "bronze.orders_raw",
        "bronze.orders_raw_gaps",
        "silver.order_events",
        "silver.orders",
        "silver.orders_quarantine",
        "dimensions.customers",
        "dimensions.products",
        "gold.late_events",
        "gold.late_events_high_water",
        "gold.orders_by_country_5m",
        "gold.revenue_by_category_1m",
        "quality.results",
        "system.query_progress",  # no system.job_runs: no job ran
    ], text[:3000]
    assert f"{quarantined:,} records in quarantine" in text
    assert f"bronze_orders_raw: 2 batches with data, {bronze_rows:,} rows" in text, text[-3000:]
    assert "Kafka -> bronze: p50" in text and "Kafka -> silver: p50" in text, text[-3000:]
    figures = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "image/png" in o.get("data", {})
    ]
    assert len(figures) == 2
