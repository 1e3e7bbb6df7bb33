"""A secured broker: SASL_SSL with SCRAM-SHA-512, its certificate verified by every client."""

from __future__ import annotations

import json
import secrets
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import yaml
from pydantic import SecretStr

from pipelines.config import REPO_ROOT, SASL_PASSWORD_ENV, load_config
from pipelines.errors import ExitCode
from pipelines.kafka import KafkaDeniedError, admin_client, kafka_failure, spark_kafka_options
from pipelines.layers.bronze import bronze_tables
from pipelines.layers.gold import gold_tables, seed_dimensions
from pipelines.local import broker
from pipelines.local.jars import java_executable
from pipelines.local.tls import make_ca
from pipelines.orchestration.runs import read_runs
from tests import helpers
from tests.conftest import cluster_ports, subprocess_env
from tests.integration.test_gold import gold_oracle, seeds, table
from tests.integration.test_silver import TWISTS, assert_silver_matches, oracle

# one worker runs the module, so its cluster starts once (pytest-xdist `--dist loadgroup`)
pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("kafka_secured")]

# the pipeline job through bronze, silver and gold until the topic is drained
SPEC = """
name: orders-secured
parameters: [{name: env, default: test}]
job_clusters:
  - job_cluster_key: local
    new_cluster: {spark_version: "4.2.0", num_workers: 0, spark_conf: {spark.master: "local[2]"}}
tasks:
  - task_key: pipeline
    job_cluster_key: local
    spark_python_task:
      python_file: ROOT/pipelines/jobs/pipeline_job.py
      parameters: ["--env", "{{job.parameters.env}}", "--once"]
"""

# bronze alone, retried for ever every second, as a continuous spec would
RETRIED_SPEC = """
name: bronze-retried
parameters: [{name: env, default: test}]
tasks:
  - task_key: bronze
    spark_python_task:
      python_file: ROOT/pipelines/jobs/bronze_job.py
      parameters: ["--env", "{{job.parameters.env}}", "--once"]
    max_retries: -1
    min_retry_interval_millis: 1000
"""


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory):
    """A SASL_SSL cluster of three brokers (SCRAM-SHA-512, its own CA, replicating over SASL_SSL
    as their own user, controllers over mutual TLS), started once for the module, and the `test`
    environment pointed at it in a configuration folder of its own: topics with 3 replicas and
    min.insync.replicas 2, the password only in LAKEHOUSE_KAFKA_SASL_PASSWORD, Spark's event log
    on (what its UI and History Server show)."""
    password = f"pw-{secrets.token_urlsafe(18)}"
    base = tmp_path_factory.mktemp("secured")
    port, controller_port = cluster_ports(3)
    tree = yaml.safe_load((REPO_ROOT / "conf" / "test.yaml").read_text())
    tree["kafka"] = {
        "bootstrap_servers": ",".join(f"127.0.0.1:{port + i}" for i in range(3)),
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_username": "lakehouse-app",
        "ssl_ca_location": str(base / "kafka" / "security" / "tls" / "ca.pem"),
    }
    tree["streams"]["orders"] |= {"replication_factor": 3, "min_insync_replicas": 2}
    tree["local_broker"] |= {
        "brokers": 3,
        "security_protocol": "SASL_SSL",
        "port": port,
        "controller_port": controller_port,
        "data_dir": str(base / "kafka"),
    }
    (base / "events").mkdir()
    tree["spark"]["extra"] = {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": f"file://{base / 'events'}",
        "spark.eventLog.compress": "false",  # Spark 4 compresses it: a byte search would miss
    }
    tree["storage"] = {"root": str(base / "lake")}
    (base / "conf").mkdir()
    (base / "conf" / "test.yaml").write_text(yaml.safe_dump(tree))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SASL_PASSWORD_ENV, password)
        mp.setenv("LAKEHOUSE_CONF_DIR", str(base / "conf"))
        conf = load_config("test")
        broker.start(conf, quiet=True)
        try:
            yield conf, password, base
        finally:
            broker.stop(conf, quiet=True)


def run_cli(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def files_holding(secret: str, *folders: Path) -> list[str]:
    """Every file under `folders` whose bytes hold `secret`."""
    needle = secret.encode()
    return [
        str(f)
        for folder in folders
        for f in Path(folder).rglob("*")
        if f.is_file() and needle in f.read_bytes()
    ]


def delta_tables_holding(spark, secret: str, root: Path) -> list[str]:
    """Every Delta table under `root` with a row that holds `secret` in any column (read through
    Delta: compressed Parquet pages would hide it from a byte search)."""
    from pyspark.sql import functions as F

    found = []
    for log in sorted(Path(root).rglob("_delta_log")):
        rows = spark.read.format("delta").load(str(log.parent))
        as_text = F.to_json(F.struct(*[F.col(f"`{c}`") for c in rows.columns]))
        if rows.where(as_text.contains(secret)).limit(1).count():
            found.append(str(log.parent))
    return found


def test_produce_then_bronze_silver_gold_over_sasl_ssl_are_exact_and_the_password_is_nowhere(
    spark, secured, tmp_path
):
    """confluent-kafka produces over SASL_SSL, the job runner runs the pipeline job (Spark's Kafka
    source) over it: bronze holds every acknowledged record, silver and gold equal their
    oracles. Then the password is in no file of the storage root (tables, checkpoints, progress
    table, `_jobs/runs`, task logs), of the broker's folder, of Spark's event log (its environment
    page and SQL plans), in no Delta table's rows, and in no console output."""
    conf, password, base = secured
    conf = conf.updated(
        {
            "storage.root": str(tmp_path / "lake"),
            "streams.orders.topic": f"orders.secured.{uuid.uuid4().hex[:10]}",
        }
    )
    env = subprocess_env(conf, LAKEHOUSE_CONF_DIR=str(base / "conf"))
    console = {"status": run_cli(env, "kafka", "status"), "config": run_cli(env, "config")}
    assert console["status"].returncode == 0, console["status"].stderr
    assert "SASL_SSL" in console["config"].stdout and "**********" in console["config"].stdout

    report = helpers.produce(conf, 200, 31, **TWISTS)
    # acknowledged by all in-sync replicas (acks=all, at least 2): the brokers replicate over
    # SASL_SSL as their own user
    topic = admin_client(conf).list_topics(conf.streams["orders"].topic, timeout=10)
    assert {
        p: (sorted(m.replicas), sorted(m.isrs))
        for p, m in topic.topics[conf.streams["orders"].topic].partitions.items()
    } == {p: ([1, 2, 3], [1, 2, 3]) for p in range(conf.streams["orders"].partitions)}
    seed_dimensions(spark, conf)
    spec = tmp_path / "secured.yaml"
    spec.write_text(SPEC.replace("ROOT", str(REPO_ROOT)))
    # the job's lines as JSON, with the project's debug lines and Spark's info lines among them
    logged = {"LAKEHOUSE__LOG__FORMAT": "json", "LAKEHOUSE__LOG__LEVEL": "DEBUG"}
    logged["LAKEHOUSE__SPARK__LOG_LEVEL"] = "INFO"
    console["job"] = run_cli(env | logged, "jobs", "run", str(spec), "--param", "env=test")
    assert console["job"].returncode == 0, console["job"].stdout[-3000:] + console["job"].stderr

    stream = conf.streams["orders"]
    raw = spark.read.format("delta").load(bronze_tables(conf, stream).raw)
    rows = raw.select("partition", "offset", "key", "value").collect()
    held = sorted((r[0], r[1], r[2], bytes(r[3])) for r in rows)
    assert held == sorted((d.partition, d.offset, d.key, d.value) for d in report.delivered)
    expected = oracle(report)
    assert_silver_matches(spark, conf, expected)
    revenue, countries = gold_oracle(
        (list(expected["events"].values()), seeds(conf, "products"), seeds(conf, "customers"))
    )
    gold = gold_tables(conf)
    assert table(spark, gold.aggregates["gold/revenue_by_category_1m"]) == revenue
    assert table(spark, gold.aggregates["gold/orders_by_country_5m"]) == countries
    [run] = read_runs(conf)
    assert (run["task"], run["state"]) == ("pipeline", "SUCCESS")
    # every line of the task is JSON (but its command and the JVM launcher's), Python's and the JVM's alike,
    # each naming its run and task; a batch's progress also its query and batch
    launcher = ("$ ", "WARNING: Using incubator modules", "Picked up JAVA_TOOL_OPTIONS")
    lines = Path(run["log_path"]).read_text().splitlines()
    parsed = [json.loads(line) for line in lines if not line.startswith(launcher)]
    assert {(p["run_id"], p["task"]) for p in parsed} == {(str(run["run_id"]), "pipeline")}
    loggers = {p["logger"].split(".")[0] for p in parsed}
    assert {"lakehouse", "org"} <= loggers, loggers
    batches = [p for p in parsed if p["logger"] == "lakehouse.progress" and "rows in" in p["msg"]]
    assert [(p["batch_id"], len(p["query_id"])) for p in batches[:1]] == [(0, 36)], batches[:3]

    # the password went through Spark's Kafka source (in its JAAS option) and nowhere else
    assert password in spark_kafka_options(conf)["kafka.sasl.jaas.config"]
    events = list((base / "events").iterdir())
    assert len(events) == 1, events  # the task's event log: its environment page, its plans
    assert files_holding(password, conf.root, base / "kafka", base / "events", tmp_path) == []
    # the search reads what the event log holds: the run's topic, in its Kafka source's plans
    (log,) = [f for f in (base / "events").rglob("events_*") if f.is_file()]
    assert files_holding(conf.streams["orders"].topic, base / "events") == [str(log)]
    # the search finds what is there: the brokers' own password, in their server.properties
    own = (base / "kafka" / "security" / "broker.pass").read_text().strip()
    assert sorted(files_holding(own, base / "kafka")) == [
        *(str(base / "kafka" / f"node-{i}" / "server.properties") for i in (1, 2, 3)),
        str(base / "kafka" / "security" / "broker.pass"),
    ]
    assert delta_tables_holding(spark, password, conf.root) == []
    for name, done in console.items():
        assert password not in done.stdout + done.stderr, name


def test_a_wrong_password_or_an_untrusted_certificate_fails_fast_with_one_line_and_no_retry(
    spark, secured, tmp_path
):
    """confluent-kafka (the producer) and Spark's Kafka source each refuse on the first try, with
    one line that names the mechanism and the servers; exit code 7; `kafka start` with a new
    password rotates it on the running cluster; a job runner task retried for ever is tried
    once."""
    conf, password, base = secured
    conf = conf.updated({"storage.root": str(tmp_path / "lake")})
    servers = conf.kafka.bootstrap_servers
    other_ca = make_ca(java_executable(), tmp_path / "other-ca", "some other CA")
    env = subprocess_env(conf, LAKEHOUSE_CONF_DIR=str(base / "conf"))
    wrong = {**env, SASL_PASSWORD_ENV: "not-" + password}
    untrusted = {**env, "LAKEHOUSE__KAFKA__SSL_CA_LOCATION": str(other_ca)}
    login = f"Kafka at {servers} refused the SCRAM-SHA-512 login of user 'lakehouse-app'"
    certificate = (
        f"the TLS certificate of Kafka at {servers} (SASL_SSL with SCRAM-SHA-512) is not trusted"
    )

    for child_env, says in ((wrong, login), (untrusted, certificate)):
        started = time.monotonic()
        done = run_cli(child_env, "produce", "--orders", "5")
        lines = done.stderr.strip().splitlines()
        assert (done.returncode, len(lines)) == (ExitCode.DENIED, 1), done.stderr
        assert lines[0].startswith(f"error: {says}"), lines
        refused_in = time.monotonic() - started
        print(f"producer refused in {refused_in:.1f}s")
        assert refused_in < conf.kafka.request_timeout_s  # refused, not waited out as unreachable

    # Spark's own Kafka source, on the same refusals
    wrong_password = conf.kafka.model_copy(update={"sasl_password": SecretStr("not-" + password)})
    for bad, says in (
        (conf.model_copy(update={"kafka": wrong_password}), login),
        (conf.updated({"kafka.ssl_ca_location": str(other_ca)}), certificate),
    ):
        source = spark.read.format("kafka").options(**spark_kafka_options(bad))
        started = time.monotonic()
        with pytest.raises(Exception) as caught:
            source.option("subscribe", "orders.anything").load().count()
        refused_in = time.monotonic() - started
        print(f"Spark's Kafka source refused in {refused_in:.1f}s")
        assert refused_in < conf.kafka.request_timeout_s
        failure = kafka_failure(caught.value, bad, "bronze ingest")
        assert isinstance(failure, KafkaDeniedError), caught.value
        assert str(failure).startswith(f"bronze ingest stopped: {says}"), failure

    # a new password in the environment and `kafka start` rotate it on the running cluster
    rotated = f"rotated-{secrets.token_urlsafe(12)}"
    for new, old in ((rotated, password), (password, rotated)):  # and back, for the module
        with_new = conf.kafka.model_copy(update={"sasl_password": SecretStr(new)})
        broker.start(conf.model_copy(update={"kafka": with_new}), quiet=True)
        if new == rotated:
            done = run_cli({**env, SASL_PASSWORD_ENV: new}, "produce", "--orders", "2")
            assert done.returncode == 0, done.stderr
            done = run_cli({**env, SASL_PASSWORD_ENV: old}, "produce", "--orders", "2")
            assert done.returncode == ExitCode.DENIED, done.stderr

    # a task retried for ever is tried once
    spec = tmp_path / "retried.yaml"
    spec.write_text(RETRIED_SPEC.replace("ROOT", str(REPO_ROOT)))
    done = run_cli(wrong, "jobs", "run", str(spec), "--param", "env=test")
    assert done.returncode == ExitCode.JOB_FAILED, done.stderr
    (attempt,) = [r for r in read_runs(conf) if r["task"] == "bronze"]
    assert (attempt["state"], attempt["exit_code"]) == ("FAILED", ExitCode.DENIED), attempt
    assert login in attempt["message"], attempt
    assert "bronze: not retried" in done.stderr, done.stderr
