"""What a user runs to explore the tables, against real ones: Spark's spark-sql shell and the
explore notebook (headless, so it never rots)."""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from pyspark.sql import functions as F

from pipelines.config import LakehouseConf
from tests import helpers
from tests.conftest import subprocess_env

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"


def _outputs(nb) -> str:
    return "\n".join(
        o.get("text", "") + str(o.get("data", {}).get("text/plain", ""))
        for cell in nb.cells
        if cell.cell_type == "code"
        for o in cell.get("outputs", [])
    )


def explore_the_tables(spark, lake: LakehouseConf, monkeypatch) -> None:
    """`lake` holds every table of a pipeline run, its quality results and a job's runs (`lakehouse
    dq` is the quality job the job ran; `lakehouse sql` builds the notebook's session)."""
    env = subprocess_env(lake)
    raw = lake.table_path("bronze/orders_raw")
    bronze_rows = spark.read.format("delta").load(raw).count()
    quarantined = (
        spark.read.format("delta").load(lake.table_path("silver/orders_quarantine")).count()
    )
    # by name from Spark's own spark-sql shell, run beside the notebook (a JVM each)
    shell_command = "SHOW TABLES IN gold; SELECT count(*) FROM silver.orders_quarantine"
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(
            helpers.run_module, "pipelines.cli", env, "spark-sql", "-S", "-e", shell_command
        )
        version = spark.sql(f"DESCRIBE HISTORY delta.`{raw}`").agg({"version": "max"}).first()[0]
        progress = spark.read.format("delta").load(lake.table_path(lake.progress_table.table))
        batches = progress.where(
            (F.col("query_name") == "bronze_orders_raw") & (F.col("input_rows") > 0)
        )
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        monkeypatch.delenv("DISPLAY", raising=False)
        nb = nbformat.read(NOTEBOOKS / "explore_lakehouse.ipynb", as_version=4)
        NotebookClient(
            nb, timeout=300, kernel_name="python3", resources={"metadata": {"path": os.getcwd()}}
        ).execute()
        shell = running.result()
    assert shell.returncode == 0, shell.stderr[-3000:]
    assert shell.stdout.split() == [
        "late_events",
        "late_events_high_water",
        "orders_by_country_5m",
        "revenue_by_category_1m",
        str(quarantined),
    ], shell.stdout

    text = _outputs(nb)
    line = f"{'bronze.orders_raw':<30} {bronze_rows:>10,} rows, version {version}"
    assert line in text, text[:3000]
    listed = re.findall(r"^([a-z_]+[.][a-z_0-9]+) +[0-9,]+ rows, version", text, re.MULTILINE)
    assert sorted(listed) == [
        "bronze.orders_raw",
        "bronze.orders_raw_gaps",
        "dimensions.customers",
        "dimensions.products",
        "gold.late_events",
        "gold.late_events_high_water",
        "gold.orders_by_country_5m",
        "gold.revenue_by_category_1m",
        "quality.results",
        "silver.order_events",
        "silver.orders",
        "silver.orders_quarantine",
        "system.job_runs",
        "system.query_progress",
    ], text[:3000]
    assert f"{quarantined:,} records in quarantine" in text
    assert (
        f"bronze_orders_raw: {batches.count()} batches with data, {bronze_rows:,} rows" in text
    ), text[-3000:]
    assert "Kafka -> bronze: p50" in text and "Kafka -> silver: p50" in text, text[-3000:]
    figures = [
        o
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.get("outputs", [])
        if "image/png" in o.get("data", {})
    ]
    assert len(figures) == 2
