"""A query that Kafka's client stopped for want of a broker: one line naming the servers."""

from __future__ import annotations

from pipelines.config import load_config
from pipelines.errors import ExitCode
from pipelines.kafka import KafkaUnreachableError, unreachable_failure

SPARK_TEXT = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
    "java.util.concurrent.ExecutionException: org.apache.kafka.common.errors.TimeoutException: "
    "Timed out waiting for a node assignment. Call: listNodes"
)


def test_a_kafka_timeout_names_the_servers_the_timeout_and_the_way_back():
    conf = load_config("test").updated({"kafka.bootstrap_servers": "h1:9092,h2:9092"})
    error = unreachable_failure(RuntimeError(SPARK_TEXT), conf, "bronze ingest of topic 't'")
    assert isinstance(error, KafkaUnreachableError)
    assert error.exit_code == ExitCode.UNREACHABLE
    assert str(error).startswith(
        "bronze ingest of topic 't' stopped: no Kafka broker answered at h1:9092,h2:9092 within 15s"
    )
    assert "\n" not in str(error)
    fetch = RuntimeError("java.util.concurrent.TimeoutException: Cannot fetch record for offset 7")
    assert isinstance(unreachable_failure(fetch, conf, "x"), KafkaUnreachableError)


def test_any_other_failure_is_left_to_the_caller():
    conf = load_config("test")
    assert unreachable_failure(RuntimeError("DELTA_CONCURRENT_APPEND"), conf, "x") is None
