"""Prometheus wiring that needs no job: the file_sd targets, Spark's metric settings, and the
alert rules (every metric they use is one the jobs export; promtool, where installed)."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from pipelines.config import REPO_ROOT, load_config
from pipelines.spark_conf import metrics_settings
from pipelines.streaming.metrics import JobMetrics

RULES = REPO_ROOT / "conf" / "prometheus" / "lakehouse-alerts.yml"


def test_each_job_has_fixed_ports_written_as_file_sd_target_groups():
    conf = load_config("local")
    groups = conf.metric_targets()
    assert groups[:2] == [
        {"targets": ["127.0.0.1:9411"], "labels": {"job": "lakehouse-bronze-orders", "env": "local"}},
        {"targets": ["127.0.0.1:4051"], "labels": {"job": "spark-bronze-orders", "env": "local",
                                                    "__metrics_path__": "/metrics/prometheus"}},
    ]  # fmt: skip
    assert len(groups) == 8
    settings = metrics_settings(conf, "silver-orders")
    assert (settings["spark.ui.enabled"], settings["spark.ui.port"]) == ("true", "4052")
    assert settings["spark.sql.streaming.metricsEnabled"] == "true"
    assert metrics_settings(conf, "silver-clicks") == {}  # no port: no UI
    assert metrics_settings(load_config("test"), "silver-orders") == {}  # metrics off


def exported() -> set[str]:
    """Every sample name a job's metrics can have."""
    families = JobMetrics(load_config("test"), []).registry.collect()
    return {f.name + ("_total" if f.type == "counter" else "") for f in families}


def test_the_alert_rules_use_only_metrics_the_jobs_export():
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    assert [r["alert"] for r in rules] == [
        "LakehouseJobDown",
        "LakehouseTableStale",
        "LakehouseKafkaLagGrowing",
        "LakehouseQualitySuiteFailed",
        "LakehouseBatchesStalled",
    ]
    used = {name for r in rules for name in re.findall(r"lakehouse_[a-z_]+", r["expr"])}
    assert used <= exported(), used - exported()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool (Debian: prometheus)")
def test_promtool_accepts_the_alert_rules():
    done = subprocess.run(
        ["promtool", "check", "rules", str(RULES)], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS: 5 rules found" in done.stdout
