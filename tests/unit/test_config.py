from pathlib import Path

import pytest

from pipelines.config import InvalidConfigError, load_config
from pipelines.kafka import redacted, spark_kafka_options


def write(tmp_path: Path, text: str) -> Path:
    f = tmp_path / "custom.yaml"
    f.write_text(text)
    return f


def test_every_shipped_environment_loads():
    for env in ("local", "test", "cluster-example"):
        conf = load_config(env)
        assert conf.stream("orders").bronze_table == "bronze/orders_raw"


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
    conf = load_config(path=f)
    monkeypatch.delenv("LAKEHOUSE_KAFKA_SASL_PASSWORD", raising=False)
    with pytest.raises(InvalidConfigError, match="LAKEHOUSE_KAFKA_SASL_PASSWORD is not set"):
        spark_kafka_options(conf)
    monkeypatch.setenv("LAKEHOUSE_KAFKA_SASL_PASSWORD", "s3cr3t-value")
    options = spark_kafka_options(conf)
    assert 'password="s3cr3t-value"' in options["kafka.sasl.jaas.config"]
    assert "s3cr3t-value" not in str(redacted(options))


def test_trigger_interval_must_be_a_duration(tmp_path):
    f = write(tmp_path, "bronze:\n  trigger_interval: often\n")
    with pytest.raises(
        InvalidConfigError, match=r"bronze.trigger_interval in .*custom.yaml: expected a duration"
    ):
        load_config(path=f)
    ok = write(tmp_path, "bronze:\n  trigger_interval: 500 milliseconds\n")
    assert load_config(path=ok).bronze.trigger_interval == "500 milliseconds"
