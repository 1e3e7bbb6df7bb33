"""Prometheus wiring that needs no job: the file_sd targets, Spark's metric settings, and the
alert rules (every metric they use is one the jobs export; promtool, where installed)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from pipelines.config import REPO_ROOT, load_config
from pipelines.jobs.services import job_metrics
from pipelines.spark_conf import metrics_settings
from pipelines.streaming.metrics import OpenTransactions

RULES = REPO_ROOT / "conf" / "prometheus" / "lakehouse-alerts.yml"


def test_each_job_has_fixed_ports_written_as_file_sd_target_groups():
    conf = load_config("local")
    groups = conf.metric_targets()
    assert groups[:2] == [
        {"targets": ["127.0.0.1:9411"], "labels": {"job": "lakehouse-bronze-orders", "env": "local"}},
        {"targets": ["127.0.0.1:4051"], "labels": {"job": "spark-bronze-orders", "env": "local",
                                                    "__metrics_path__": "/metrics/prometheus"}},
    ]  # fmt: skip
    assert len(groups) == 10  # bronze, silver, gold, pipeline, publish: two each
    settings = metrics_settings(conf, "silver-orders")
    assert (settings["spark.ui.enabled"], settings["spark.ui.port"]) == ("true", "4052")
    assert settings["spark.sql.streaming.metricsEnabled"] == "true"
    assert metrics_settings(conf, "silver-clicks") == {}  # no port: no UI
    assert metrics_settings(load_config("test"), "silver-orders") == {}  # metrics off


def exported() -> set[str]:
    """Every sample name a job's metrics can have (a job reading Kafka's too)."""
    conf = load_config("test")
    families = [
        *job_metrics(conf, [], []).registry.collect(),
        *OpenTransactions([], list).describe(),
    ]
    return {f.name + ("_total" if f.type == "counter" else "") for f in families}


def test_the_alert_rules_use_only_metrics_the_jobs_export():
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert [r["alert"] for r in rules] == [
        "LakehouseJobDown",
        "LakehouseTableStale",
        "LakehouseKafkaLagGrowing",
        "LakehouseQualitySuiteFailed",
        "LakehouseBatchesStalled",
        "LakehouseKafkaTransactionOpen",
    ]
    used = {name for r in rules for name in re.findall(r"lakehouse_[a-z_]+", r["expr"])}
    assert used <= exported(), used - exported()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian: prometheus)")
def test_promtool_accepts_the_alert_rules():
    done = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 6 rules found" in done.stdout


def test_table_figures_come_from_the_logs_and_the_newest_quality_run(tmp_path):
    from datetime import UTC, datetime

    import pyarrow as pa
    from deltalake import write_deltalake

    conf = load_config("test").updated({"storage.root": str(tmp_path)})
    t = datetime(2026, 11, 25, 10, 0, tzinfo=UTC)
    quarantine = pa.table({"offset": [1, 2, 3], "kafka_timestamp": [t, t.replace(minute=7), t]})
    write_deltalake(conf.table_path("silver/orders_quarantine"), quarantine.slice(0, 2))
    write_deltalake(conf.table_path("silver/orders_quarantine"), quarantine.slice(2), mode="append")
    results = pa.table(
        {
            "suite": ["events", "events", "events", "orders", "gold"],
            "table": ["silver/order_events"] * 3 + ["silver/orders", "gold/late_events"],
            "run_at": [t, t.replace(hour=11), t.replace(hour=11), t, t],
            "success": [False, True, False, True, False],
        }
    )
    write_deltalake(conf.table_path("quality/results"), results)
    tables = ["silver/order_events", "silver/orders", "silver/orders_quarantine"]
    samples = {
        (s.name, tuple(s.labels.values())): s.value
        for family in job_metrics(conf, tables, []).registry.collect()
        for s in family.samples
    }
    at = ("silver/orders_quarantine",)
    assert samples[("lakehouse_table_rows", at)] == 3
    assert samples[("lakehouse_table_version", at)] == 1
    assert samples[("lakehouse_table_newest_event_timestamp_seconds", at)] == (
        t.replace(minute=7).timestamp()
    )
    assert ("lakehouse_table_rows", ("silver/order_events",)) not in samples  # not created
    # the newest run of each suite on the job's tables: one failed expectation fails it
    assert {k[1]: v for k, v in samples.items() if k[0] == "lakehouse_quality_suite_success"} == {
        ("events", "silver/order_events"): 0,
        ("orders", "silver/orders"): 1,
    }
