"""A query that Kafka's client stopped for want of a broker, or because one refused the login or
was not trusted: one line naming the servers."""

from __future__ import annotations

from pipelines.config import REPO_ROOT, load_config
from pipelines.errors import ExitCode
from pipelines.kafka import KafkaDeniedError, KafkaUnreachableError, client_settings, kafka_failure

SPARK_TEXT = (
    "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
    "java.util.concurrent.ExecutionException: org.apache.kafka.common.errors.TimeoutException: "
    "Timed out waiting for a node assignment. Call: listNodes"
)


def test_a_kafka_timeout_names_the_servers_the_timeout_and_the_way_back():
    conf = load_config("test").updated({"kafka.bootstrap_servers": "h1:9092,h2:9092"})
    error = kafka_failure(RuntimeError(SPARK_TEXT), conf, "bronze ingest of topic 't'")
    assert isinstance(error, KafkaUnreachableError)
    assert error.exit_code == ExitCode.UNREACHABLE
    assert str(error).startswith(
        "bronze ingest of topic 't' stopped: no Kafka broker answered at h1:9092,h2:9092 within 15s"
    )
    assert "\n" not in str(error)
    fetch = RuntimeError("java.util.concurrent.TimeoutException: Cannot fetch record for offset 7")
    assert isinstance(kafka_failure(fetch, conf, "x"), KafkaUnreachableError)


def test_any_other_failure_is_left_to_the_caller():
    conf = load_config("test")
    assert kafka_failure(RuntimeError("DELTA_CONCURRENT_APPEND"), conf, "x") is None


def secured_conf(**values):
    return load_config("test").updated(
        {
            "kafka.bootstrap_servers": "h1:9093",
            "kafka.security_protocol": "SASL_SSL",
            "kafka.sasl_mechanism": "SCRAM-SHA-512",
            "kafka.sasl_username": "app",
        }
        | values
    )


LOGIN_TEXT = (
    "An error occurred while calling o86.count.\n: java.util.concurrent.ExecutionException: "
    "org.apache.kafka.common.errors.SaslAuthenticationException: Authentication failed during "
    "authentication due to invalid credentials with SASL mechanism SCRAM-SHA-512"
)
TLS_TEXT = (
    "java.util.concurrent.ExecutionException: "
    "org.apache.kafka.common.errors.SslAuthenticationException: SSL handshake failed\n"
    "Caused by: javax.net.ssl.SSLHandshakeException: No subject alternative names matching IP "
    "address 10.0.0.9 found"
)


def test_a_refused_login_names_mechanism_user_servers_and_the_password_variable_not_the_password():
    conf = secured_conf()
    error = kafka_failure(RuntimeError(LOGIN_TEXT), conf, "bronze ingest of topic 't'")
    assert isinstance(error, KafkaDeniedError) and error.exit_code == ExitCode.DENIED == 7
    assert str(error) == (
        "bronze ingest of topic 't' stopped: Kafka at h1:9093 refused the SCRAM-SHA-512 login of "
        "user 'app' (SASL_SSL): check the password in LAKEHOUSE_KAFKA_SASL_PASSWORD and "
        f"kafka.sasl_username in {conf.source}. Not retried: the same settings fail the same way."
    )


def test_an_untrusted_certificate_names_the_ca_file_and_a_name_mismatch_says_so(tmp_path):
    conf = secured_conf(**{"kafka.ssl_ca_location": str(tmp_path / "ca.pem")})
    error = kafka_failure(RuntimeError(TLS_TEXT), conf, "pipeline")
    assert isinstance(error, KafkaDeniedError)
    assert str(error) == (
        "pipeline stopped: the TLS certificate of Kafka at h1:9093 (SASL_SSL with SCRAM-SHA-512) "
        "is not trusted for the address connected to (the certificate does not name it): "
        f"kafka.ssl_ca_location in {conf.source} ({tmp_path / 'ca.pem'}) must hold the CA that "
        "signed it. Not retried: the same settings fail the same way."
    )


def test_a_relative_ca_location_is_taken_from_the_repository():
    conf = secured_conf(**{"kafka.ssl_ca_location": "certs/ca.pem", "kafka.sasl_mechanism": None})
    assert conf.ssl_ca_file == REPO_ROOT / "certs" / "ca.pem"
    assert client_settings(conf)["ssl.ca.location"] == str(REPO_ROOT / "certs" / "ca.pem")
