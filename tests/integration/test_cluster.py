"""The same jobs on a Spark standalone cluster (master + 2 workers), with the tables and
checkpoints on S3, give the tables of a local run on a local disk."""

from __future__ import annotations

import json
import urllib.request

import pytest
import yaml

from pipelines.layers.bronze import run_bronze
from pipelines.layers.gold import run_gold, seed_dimensions
from pipelines.layers.silver import run_silver
from pipelines.local import cluster
from pipelines.orchestration.runner import JobRunner
from pipelines.orchestration.spec import load_job_spec
from tests.conftest import _free_port, subprocess_env
from tests.helpers import SILVER_AND_GOLD as TABLES
from tests.helpers import produce

pytestmark = pytest.mark.integration


def test_the_batch_job_on_a_standalone_cluster_with_the_root_on_s3_gives_the_local_tables(
    spark, s3_lake, tmp_path, monkeypatch
):
    produce(
        s3_lake,
        orders=400,
        seed=71,
        redelivery_rate=0.05,
        invalid_rate=0.03,
        out_of_order_rate=0.1,
        null_key_rate=0.03,
        unknown_dimension_rate=0.02,
        late_rate=0.02,
    )
    conf = s3_lake.updated(
        {
            "cluster.master_port": _free_port(),
            "cluster.master_webui_port": _free_port(),
            "cluster.dir": str(tmp_path / "cluster"),
            "cluster.worker_memory": "1g",
        }
    )
    # the shipped batch spec's layer tasks (set-up and quality steps are tested elsewhere)
    spec = yaml.safe_load(open("conf/jobs/orders_batch.yaml"))
    spec["tasks"] = [t for t in spec["tasks"] if t["task_key"] in ("bronze", "silver", "gold")]
    spec["tasks"][0].pop("depends_on")
    seed_dimensions(spark, conf)
    spec_path = tmp_path / "orders_batch.yaml"
    spec_path.write_text(yaml.safe_dump(spec))

    monkeypatch.setenv(
        "JAVA_TOOL_OPTIONS", subprocess_env(conf)["JAVA_TOOL_OPTIONS"]
    )  # the workers too
    status = cluster.start(conf, quiet=True)
    try:
        assert (status.alive_workers, status.cores) == (2, 2)
        lines: list[str] = []
        run = JobRunner(
            conf,
            load_job_spec(spec_path),
            parameters={"env": "test"},
            master=conf.cluster.master_url,
            env=subprocess_env(conf),
            echo=lines.append,
        ).run()
        assert run.state == "SUCCESS", "\n".join(lines)
        c = conf.cluster
        with urllib.request.urlopen(f"http://{c.host}:{c.master_webui_port}/json/") as r:
            apps = json.loads(r.read())["completedapps"]
        assert sorted((a["name"], a["state"]) for a in apps) == [
            ("lakehouse-bronze-orders", "FINISHED"),
            ("lakehouse-gold-orders", "FINISHED"),
            ("lakehouse-silver-orders", "FINISHED"),
        ]
    finally:
        cluster.stop(conf, quiet=True)
    assert not cluster.status(conf).running

    local = conf.updated({"storage.root": str(tmp_path / "local")})
    seed_dimensions(spark, local)
    for run_layer in (run_bronze, run_silver, run_gold):
        run_layer(spark, local, once=True, progress=False)
    for table in TABLES:
        on_cluster = spark.read.format("delta").load(conf.table_path(table))  # s3a://
        in_local = spark.read.format("delta").load(local.table_path(table))
        assert on_cluster.count() == in_local.count(), table
        assert on_cluster.exceptAll(in_local).count() == 0, table
        assert in_local.exceptAll(on_cluster).count() == 0, table
    assert spark.read.format("delta").load(local.table_path("silver/orders")).count() == 400
