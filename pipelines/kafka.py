"""Kafka clients and options, built from configuration; the SASL password only from the environment."""

from __future__ import annotations

import re
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from pipelines.config import SASL_PASSWORD_ENV, InvalidConfigError, LakehouseConf
from pipelines.errors import ConfigError, UnreachableError


class KafkaUnreachableError(UnreachableError):
    """No broker answered at the configured bootstrap servers."""


class TopicMissingError(ConfigError):
    """The topic a job reads does not exist."""


def _password(conf: LakehouseConf) -> str:
    if conf.kafka.sasl_password is None:
        raise InvalidConfigError(
            f"kafka.sasl_mechanism is {conf.kafka.sasl_mechanism} in {conf.source} but "
            f"{SASL_PASSWORD_ENV} is not set: export the password in that environment variable"
        )
    return conf.kafka.sasl_password.get_secret_value()


def client_settings(conf: LakehouseConf) -> dict[str, str]:
    """librdkafka settings (confluent-kafka) for the configured cluster."""
    k = conf.kafka
    settings = {"bootstrap.servers": k.bootstrap_servers, "security.protocol": k.security_protocol}
    if k.sasl_mechanism:
        settings["sasl.mechanism"] = k.sasl_mechanism
        settings["sasl.username"] = k.sasl_username or ""
        settings["sasl.password"] = _password(conf)
    if k.ssl_ca_location:
        settings["ssl.ca.location"] = k.ssl_ca_location
    return settings


def spark_kafka_options(conf: LakehouseConf) -> dict[str, str]:
    """`kafka.*` options for Spark's Kafka source (Java client names)."""
    k = conf.kafka
    options = {
        "kafka.bootstrap.servers": k.bootstrap_servers,
        "kafka.security.protocol": k.security_protocol,
        "kafka.request.timeout.ms": str(k.request_timeout_s * 1000),
        "kafka.default.api.timeout.ms": str(k.request_timeout_s * 1000),
    }
    if k.sasl_mechanism:
        login = {"PLAIN": "plain.PlainLoginModule"}.get(k.sasl_mechanism, "scram.ScramLoginModule")
        user = (k.sasl_username or "").replace('"', '\\"')
        secret = _password(conf).replace('"', '\\"')
        options["kafka.sasl.mechanism"] = k.sasl_mechanism
        options["kafka.sasl.jaas.config"] = (
            f"org.apache.kafka.common.security.{login} required "
            f'username="{user}" password="{secret}";'
        )
    if k.ssl_ca_location:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = k.ssl_ca_location
    return options


def redacted(options: dict[str, str]) -> dict[str, str]:
    """Options fit for a log line: secrets replaced."""
    return {k: "***" if re.search("jaas|password|secret", k) else v for k, v in options.items()}


def admin_client(conf: LakehouseConf, timeout_s: float | None = None) -> AdminClient:
    timeout_ms = int((timeout_s or conf.kafka.request_timeout_s) * 1000)
    # librdkafka's own connection chatter is silenced: failures surface as our own errors.
    return AdminClient({**client_settings(conf), "socket.timeout.ms": timeout_ms, "log_level": 0})


def check_reachable(conf: LakehouseConf, timeout_s: float | None = None) -> None:
    """Raise KafkaUnreachableError naming the address when no broker answers."""
    timeout = timeout_s or conf.kafka.request_timeout_s
    try:
        admin_client(conf, timeout).list_topics(timeout=timeout)
    except KafkaException as e:
        raise KafkaUnreachableError(
            f"no Kafka broker answered at {conf.kafka.bootstrap_servers} within {timeout:g}s "
            f"(kafka.bootstrap_servers in {conf.source}): {e.args[0].str() if e.args else e}. "
            "Start the local one with `lakehouse kafka start`, or point the configuration at yours."
        ) from None


# What Kafka's client (and Spark's consumer of it) say when no broker answered in time.
KAFKA_TIMEOUTS = (
    "org.apache.kafka.common.errors.timeoutexception",
    "cannot fetch record for offset",
)


def unreachable_failure(
    e: Exception, conf: LakehouseConf, what: str
) -> KafkaUnreachableError | None:
    """A query that Kafka's client stopped because no broker answered: one line naming the
    servers and how the job comes back (None for any other failure)."""
    text = str(e).lower()
    if not any(marker in text for marker in KAFKA_TIMEOUTS):
        return None
    return KafkaUnreachableError(
        f"{what} stopped: no Kafka broker answered at {conf.kafka.bootstrap_servers} within "
        f"{conf.kafka.request_timeout_s}s (kafka.request_timeout_s; kafka.bootstrap_servers in "
        f"{conf.source}). Nothing is lost: restarted, it resumes where its checkpoint says (a "
        "continuous job spec's retries restart it)."
    )


def ensure_topic(
    conf: LakehouseConf,
    topic: str,
    partitions: int,
    replication: int,
    min_insync_replicas: int | None = None,
) -> bool:
    """Create the topic if it is missing (with `min.insync.replicas` if given); True when it was
    created."""
    check_reachable(conf)
    admin = admin_client(conf)
    if topic in admin.list_topics(timeout=conf.kafka.request_timeout_s).topics:
        return False
    settings = (
        {} if min_insync_replicas is None else {"min.insync.replicas": str(min_insync_replicas)}
    )
    futures = admin.create_topics([NewTopic(topic, partitions, replication, config=settings)])
    try:
        futures[topic].result(timeout=conf.kafka.request_timeout_s)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
        return False
    return True


@dataclass(frozen=True)
class PartitionWatermarks:
    partition: int
    low: int  # first offset still in Kafka (log start offset)
    high: int  # next offset to be written (log end offset)


def topic_watermarks(conf: LakehouseConf, topic: str) -> list[PartitionWatermarks]:
    """Low and high watermarks of every partition of `topic`."""
    check_reachable(conf)
    timeout = conf.kafka.request_timeout_s
    meta = admin_client(conf).list_topics(topic, timeout=timeout).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise TopicMissingError(
            f"topic {topic!r} does not exist on {conf.kafka.bootstrap_servers}: create it "
            f"(`lakehouse produce` does) or fix the stream's topic in {conf.source}"
        )
    own = {"group.id": "lakehouse-watermarks", "enable.auto.commit": False, "log_level": 0}
    consumer = Consumer({**client_settings(conf), **own})
    try:
        return [
            PartitionWatermarks(
                p, *consumer.get_watermark_offsets(TopicPartition(topic, p), timeout)
            )
            for p in sorted(meta.partitions)
        ]
    finally:
        consumer.close()
