"""Kafka clients and options, built from configuration; the SASL password only from the environment."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import Consumer, IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from pipelines.config import (
    SASL_PASSWORD_ENV,
    SECRET_PATTERN,
    InvalidConfigError,
    KafkaConf,
    LakehouseConf,
)
from pipelines.errors import ConfigError, DeniedError, UnreachableError


class KafkaAccess(Protocol):
    """What Kafka's clients read of the configuration: a `LakehouseConf`, or what `kafka_access`
    resolves of it for code that is not handed the whole of it."""

    @property
    def kafka(self) -> KafkaConf: ...
    @property
    def ssl_ca_file(self) -> Path | None: ...
    @property
    def source(self) -> str: ...  # the configuration file, named in messages


@dataclass(frozen=True)
class ResolvedKafka:
    kafka: KafkaConf
    ssl_ca_file: Path | None
    source: str


def kafka_access(conf: LakehouseConf) -> ResolvedKafka:
    """The Kafka part of `conf`, resolved at the edge."""
    return ResolvedKafka(conf.kafka, conf.ssl_ca_file, conf.source)


class KafkaUnreachableError(UnreachableError):
    """No broker answered at the configured bootstrap servers."""


class KafkaDeniedError(DeniedError):
    """The broker refused the login, or its TLS certificate is not trusted."""


class TopicMissingError(ConfigError):
    """The topic a job reads does not exist."""


def sasl_password(conf: KafkaAccess) -> str:
    """The SASL password, from the environment only."""
    if conf.kafka.sasl_password is None:
        raise InvalidConfigError(
            f"kafka.sasl_mechanism is {conf.kafka.sasl_mechanism} in {conf.source} but "
            f"{SASL_PASSWORD_ENV} is not set: export the password in that environment variable"
        )
    return conf.kafka.sasl_password.get_secret_value()


def client_settings(conf: KafkaAccess) -> dict[str, str]:
    """librdkafka settings (confluent-kafka) for the configured cluster."""
    k = conf.kafka
    settings = {"bootstrap.servers": k.bootstrap_servers, "security.protocol": k.security_protocol}
    if k.sasl_mechanism:
        settings["sasl.mechanism"] = k.sasl_mechanism
        settings["sasl.username"] = k.sasl_username or ""
        settings["sasl.password"] = sasl_password(conf)
    if conf.ssl_ca_file:
        settings["ssl.ca.location"] = str(conf.ssl_ca_file)
    return settings


def spark_kafka_options(conf: KafkaAccess) -> dict[str, str]:
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
        secret = sasl_password(conf).replace('"', '\\"')
        options["kafka.sasl.mechanism"] = k.sasl_mechanism
        options["kafka.sasl.jaas.config"] = (
            f"org.apache.kafka.common.security.{login} required "
            f'username="{user}" password="{secret}";'
        )
    if conf.ssl_ca_file:
        options["kafka.ssl.truststore.type"] = "PEM"
        options["kafka.ssl.truststore.location"] = str(conf.ssl_ca_file)
    return options


def redacted(options: dict[str, str]) -> dict[str, str]:
    """Options fit for a log line: secrets replaced."""
    return {k: "***" if re.search(SECRET_PATTERN, k) else v for k, v in options.items()}


def admin_client(
    conf: KafkaAccess,
    timeout_s: float | None = None,
    on_error: Callable[[KafkaError], None] | None = None,
) -> AdminClient:
    timeout_ms = int((timeout_s or conf.kafka.request_timeout_s) * 1000)
    # librdkafka's own connection chatter is silenced: failures surface as our own errors.
    settings: dict[str, Any] = {**client_settings(conf), "socket.timeout.ms": timeout_ms}
    settings["log_level"] = 0
    return AdminClient(settings | ({"error_cb": on_error} if on_error else {}))


def denied(conf: KafkaAccess, what: str, *, login: bool, detail: str = "") -> KafkaDeniedError:
    """The one line for a refused login (`login`) or an untrusted broker certificate."""
    k = conf.kafka
    if login:
        why = (
            f"Kafka at {k.bootstrap_servers} refused the {k.sasl_mechanism} login of user "
            f"{k.sasl_username!r} ({k.security_protocol}): check the password in {SASL_PASSWORD_ENV} and "
            f"kafka.sasl_username in {conf.source}"
        )
    else:
        trusted = conf.ssl_ca_file or "the system's CAs"
        how = f"{k.security_protocol}{f' with {k.sasl_mechanism}' if k.sasl_mechanism else ''}"
        why = (
            f"the TLS certificate of Kafka at {k.bootstrap_servers} ({how}) is not trusted"
            f"{detail}: kafka.ssl_ca_location in {conf.source} ({trusted}) must hold the CA that "
            "signed it"
        )
    return KafkaDeniedError(f"{what}{why}. Not retried: the same settings fail the same way.")


def check_reachable(conf: KafkaAccess, timeout_s: float | None = None) -> None:
    """Raise KafkaUnreachableError naming the address when no broker answers, and
    KafkaDeniedError at once when one refuses the login or is not trusted."""
    timeout = timeout_s or conf.kafka.request_timeout_s
    refusals: list[KafkaError] = []
    admin = admin_client(conf, timeout, on_error=refusals.append)
    deadline = time.monotonic() + timeout
    while True:
        try:
            admin.list_topics(timeout=max(0.1, min(1.0, deadline - time.monotonic())))
            return
        except KafkaException as e:
            admin.poll(0)  # serves error_cb: librdkafka reports a refusal only there
            if any(r.code() == KafkaError._AUTHENTICATION for r in refusals):
                raise denied(conf, "", login=True) from None
            # librdkafka reports every failed TLS handshake as _SSL (a plaintext listener, a
            # node going down mid-handshake): only a certificate it refused is final
            if any(r.code() == KafkaError._SSL and _UNTRUSTED in r.str() for r in refusals):
                raise denied(conf, "", login=False) from None
            if time.monotonic() < deadline:
                continue
            raise KafkaUnreachableError(
                f"no Kafka broker answered at {conf.kafka.bootstrap_servers} within {timeout:g}s "
                f"(kafka.bootstrap_servers in {conf.source}): {e.args[0].str() if e.args else e}. "
                "Start the local one with `lakehouse kafka start`, or point the configuration at "
                "yours."
            ) from None


# What librdkafka says when it refused the broker's certificate (untrusted, or not naming it).
_UNTRUSTED = "certificate verify failed"

# What Kafka's client (and Spark's consumer of it) say when no broker answered in time.
KAFKA_TIMEOUTS = (
    "org.apache.kafka.common.errors.timeoutexception",
    "cannot fetch record for offset",
)


# What Kafka's Java client says when the broker refused the login, or its certificate.
KAFKA_LOGIN_REFUSED = "saslauthenticationexception"
KAFKA_TLS_REFUSED = "sslauthenticationexception"
KAFKA_NAME_MISMATCH = ("no subject alternative", "no name matching")


def kafka_failure(
    e: Exception, conf: KafkaAccess, what: str
) -> KafkaUnreachableError | KafkaDeniedError | None:
    """A query that Kafka's client stopped because no broker answered, or one refused the login or
    was not trusted: one line naming the servers (None for any other failure)."""
    text = str(e).lower()
    if KAFKA_LOGIN_REFUSED in text:
        return denied(conf, f"{what} stopped: ", login=True)
    if KAFKA_TLS_REFUSED in text:
        mismatch = any(marker in text for marker in KAFKA_NAME_MISMATCH)
        detail = (
            " for the address connected to (the certificate does not name it)" if mismatch else ""
        )
        return denied(conf, f"{what} stopped: ", login=False, detail=detail)
    if not any(marker in text for marker in KAFKA_TIMEOUTS):
        return None
    return KafkaUnreachableError(
        f"{what} stopped: no Kafka broker answered at {conf.kafka.bootstrap_servers} within "
        f"{conf.kafka.request_timeout_s}s (kafka.request_timeout_s; kafka.bootstrap_servers in "
        f"{conf.source}). Nothing is lost: restarted, it resumes where its checkpoint says (a "
        "continuous job spec's retries restart it)."
    )


def ensure_topic(
    conf: KafkaAccess,
    topic: str,
    partitions: int,
    replication: int,
    min_insync_replicas: int | None = None,
    settings: dict[str, str] | None = None,
) -> bool:
    """Create the topic if it is missing (with `min.insync.replicas` if given, and the topic
    `settings`, e.g. cleanup.policy); True when it was created."""
    check_reachable(conf)
    admin = admin_client(conf)
    if topic in admin.list_topics(timeout=conf.kafka.request_timeout_s).topics:
        return False
    config = dict(settings or {})
    if min_insync_replicas is not None:
        config["min.insync.replicas"] = str(min_insync_replicas)
    futures = admin.create_topics([NewTopic(topic, partitions, replication, config=config)])
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
    # next offset a consumer can read: the log end offset, or under read_committed the last
    # stable offset (no record of a transaction still open is readable from there on)
    high: int


def _partitions(conf: KafkaAccess, topic: str, admin: AdminClient | None = None) -> list[int]:
    """The partitions of `topic`, or TopicMissingError naming it and the broker."""
    timeout = conf.kafka.request_timeout_s
    meta = (admin or admin_client(conf)).list_topics(topic, timeout=timeout).topics.get(topic)
    if meta is None or meta.error is not None or not meta.partitions:
        raise TopicMissingError(
            f"topic {topic!r} does not exist on {conf.kafka.bootstrap_servers}: create it "
            f"(`lakehouse produce` does) or fix the stream's topic in {conf.source}"
        )
    return sorted(meta.partitions)


def topic_watermarks(
    conf: KafkaAccess, topic: str, isolation_level: str = "read_committed"
) -> list[PartitionWatermarks]:
    """Low and high watermarks of every partition of `topic`, the high one as a consumer of
    `isolation_level` sees it (read_committed: the last stable offset)."""
    check_reachable(conf)
    partitions = _partitions(conf, topic)
    own = {"group.id": "lakehouse-watermarks", "enable.auto.commit": False, "log_level": 0}
    own["isolation.level"] = isolation_level
    consumer = Consumer({**client_settings(conf), **own})
    timeout = conf.kafka.request_timeout_s
    found = []
    try:
        for p in partitions:
            try:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout)
            except KafkaException as e:  # the partition's leader did not answer (moving, down)
                raise KafkaUnreachableError(
                    f"Kafka at {conf.kafka.bootstrap_servers} did not give the offsets of topic "
                    f"{topic!r} partition {p} within {timeout}s (kafka.request_timeout_s in "
                    f"{conf.source}): {e.args[0].str() if e.args else e}. Nothing is lost: "
                    "restarted, the job resumes where it was."
                ) from None
            found.append(PartitionWatermarks(p, low, high))
        return found
    finally:
        consumer.close()


@dataclass(frozen=True)
class StableOffsets:
    """Where a partition's records stop being readable by a read_committed consumer: at `stable`,
    the first offset of the oldest transaction still open (the log end `end` when none is)."""

    partition: int
    stable: int  # last stable offset
    end: int  # log end offset
    open_since_ms: int | None = None  # Kafka timestamp of the open transaction's first record

    @property
    def held_back(self) -> int:
        """Offsets a read_committed consumer cannot read yet (the transaction's and those after)."""
        return self.end - self.stable


def stable_offsets(
    conf: KafkaAccess, topic: str, admin: AdminClient | None = None
) -> list[StableOffsets]:
    """Each partition of `topic`: its last stable offset and log end offset, and where a
    transaction still open holds records back, when it began (its first record, read
    uncommitted)."""
    admin = admin or admin_client(conf)
    timeout = conf.kafka.request_timeout_s
    parts = _partitions(conf, topic, admin)
    wanted = {TopicPartition(topic, p): OffsetSpec.latest() for p in parts}
    offsets = {}
    for level in (IsolationLevel.READ_UNCOMMITTED, IsolationLevel.READ_COMMITTED):
        listed = admin.list_offsets(wanted, isolation_level=level, request_timeout=timeout)
        offsets[level] = {tp.partition: f.result().offset for tp, f in listed.items()}
    ends, stables = offsets[IsolationLevel.READ_UNCOMMITTED], offsets[IsolationLevel.READ_COMMITTED]
    found = [StableOffsets(p, stables[p], ends[p]) for p in parts]
    if all(s.held_back == 0 for s in found):
        return found
    own = {"group.id": "lakehouse-transactions", "enable.auto.commit": False, "log_level": 0}
    own["isolation.level"] = "read_uncommitted"
    consumer = Consumer({**client_settings(conf), **own})
    try:
        for i, s in enumerate(found):
            if s.held_back:
                consumer.assign([TopicPartition(topic, s.partition, s.stable)])
                first = consumer.consume(1, timeout=min(timeout, 5))
                if first and first[0].error() is None:
                    found[i] = replace(s, open_since_ms=first[0].timestamp()[1])
    finally:
        consumer.close()
    return found
