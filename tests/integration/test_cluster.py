"""The shipped batch job on a Spark standalone cluster (master + 2 workers), with the tables and
checkpoints on S3: it keeps everything on the endpoint and its secret nowhere, its tables can be
explored by name and in the notebook, and they equal the oracles every local run is held to."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

import pytest

from pipelines.config import REPO_ROOT
from pipelines.layers.gold import gold_tables
from pipelines.local import cluster, history
from pipelines.orchestration.runner import JobRunner
from pipelines.orchestration.runs import read_runs
from pipelines.orchestration.spec import load_job_spec
from tests import helpers
from tests.conftest import S3_SECRET, _free_port, subprocess_env
from tests.explore import explore_the_tables
from tests.helpers import SILVER_AND_GOLD as TABLES
from tests.helpers import produce, s3_objects
from tests.integration.test_gold import gold_oracle, seeds
from tests.integration.test_gold import table as rows_of
from tests.integration.test_publish import assert_published_exactly
from tests.integration.test_silver import assert_silver_matches, oracle

pytestmark = pytest.mark.integration


def _runs(events) -> dict[str, tuple[str, ...]]:
    """Each run's event types, in order."""
    runs: dict[str, tuple[str, ...]] = {}
    for e in events:
        runs[e["run"]["runId"]] = (*runs.get(e["run"]["runId"], ()), e["eventType"])
    return runs


def test_the_batch_job_on_a_cluster_with_the_root_on_s3_keeps_all_there_and_gives_exact_tables(
    spark, s3_lake, tmp_path, monkeypatch
):
    report = produce(
        s3_lake,
        orders=400,
        seed=71,
        redelivery_rate=0.05,
        invalid_rate=0.03,
        out_of_order_rate=0.1,
        null_key_rate=0.03,
        late_rate=0.02,
    )  # no unknown products: a few would fail the gold quality suite's `unknown` share
    conf = s3_lake.updated(
        {
            "cluster.master_port": _free_port(),
            "cluster.master_webui_port": _free_port(),
            "cluster.dir": str(tmp_path / "cluster"),
            "cluster.worker_memory": "1g",
            "event_log.history_port": _free_port(),
            "event_log.history_dir": str(tmp_path / "logs" / "history"),
        }
    )
    before = set(tmp_path.rglob("*"))
    monkeypatch.setenv(
        "JAVA_TOOL_OPTIONS", subprocess_env(conf)["JAVA_TOOL_OPTIONS"]
    )  # the workers too
    status = cluster.start(conf, quiet=True)
    try:
        assert (status.alive_workers, status.cores) == (2, 2)
        lines: list[str] = []
        # the shipped batch spec: set-up, bronze, silver, gold, both quality tasks, which run
        # beside each other and append to one results table (two drivers), and gold's changes
        # published to Kafka
        run = JobRunner(
            conf,
            load_job_spec("conf/jobs/orders_batch.yaml"),
            parameters={"env": "test"},
            master=conf.cluster.master_url,
            env=subprocess_env(conf),
            echo=lines.append,
        ).run()
        assert run.state == "SUCCESS", "\n".join(lines)
        c = conf.cluster
        with urllib.request.urlopen(f"http://{c.host}:{c.master_webui_port}/json/") as r:
            apps = json.loads(r.read())["completedapps"]
        tasks = ["setup", "bronze", "silver", "gold", "quality_silver", "quality_gold", "publish"]
        assert sorted((a["name"], a["state"]) for a in apps) == [
            (name, "FINISHED")
            for name in sorted(
                [
                    "lakehouse-setup",
                    "lakehouse-bronze-orders",
                    "lakehouse-silver-orders",
                    "lakehouse-gold-orders",
                    "lakehouse-quality",
                    "lakehouse-quality",
                    "lakehouse-publish-orders",
                ]
            )
        ]
        # one core each: the tasks that run at once (gold beside the silver checks, publish
        # beside the gold checks) each had theirs, none waited for the other to end
        assert {a["cores"] for a in apps} == {conf.cluster.app_cores} == {1}
    finally:
        cluster.stop(conf, quiet=True)
    assert not cluster.status(conf).running

    # the runs table, on S3 through delta-rs, from a `lakehouse jobs runs` of its own
    shown = helpers.run_module("pipelines.cli", subprocess_env(conf), "jobs", "runs", timeout=120)
    assert shown.returncode == 0, shown.stderr
    for task in tasks:
        assert any(f" {task} " in line and "SUCCESS" in line for line in shown.stdout.splitlines())
    finals = {r["task"]: r["state"] for r in read_runs(conf) if r["state"] != "RUNNING"}
    assert finals == dict.fromkeys(tasks, "SUCCESS")

    # everything is on the endpoint: the tables, checkpoints, results and Data Docs
    stored = s3_objects(conf)
    for table in [*TABLES, "bronze/orders_raw", "quality/results", "_jobs/runs"]:
        assert (stored / table / "_delta_log" / "00000000000000000000.json").is_file(), table
    for layer in ("bronze/orders_raw", "silver/order_events", "gold/orders"):
        assert (stored / "_checkpoints" / layer / "commits").is_dir(), layer
    docs = stored / "_quality" / "gx" / "uncommitted" / "data_docs" / "local_site" / "index.html"
    assert docs.is_file()
    # the layer jobs' event logs (rolling, one folder per application), read there by Spark's own
    # History Server
    logs = sorted(p.name for p in (stored / "_spark_events").iterdir())
    assert [name.split("_", 2)[:2] for name in logs] == [["eventlog", "v2"]] * 4, logs
    history.start(conf, quiet=True)
    try:
        listed = history.applications(conf)
    finally:
        history.stop(conf, quiet=True)
    assert sorted((a["name"], a["attempts"][0]["completed"]) for a in listed) == [
        ("lakehouse-bronze-orders", True),
        ("lakehouse-gold-orders", True),
        ("lakehouse-publish-orders", True),
        ("lakehouse-silver-orders", True),
    ]
    assert sorted(f"eventlog_v2_{a['id']}" for a in listed) == logs
    # OpenLineage: each layer job's run and each of its micro-batches, START then COMPLETE, naming
    # the topic in the Kafka cluster's namespace and the tables in the bucket's
    events = [json.loads(line) for line in conf.lineage_file.read_text().splitlines()]
    prefix = conf.root.removeprefix("s3a://lake/")
    kafka = (f"kafka://{conf.kafka.bootstrap_servers.split(',')[0]}", conf.streams["orders"].topic)

    def table(name: str) -> tuple[str, str]:
        return ("s3://lake", f"{prefix}/{name}")

    expected = {
        "bronze-orders": (
            [kafka],
            [table("bronze/orders_raw"), table("bronze/orders_raw_gaps")],
            ("bronze/orders_raw",),
        ),
        "silver-orders": (
            [table("bronze/orders_raw")],
            [table("silver/order_events"), table("silver/orders"), table("silver/orders_quarantine")],
            ("silver/order_events", "silver/orders"),  # its query, and its state query's
        ),
        "gold-orders": (
            [table(t) for t in ("silver/order_events", "dimensions/products", "dimensions/customers")],
            [table(t) for t in ("gold/revenue_by_category_1m", "gold/orders_by_country_5m",
                                "gold/late_events", "gold/late_events_high_water")],
            ("gold/orders",),
        ),
    }  # fmt: skip
    jobs = [*expected, "publish-orders"]
    assert sorted({e["job"]["name"] for e in events}) == sorted(
        [*jobs, *(f"{job}.micro_batch" for job in jobs)]
    )
    # the publish job: the gold tables in, their topics and the published versions out, one
    # micro-batch run per Kafka transaction; the topics hold every change of the tables once
    stream = conf.streams["orders"]
    gold = ["gold/revenue_by_category_1m", "gold/orders_by_country_5m"]
    out = [stream.gold_topic(t) for t in gold] + [stream.published_versions_topic]
    [(_, states)] = _runs(e for e in events if e["job"]["name"] == "publish-orders").items()
    assert states == ("START", "COMPLETE")
    rounds = [e for e in events if e["job"]["name"] == "publish-orders.micro_batch"]
    assert set(_runs(rounds).values()) == {("START", "COMPLETE")} and rounds
    for e in events:
        if e["job"]["name"].startswith("publish-orders"):
            assert [(d["namespace"], d["name"]) for d in e["inputs"]] == [table(t) for t in gold]
            assert [(d["namespace"], d["name"]) for d in e["outputs"]] == [
                (kafka[0], t) for t in out
            ]
    assert_published_exactly(spark, conf)
    for job, (reads, writes, checkpoints) in expected.items():
        [(run_id, states)] = _runs(e for e in events if e["job"]["name"] == job).items()
        assert states == ("START", "COMPLETE"), job
        batches = [e for e in events if e["job"]["name"] == f"{job}.micro_batch"]
        for e in [*batches, *(e for e in events if e["job"]["name"] == job)]:
            assert [(d["namespace"], d["name"]) for d in e["inputs"]] == reads, job
            assert [(d["namespace"], d["name"]) for d in e["outputs"]] == writes, job
        assert {e["run"]["facets"]["parent"]["run"]["runId"] for e in batches} == {run_id}
        # one run per micro-batch each query committed (its checkpoint's commits), in order
        expected_ids, found_ids = {}, {}
        for checkpoint in checkpoints:
            folder = stored / "_checkpoints" / checkpoint
            query = json.loads((folder / "metadata").read_text())["id"]
            commits = sorted(
                int(f.name) for f in (folder / "commits").iterdir() if f.name.isdigit()
            )
            expected_ids[query] = [i for i in commits for _ in ("START", "COMPLETE")]
        for e in batches:
            facet = e["run"]["facets"]["lakehouse_microBatch"]
            found_ids.setdefault(facet["queryId"], []).append(facet["batchId"])
        assert found_ids == expected_ids, job
        assert set(_runs(batches).values()) == {("START", "COMPLETE")}
    # as a user explores the tables on the endpoint: by name from Spark's own spark-sql shell, and
    # the explore notebook, headless
    explore_the_tables(spark, conf, monkeypatch)
    # and nothing was written on this machine but logs: the tasks', the cluster's (its daemons'
    # and its executors' stdout and stderr, beside the application's jars each executor fetched)
    new = {p for p in tmp_path.rglob("*") if p.is_file()} - before
    assert {p.relative_to(tmp_path).parts[0] for p in new} == {"logs", "cluster"}, sorted(new)
    kinds = (".out", "/stdout", "/stderr", ".jar")
    assert [p for p in new if "cluster" in p.parts and not str(p).endswith(kinds)] == []
    assert not (REPO_ROOT / "s3a:").exists()  # no local folder named like the root
    # the secret key is in no object, log or table row
    needle = S3_SECRET.encode()
    holding = [
        str(f) for f in [*stored.rglob("*"), *new] if f.is_file() and needle in f.read_bytes()
    ]
    assert holding == []
    results = spark.read.format("delta").load(conf.table_path("quality/results"))
    assert results.select("suite").distinct().count() == 4

    # the tables the oracles compute from what was produced, as every local run gives them (the
    # silver and gold tests hold local runs to the same oracles); one batch: no event is late
    expected = oracle(report)
    assert_silver_matches(spark, conf, expected)
    assert len(expected["orders"]) == 400
    products, customers = seeds(conf, "products"), seeds(conf, "customers")
    revenue, countries = gold_oracle((list(expected["events"].values()), products, customers))
    gold = gold_tables(conf)
    assert rows_of(spark, gold.aggregates["gold/revenue_by_category_1m"]) == revenue
    assert rows_of(spark, gold.aggregates["gold/orders_by_country_5m"]) == countries
    assert rows_of(spark, gold.late) == []


def test_the_history_server_starts_on_a_root_no_job_has_written_to_yet(lake, tmp_path):
    """Spark's server refuses an event-log folder that does not exist: `lakehouse history start`
    creates it (the soak's first start, on a fresh root, failed)."""
    conf = lake.updated(
        {
            "event_log.history_port": _free_port(),
            "event_log.history_dir": str(tmp_path / "history"),
        }
    )
    assert not Path(conf.event_log_dir).exists()
    history.start(conf, quiet=True)
    try:
        assert history.applications(conf) == []
    finally:
        history.stop(conf, quiet=True)
    assert not history.status(conf).running
