"""Tables by name: every declared table as `<schema>.<table>` at its path, in any session, with
no metastore (several drivers at once), or with a real Hive metastore for every other name."""

from __future__ import annotations

import subprocess
import sys

import pytest

from pipelines.layers.silver import ensure_silver_tables, silver_tables
from pipelines.local import metastore
from pipelines.spark_conf import catalog_settings
from pipelines.streaming.spark import session_confs
from tests import helpers
from tests.conftest import _free_port, subprocess_env

pytestmark = pytest.mark.integration


def test_a_session_reaches_the_declared_tables_by_name_and_only_those_that_exist(spark, lake):
    ensure_silver_tables(spark, lake, silver_tables(lake, lake.stream("orders")))
    names = {k: v for k, v in catalog_settings(lake).items() if k.startswith("spark.lakehouse.")}
    with session_confs(spark, names):  # the names follow the settings, read at each lookup
        assert [t.name for t in spark.catalog.listTables("silver")] == [
            "order_events",
            "orders",
            "orders_quarantine",
        ]
        assert spark.table("silver.orders").count() == 0
        assert spark.catalog.tableExists("silver.orders")
        assert not spark.catalog.tableExists("gold.late_events")  # declared, not created yet
        assert [t.name for t in spark.catalog.listTables("gold")] == []
        history = spark.sql("DESCRIBE HISTORY silver.orders").select("operation").collect()
        assert [r.operation for r in history] == ["CREATE TABLE"]
        path = spark.sql("DESCRIBE DETAIL silver.orders").first()["location"]
        assert path.removeprefix("file:") == lake.table_path("silver/orders")


def test_with_a_hive_metastore_names_a_user_creates_are_shared_by_drivers_running_at_once(
    spark, lake, tmp_path
):
    ensure_silver_tables(spark, lake, silver_tables(lake, lake.stream("orders")))
    conf = lake.updated(
        {
            "local_metastore.port": _free_port(),
            "local_metastore.data_dir": str(tmp_path / "metastore"),
        }
    )
    env = subprocess_env(conf)
    env |= {
        "LAKEHOUSE__LOCAL_METASTORE__PORT": str(conf.local_metastore.port),
        "LAKEHOUSE__CATALOG__METASTORE": "hive",
        "LAKEHOUSE__CATALOG__HIVE_METASTORE_URI": metastore.uri(conf),
    }
    metastore.start(conf, quiet=True)
    try:
        # two of Spark's own shells at once, each creating a schema and a table in it
        shells = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "pipelines.cli",
                    "spark-sql",
                    "-S",
                    "-e",
                    f"CREATE SCHEMA IF NOT EXISTS sandbox; "
                    f"CREATE TABLE sandbox.t{i} USING delta AS SELECT {i} AS x",
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i in (1, 2)
        ]
        for shell in shells:
            out, err = shell.communicate(timeout=180)
            assert shell.returncode == 0, err[-3000:]
        # a third driver sees both, and the declared tables beside them
        shown = helpers.run_module(
            "pipelines.cli",
            env,
            "sql",
            "--json",
            "SELECT (SELECT sum(x) FROM sandbox.t1) + (SELECT sum(x) FROM sandbox.t2) AS x, "
            "(SELECT count(*) FROM silver.orders) AS orders",
        )
        assert shown.returncode == 0, shown.stderr[-3000:]
        assert shown.stdout.strip() == '[{"x": 3, "orders": 0}]'
        # the tables a user creates by name go to the warehouse under the storage root
        assert sorted(
            p.name for p in (tmp_path / "lake" / "_warehouse" / "sandbox.db").iterdir()
        ) == ["t1", "t2"]
    finally:
        metastore.stop(conf, quiet=True)
    assert not metastore.status(conf).running
