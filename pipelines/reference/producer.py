"""`lakehouse produce`: send the reference stream to Kafka with an idempotent producer."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from confluent_kafka import KafkaError, Producer

from pipelines import logs
from pipelines.config import LakehouseConf
from pipelines.errors import JobFailedError
from pipelines.kafka import client_settings, ensure_topic
from pipelines.reference.orders_stream import StreamPlan, StreamRecord


class ProduceError(JobFailedError):
    """Kafka refused or lost a record; the message names the topic and partition."""


@dataclass(frozen=True)
class DeliveredRecord(StreamRecord):
    """A record Kafka acknowledged, at its offset."""

    offset: int = field(kw_only=True)


@dataclass
class ProduceReport:
    topic: str
    counts: dict[str, int]
    seconds: float
    delivered: list[DeliveredRecord] = field(default_factory=list)

    def summary(self) -> dict:
        return {"topic": self.topic, "seconds": round(self.seconds, 2), **self.counts}


PRODUCER_SETTINGS = {"enable.idempotence": True, "acks": "all", "log_level": 3}
PRODUCER_SETTINGS |= {"linger.ms": 20, "batch.size": 1_000_000, "compression.type": "lz4"}
PRODUCER_SETTINGS |= {"queue.buffering.max.messages": 500_000}
# records up to the local broker's limit (message.max.bytes in kafka-server.properties), not 1 MB
PRODUCER_SETTINGS |= {"message.max.bytes": 10_485_760}


def produce_plan(
    conf: LakehouseConf,
    plan: StreamPlan,
    topic: str,
    *,
    track: bool = True,
    progress: bool = False,
    rate: float | None = None,
) -> ProduceReport:
    """Send every record of `plan` in order, at most `rate` per second of wall time if given;
    return what Kafka acknowledged, with offsets. Kafka timestamps are the send times."""
    stream = conf.stream(conf.producer.stream)
    ensure_topic(
        conf,
        topic,
        plan.options.partitions,
        stream.replication_factor,
        stream.min_insync_replicas,
    )
    producer = Producer({**client_settings(conf), **PRODUCER_SETTINGS})
    offsets: dict[int, int] = {}  # record index -> offset (in the partition the record names)
    errors: list[str] = []

    def on_delivery(index: int, err: KafkaError | None, msg) -> None:
        if err is not None:
            errors.append(f"{topic}[{msg.partition()}]: {err.str()}")
        elif track:
            offsets[index] = msg.offset()

    say = logs.get("produce").info
    started = last_report = time.monotonic()
    total = len(plan.records)
    for i, rec in enumerate(plan.records):
        while rate and (ahead := started + i / rate - time.monotonic()) > 0:
            # waiting serves delivery reports, as sending does; librdkafka waits whole
            # milliseconds, so a shorter wait returned at once and spun a core at 1,000/s and more
            producer.poll(max(ahead, 0.001))
        while True:
            try:
                producer.produce(
                    topic,
                    value=rec.value,
                    key=rec.key,
                    partition=rec.partition,
                    headers=list(rec.headers) or None,
                    on_delivery=partial(on_delivery, i),
                )
                break
            except BufferError:
                producer.poll(0.05)
        if i % 1000 == 0:
            producer.poll(0)
            now = time.monotonic()
            if progress and now - last_report >= 2:
                say(f"{i:,}/{total:,} records ({i / (now - started):,.0f}/s)")
                last_report = now
        if errors:
            break
    remaining = producer.flush(60)
    if errors or remaining:
        raise ProduceError(
            f"Kafka did not acknowledge {len(errors) + remaining} record(s) of topic {topic!r} on "
            f"{conf.kafka.bootstrap_servers}: {'; '.join(errors[:3]) or 'timed out'}"
        )
    seconds = time.monotonic() - started
    tracked = plan.records if track else []
    delivered = [DeliveredRecord(**vars(r), offset=offsets[i]) for i, r in enumerate(tracked)]
    if progress:
        speed = total / max(seconds, 1e-9)
        say(f"{total:,} records to {topic} in {seconds:.1f}s ({speed:,.0f}/s)")
    return ProduceReport(topic, plan.counts(), seconds, delivered)


def write_manifest(report: ProduceReport, path: Path) -> None:
    """One JSON line per record (partition, offset, kind, event_id, key, value as latin-1 text)."""
    with path.open("w") as f:
        for d in report.delivered:
            row = {k: getattr(d, k) for k in ("partition", "offset", "kind", "event_id", "late")}
            row["key"] = None if d.key is None else d.key.decode("latin-1")
            row["value"] = d.value.decode("latin-1")
            f.write(json.dumps(row) + "\n")
