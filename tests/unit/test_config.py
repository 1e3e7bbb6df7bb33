import re
from pathlib import Path

import pytest
from pydantic import SecretStr

from pipelines.config import REPO_ROOT, InvalidConfigError, load_config
from pipelines.kafka import redacted, spark_kafka_options
from pipelines.spark_conf import session_settings


def write(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "custom.yaml"
    f.write_text(text)
    return f


def test_every_shipped_environment_loads():
    for file in sorted((REPO_ROOT / "conf").glob("*.yaml")):
        conf = load_config(file.stem)
        assert conf.stream("orders").bronze_table == "bronze/orders_raw"
        assert conf.tables.quality_results == "quality/results"


def test_unknown_key_names_the_key_and_the_file(tmp_path):
    f = write(tmp_path, "kafka:\n  bootstrap_server: x:9092\n")
    with pytest.raises(InvalidConfigError) as e:
        load_config(path=f)
    assert "unknown key 'kafka.bootstrap_server'" in str(e.value)
    assert str(f) in str(e.value)
    assert "bootstrap_servers" in str(e.value)


def test_bad_value_names_the_key_and_the_file(tmp_path):
    f = write(tmp_path, "bronze:\n  max_offsets_per_trigger: lots\n")
    with pytest.raises(
        InvalidConfigError,
        match=r"bronze.max_offsets_per_trigger in .*custom.yaml: expected an integer, got 'lots'",
    ):
        load_config(path=f)


def test_bad_choice_lists_the_allowed_values(tmp_path):
    f = write(tmp_path, "bronze:\n  on_data_loss: ignore\n")
    with pytest.raises(InvalidConfigError, match="'ignore' is not one of fail, record"):
        load_config(path=f)


def test_stream_without_its_table_is_refused(tmp_path):
    f = write(tmp_path, "streams:\n  clicks:\n    topic: clicks\n")
    with pytest.raises(InvalidConfigError, match="missing key 'streams.clicks.bronze_table'"):
        load_config(path=f)


def test_environment_variable_overrides_the_file(tmp_path, monkeypatch):
    f = write(
        tmp_path, "kafka:\n  bootstrap_servers: a:9092\nbronze:\n  max_offsets_per_trigger: 5\n"
    )
    monkeypatch.setenv("LAKEHOUSE__KAFKA__BOOTSTRAP_SERVERS", "b:9092,c:9092")
    monkeypatch.setenv("LAKEHOUSE__BRONZE__MAX_OFFSETS_PER_TRIGGER", "77")
    conf = load_config(path=f)
    assert conf.kafka.bootstrap_servers == "b:9092,c:9092"
    assert conf.bronze.max_offsets_per_trigger == 77


def test_bad_environment_variable_is_named(tmp_path, monkeypatch):
    f = write(tmp_path, "{}\n")
    monkeypatch.setenv("LAKEHOUSE__BRONZE__ON_DATA_LOSS", "maybe")
    with pytest.raises(
        InvalidConfigError, match="environment variable LAKEHOUSE__BRONZE__ON_DATA_LOSS"
    ):
        load_config(path=f)


def test_missing_environment_names_the_file_and_the_choices():
    with pytest.raises(InvalidConfigError, match=r"no configuration file .*prod.yaml.*'local'"):
        load_config("prod")


def test_paths_are_derived_from_one_root(tmp_path):
    conf = load_config(path=write(tmp_path, f"storage:\n  root: {tmp_path}/lake\n"))
    assert conf.table_path("bronze/orders_raw") == f"{tmp_path}/lake/bronze/orders_raw"
    assert (
        conf.checkpoint_path("bronze.orders_raw")
        == f"{tmp_path}/lake/_checkpoints/bronze/orders_raw"
    )


def test_sasl_password_comes_only_from_the_environment_and_is_never_logged(tmp_path, monkeypatch):
    f = write(
        tmp_path,
        "kafka:\n  security_protocol: SASL_SSL\n  sasl_mechanism: SCRAM-SHA-512\n"
        "  sasl_username: lake\n",
    )
    monkeypatch.delenv("LAKEHOUSE_KAFKA_SASL_PASSWORD", raising=False)
    with pytest.raises(InvalidConfigError, match="LAKEHOUSE_KAFKA_SASL_PASSWORD is not set"):
        spark_kafka_options(load_config(path=f))
    monkeypatch.setenv("LAKEHOUSE_KAFKA_SASL_PASSWORD", "s3cr3t-value")
    options = spark_kafka_options(load_config(path=f))
    assert 'password="s3cr3t-value"' in options["kafka.sasl.jaas.config"]
    assert "s3cr3t-value" not in str(redacted(options))


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_spark_hides_every_kafka_option_that_holds_the_password_by_its_key(
    tmp_path, monkeypatch, mechanism
):
    """Spark's UI, event log and plans redact a pair whose key matches its redaction regexes:
    each option carrying the password is caught by its key alone, whatever its value says."""
    f = write(
        tmp_path,
        f"kafka:\n  security_protocol: SASL_SSL\n  sasl_mechanism: {mechanism}\n"
        "  sasl_username: lake\n",
    )
    monkeypatch.setenv("LAKEHOUSE_KAFKA_SASL_PASSWORD", "s3cr3t-value")
    conf = load_config(path=f)
    holding = [k for k, v in spark_kafka_options(conf).items() if "s3cr3t-value" in v]
    assert holding == ["kafka.sasl.jaas.config"]
    settings = session_settings(conf)
    for regex in ("spark.redaction.regex", "spark.sql.redaction.options.regex"):
        assert all(re.search(settings[regex], key) for key in holding), regex
    assert re.search(settings["spark.sql.redaction.options.regex"], "url")  # Spark's default kept


def test_trigger_interval_must_be_a_duration(tmp_path):
    f = write(tmp_path, "bronze:\n  trigger_interval: often\n")
    with pytest.raises(
        InvalidConfigError, match=r"bronze.trigger_interval in .*custom.yaml: expected a duration"
    ):
        load_config(path=f)
    ok = write(tmp_path, "bronze:\n  trigger_interval: 500 milliseconds\n")
    assert load_config(path=ok).bronze.trigger_interval == "500 milliseconds"


def test_environment_text_is_parsed_by_the_type_of_its_key(tmp_path, monkeypatch):
    f = write(tmp_path, "streams:\n  orders:\n    topic: a\n    bronze_table: bronze/orders_raw\n")
    monkeypatch.setenv("LAKEHOUSE__STREAMS__ORDERS__TOPIC", "0123")
    monkeypatch.setenv("LAKEHOUSE__STREAMS__ORDERS__PARTITIONS", "0123")
    monkeypatch.setenv("LAKEHOUSE__KAFKA__SASL_USERNAME", "no")
    monkeypatch.setenv("LAKEHOUSE__SPARK__UI", "true")
    monkeypatch.setenv("LAKEHOUSE__BRONZE__MAX_OFFSETS_PER_TRIGGER", "")
    monkeypatch.setenv("LAKEHOUSE__LOCAL_BROKER__JVM_OPTIONS", "[-XX:TieredStopAtLevel=1, -Xss2m]")
    conf = load_config(path=f)
    assert conf.stream("orders").topic == "0123"
    assert conf.stream("orders").partitions == 123
    assert conf.kafka.sasl_username == "no"
    assert conf.spark.ui is True
    assert conf.bronze.max_offsets_per_trigger is None
    assert conf.local_broker.jvm_options == ["-XX:TieredStopAtLevel=1", "-Xss2m"]
    monkeypatch.setenv("LAKEHOUSE__LOCAL_BROKER__JVM_OPTIONS", "-XX:TieredStopAtLevel=1")
    with pytest.raises(
        InvalidConfigError,
        match=r"local_broker.jvm_options in environment variable LAKEHOUSE__LOCAL_BROKER__JVM",
    ):
        load_config(path=f)


def test_a_variable_sets_one_key_of_a_map_and_keeps_its_siblings(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE__METRICS__PORTS__BRONZE-ORDERS", "9999")
    conf = load_config(path=write(tmp_path, "metrics:\n  enabled: true\n"))
    assert conf.metrics.ports == {
        "bronze-orders": 9999,
        "silver-orders": 9412,
        "gold-orders": 9413,
        "pipeline-orders": 9414,
        "publish-orders": 9415,
    }
    assert conf.origin("metrics.ports.silver-orders") == "default"


def test_a_map_key_from_a_variable_keeps_its_case_unless_written_in_capitals(tmp_path, monkeypatch):
    monkeypatch.setenv(
        "LAKEHOUSE__SPARK__EXTRA__spark.sql.adaptive.coalescePartitions.enabled", "x"
    )
    monkeypatch.setenv("LAKEHOUSE__SPARK__EXTRA__SPARK.SQL.ANSI.ENABLED", "true")
    conf = load_config(path=write(tmp_path, ""))
    assert conf.spark.extra == {
        "spark.sql.adaptive.coalescePartitions.enabled": "x",
        "spark.sql.ansi.enabled": "true",
    }


@pytest.mark.parametrize(
    ("yaml_text", "variable", "value"),
    [("0123", "0123", 123), ("-7", "-7", -7)],
)
def test_an_integer_means_the_same_in_yaml_and_in_a_variable(
    tmp_path, monkeypatch, yaml_text, variable, value
):
    f = write(tmp_path, f"producer:\n  seed: {yaml_text}\n")
    assert load_config(path=f).producer.seed == value
    monkeypatch.setenv("LAKEHOUSE__PRODUCER__SEED", variable)
    assert load_config(path=write(tmp_path, "")).producer.seed == value


@pytest.mark.parametrize("text", ["yes", "on", "1", "y"])
def test_a_boolean_is_true_or_false_in_yaml_and_in_a_variable(tmp_path, monkeypatch, text):
    with pytest.raises(
        InvalidConfigError,
        match=rf"spark.ui in .*custom.yaml: expected true or false, got '?{text}'?",
    ):
        load_config(path=write(tmp_path, f"spark:\n  ui: {text}\n"))
    monkeypatch.setenv("LAKEHOUSE__SPARK__UI", text)
    with pytest.raises(
        InvalidConfigError,
        match=rf"spark.ui in environment variable LAKEHOUSE__SPARK__UI: expected true or false, "
        rf"got '{text}'",
    ):
        load_config(path=write(tmp_path, ""))
    for true in ("true", "True", "TRUE"):
        monkeypatch.setenv("LAKEHOUSE__SPARK__UI", true)
        assert load_config(path=write(tmp_path, f"spark:\n  ui: {true}\n")).spark.ui is True


def test_yaml_values_must_have_the_type_of_their_key(tmp_path):
    with pytest.raises(
        InvalidConfigError, match=r"spark.ui in .*custom.yaml: expected true or false, got 'yes'"
    ):
        load_config(path=write(tmp_path, "spark:\n  ui: 'yes'\n"))


def test_each_key_has_the_bounds_its_meaning_needs(tmp_path):
    f = write(
        tmp_path, "streams:\n  orders:\n    topic: t\n    bronze_table: b/t\n    partitions: 0\n"
    )
    with pytest.raises(
        InvalidConfigError, match=r"streams.orders.partitions in .*custom.yaml: must be >= 1, got 0"
    ):
        load_config(path=f)
    zero = write(tmp_path, "quality:\n  unknown_share_max: 0\n")
    assert load_config(path=zero).quality.unknown_share_max == 0
    with pytest.raises(
        InvalidConfigError, match=r"quality.unknown_share_max in .*custom.yaml: must be <= 1"
    ):
        load_config(path=write(tmp_path, "quality:\n  unknown_share_max: 1.5\n"))


def test_several_problems_are_listed_together(tmp_path):
    f = write(tmp_path, "spark:\n  ui: 1\ncluster:\n  master_port: 70000\n")
    with pytest.raises(InvalidConfigError) as e:
        load_config(path=f)
    assert "2 configuration problems" in str(e.value)
    assert "spark.ui" in str(e.value) and "cluster.master_port" in str(e.value)
    assert "pydantic" not in str(e.value)


def test_unknown_key_in_an_environment_variable_names_the_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE__KAFKA__BOOTSTRAP_SERVER", "x:9092")
    with pytest.raises(
        InvalidConfigError,
        match="unknown key 'kafka.bootstrap_server' in environment variable "
        "LAKEHOUSE__KAFKA__BOOTSTRAP_SERVER; known keys of kafka: bootstrap_servers",
    ):
        load_config(path=write(tmp_path, "{}\n"))


def test_a_password_in_a_file_is_refused(tmp_path):
    f = write(tmp_path, "kafka:\n  sasl_password: hunter2\n")
    with pytest.raises(
        InvalidConfigError, match="kafka.sasl_password in .*secrets come only from the environment"
    ) as e:
        load_config(path=f)
    assert "hunter2" not in str(e.value)


def test_the_password_is_a_secret_absent_from_repr_errors_and_as_dict(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_KAFKA_SASL_PASSWORD", "s3cr3t-value")
    conf = load_config(path=write(tmp_path, "kafka:\n  sasl_mechanism: PLAIN\n"))
    assert isinstance(conf.kafka.sasl_password, SecretStr)
    assert conf.kafka.sasl_password.get_secret_value() == "s3cr3t-value"
    assert "s3cr3t-value" not in repr(conf)
    assert conf.as_dict()["kafka"]["sasl_password"] == "**********"
    assert "s3cr3t-value" not in str(conf.as_dict())
    with pytest.raises(InvalidConfigError) as e:
        conf.updated({"kafka.sasl_password": "0th3r-value", "kafka.request_timeout_s": 0})
    assert "s3cr3t-value" not in str(e.value) and "0th3r-value" not in str(e.value)
    assert conf.updated({"spark.ui": True}).kafka.sasl_password == conf.kafka.sasl_password


def test_updated_sets_dotted_keys_and_checks_them_like_a_file():
    conf = load_config("test")
    new = conf.updated(
        {
            "storage.root": "/tmp/x",
            "bronze.max_offsets_per_trigger": 300,
            "streams.orders.topic": "t",
        }
    )
    assert (new.storage.root, new.bronze.max_offsets_per_trigger) == ("/tmp/x", 300)
    assert new.stream("orders").topic == "t"
    assert new.stream("orders").bronze_table == conf.stream("orders").bronze_table
    assert (new.env, new.source) == (conf.env, conf.source)
    assert conf.storage.root != new.storage.root  # the original is unchanged
    with pytest.raises(
        InvalidConfigError, match=r"bronze.max_offsets_per_trigger in updated\(\): must be >= 1"
    ):
        conf.updated({"bronze.max_offsets_per_trigger": 0})
    with pytest.raises(InvalidConfigError, match="unknown key 'storage.rot'"):
        conf.updated({"storage.rot": "/tmp/x"})


def test_environment_variable_beats_the_file_and_the_file_beats_the_defaults(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEHOUSE_CONF_DIR", str(tmp_path))
    (tmp_path / "staging.yaml").write_text("spark:\n  app_name: from-file\n  master: local[1]\n")
    monkeypatch.setenv("LAKEHOUSE__SPARK__APP_NAME", "from-env")
    conf = load_config("staging")
    assert (conf.env, conf.spark.app_name, conf.spark.master) == ("staging", "from-env", "local[1]")
    assert conf.spark.log_level == "WARN"  # the default


@pytest.mark.parametrize(
    "root, path",
    [
        ("s3a://bucket/lake/", "s3a://bucket/lake/bronze/orders_raw"),
        (
            "abfss://c@a.dfs.core.windows.net/x",
            "abfss://c@a.dfs.core.windows.net/x/bronze/orders_raw",
        ),
        ("gs://bucket", "gs://bucket/bronze/orders_raw"),
    ],
)
def test_a_storage_root_uri_is_a_uri_of_every_table_and_checkpoint(tmp_path, root, path):
    conf = load_config(path=write(tmp_path, f"storage:\n  root: {root}\n"))
    assert (conf.remote, conf.table_path("bronze.orders_raw")) == (True, path)
    assert conf.checkpoint_path("silver/orders") == path.replace(
        "bronze/orders_raw", "_checkpoints/silver/orders"
    )
    assert conf.log_dir == REPO_ROOT / ".lakehouse" / "logs" / conf.env  # logs stay local


@pytest.mark.parametrize(
    "root", ["s3://bucket/lake", "s3n://bucket/x", "file:/x", "http://h/x", "s3a://"]
)
def test_a_storage_root_the_project_cannot_use_is_refused_naming_the_key(tmp_path, root):
    f = write(tmp_path, f"storage:\n  root: {root}\n")
    with pytest.raises(InvalidConfigError) as caught:
        load_config(path=f)
    assert f"storage.root in {f}" in str(caught.value)
    assert "s3:// and s3n:// are not Hadoop's S3 connector: use s3a://" in str(caught.value)
    local = load_config(path=write(tmp_path, "storage:\n  root: data/x:y\n"))
    assert (local.remote, local.root, local.log_dir) == (
        False,
        str(REPO_ROOT / "data" / "x:y"),
        REPO_ROOT / "data" / "x:y" / "_jobs" / "logs",
    )


def test_every_declared_table_has_a_schema_and_name_and_the_names_follow_the_root(tmp_path):
    conf = load_config("local").updated({"storage.root": str(tmp_path)})
    names = conf.table_names()
    assert names == {
        "bronze.orders_raw": f"{tmp_path}/bronze/orders_raw",
        "bronze.orders_raw_gaps": f"{tmp_path}/bronze/orders_raw_gaps",
        "silver.order_events": f"{tmp_path}/silver/order_events",
        "silver.orders": f"{tmp_path}/silver/orders",
        "silver.orders_quarantine": f"{tmp_path}/silver/orders_quarantine",
        "gold.revenue_by_category_1m": f"{tmp_path}/gold/revenue_by_category_1m",
        "gold.orders_by_country_5m": f"{tmp_path}/gold/orders_by_country_5m",
        "gold.late_events": f"{tmp_path}/gold/late_events",
        "gold.late_events_high_water": f"{tmp_path}/gold/late_events_high_water",
        "dimensions.products": f"{tmp_path}/dimensions/products",
        "dimensions.customers": f"{tmp_path}/dimensions/customers",
        "quality.results": f"{tmp_path}/quality/results",
        "system.query_progress": f"{tmp_path}/system/query_progress",
        "system.job_runs": f"{tmp_path}/_jobs/runs",  # tables.names
    }
    settings = session_settings(conf)
    assert settings["spark.sql.catalog.spark_catalog"] == "lakehouse.catalog.LakehouseCatalog"
    declared = {k: v for k, v in settings.items() if k.startswith("spark.lakehouse.table.")}
    assert declared == {f"spark.lakehouse.table.{n}": p for n, p in names.items()}


def test_a_table_name_can_be_chosen_and_two_tables_may_not_share_one(tmp_path):
    conf = load_config("local").updated({"tables.names": {"silver/orders": "silver.order_state"}})
    assert conf.table_names()["silver.order_state"].endswith("/silver/orders")
    assert "silver.orders" not in conf.table_names()
    clash = conf.updated({"tables.names": {"silver/orders": "silver.order_events"}})
    with pytest.raises(InvalidConfigError, match="'silver/order_events' and 'silver/orders'"):
        clash.table_names()
    with pytest.raises(InvalidConfigError, match="tables.names.silver/orders"):
        conf.updated({"tables.names": {"silver/orders": "no schema"}})


def test_a_hive_metastore_needs_its_uri_and_sets_the_session_catalog_behind_the_names():
    hive = load_config("local").updated({"catalog.metastore": "hive"})
    with pytest.raises(InvalidConfigError, match="catalog.hive_metastore_uri is not set"):
        session_settings(hive)
    settings = session_settings(hive.updated({"catalog.hive_metastore_uri": "thrift://m:9083"}))
    assert settings["spark.sql.catalogImplementation"] == "hive"
    assert settings["spark.hadoop.hive.metastore.uris"] == "thrift://m:9083"
    assert settings["spark.sql.warehouse.dir"] == f"{hive.root}/_warehouse"
    assert session_settings(load_config("local"))["spark.sql.catalogImplementation"] == "in-memory"
    with pytest.raises(InvalidConfigError, match="catalog.hive_metastore_uri"):
        hive.updated({"catalog.hive_metastore_uri": "http://m:9083"})
