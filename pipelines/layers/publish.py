"""The publish job: every change of each gold table of a stream to its compacted Kafka topic,
exactly once, in the order of the table's versions.

One transactional producer per stream (`transactional.id` after `published_topic`) commits each
version's changes, read from the change data feed, with the last version published of every
table; at start it fences earlier producers and resumes after what was committed. How, and what
a consumer sees: docs/guarantees.md, "Gold to Kafka, exactly once".
"""

from __future__ import annotations

import importlib
import json
import signal
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from pyspark.sql import DataFrame, SparkSession

import gold.publication
from pipelines import logs
from pipelines.config import LakehouseConf, PublishConf, duration_seconds
from pipelines.errors import JobFailedError
from pipelines.kafka import (
    KafkaAccess,
    ResolvedKafka,
    check_reachable,
    client_settings,
    ensure_topic,
    kafka_access,
)
from pipelines.layers.gold import gold_tables
from pipelines.streaming import lineage, metrics
from pipelines.streaming.delta import commit_text, commit_time_ms, snapshot
from pipelines.streaming.lease import CheckpointLease
from pipelines.streaming.query import jvm_ignores_sigterm
from pipelines.streaming.sink import cause
from pipelines.streaming.storage import Files

log = logs.get("publish")
PRODUCER_SETTINGS = {"acks": "all", "linger.ms": 5, "compression.type": "lz4", "log_level": 3}
# the Java client's key hashing: a key lands in the partition a Java producer would put it in
PRODUCER_SETTINGS |= {"partitioner": "murmur2_random", "message.max.bytes": 10_485_760}
COMPACTED = {"cleanup.policy": "compact"}
# the published topic stays small: its segments roll daily, so compaction keeps one per table
PUBLISHED_TOPIC_SETTINGS = COMPACTED | {"segment.ms": str(24 * 3600 * 1000)}
ATTEMPTS = 5  # of one transaction, aborted and redone after an error Kafka says to abort on
POSITION_FILE = "published.json"  # in the checkpoint folder: where the job is, for maintenance
HEADER = "lakehouse."  # message headers: lakehouse.table, lakehouse.version, lakehouse.change


class PublisherFencedError(JobFailedError):
    """A newer publisher of the same stream took over (Kafka fenced this one's producer)."""


class PublishedTableChangedError(JobFailedError):
    """The published topic names another table than the one at the path (it was recreated)."""


@dataclass(frozen=True)
class GoldTopic:
    """A gold table and the topic its changes go to."""

    name: str  # as configured, e.g. gold/revenue_by_category_1m
    path: str
    topic: str
    key_columns: tuple[str, ...]


@dataclass(frozen=True)
class Step:
    """What a round publishes of one table: versions `first` to `last`, or its rows at `last`."""

    table: GoldTopic
    table_id: str  # the Delta table's id, recorded with its position
    first: int
    last: int
    snapshot: bool  # never published: its rows at `last`, not its changes

    def describe(self) -> str:
        if self.first == self.last:
            return f"{self.table.name} version {self.last}"
        return f"{self.table.name} versions {self.first}..{self.last}"


@dataclass(frozen=True)
class Position:
    """Every change of table `table` (Delta table id `table_id`) up to `version` is published."""

    table: str
    table_id: str
    version: int


def encode_positions(positions: dict[str, Position], paths: dict[str, str]) -> bytes:
    """The value of a published-topic record: every table's position, and when."""
    tables = {
        name: {"table_id": p.table_id, "version": p.version, "path": paths.get(name)}
        for name, p in sorted(positions.items())
    }
    published_at = datetime.now(UTC).isoformat(timespec="milliseconds")
    return json.dumps({"positions": tables, "published_at": published_at}).encode()


def decode_positions(value: bytes) -> dict[str, Position]:
    tables = json.loads(value)["positions"]
    return {n: Position(n, t["table_id"], int(t["version"])) for n, t in tables.items()}


@dataclass
class Round:
    """What one transaction published."""

    versions: dict[str, tuple[int, int]] = field(default_factory=dict)  # table -> first, last
    messages: dict[str, int] = field(default_factory=dict)  # table -> messages
    snapshot: dict[str, bool] = field(default_factory=dict)  # table -> its rows, not changes
    newest_commit_ms: dict[str, int | None] = field(default_factory=dict)  # of its last version
    seconds: float = 0.0
    committed_at: float = 0.0  # time.time() once Kafka committed it

    @property
    def total(self) -> int:
        return sum(self.messages.values())

    def delays(self) -> dict[str, float]:
        """Seconds from each table's newest version's commit to Kafka's commit of it."""
        return {
            name: self.committed_at - ms / 1000
            for name, ms in self.newest_commit_ms.items()
            if ms is not None
        }

    def describe(self) -> str:
        parts = []
        for name, (first, last) in self.versions.items():
            what = (
                f"rows at version {last}"
                if self.snapshot[name]
                else (f"version {last}" if first == last else f"versions {first}..{last}")
            )
            parts.append(f"{name} {what}: {self.messages[name]:,} messages")
        rate = self.total / self.seconds if self.seconds else 0.0
        delays = self.delays()
        behind = f", {max(delays.values()):.1f}s after the gold commit" if delays else ""
        return f"{'; '.join(parts)} in {self.seconds:.2f}s ({rate:,.0f}/s){behind}"


def gold_topics(conf: LakehouseConf, stream_name: str) -> list[GoldTopic]:
    """Each gold table of a stream with its topic and key columns."""
    stream = conf.stream(stream_name)
    tables = gold_tables(conf, stream_name)
    found = []
    for name, path in tables.aggregates.items():
        module = importlib.import_module(stream.module(name))
        found.append(GoldTopic(name, path, stream.gold_topic(name), tuple(module.KEY_COLUMNS)))
    return found


def transactional_id(published_topic: str) -> str:
    """The one transactional id of a stream's publisher: named after its published topic."""
    return f"lakehouse-publish.{published_topic}"


def _kafka_error(e: KafkaException) -> KafkaError | None:
    return e.args[0] if e.args and isinstance(e.args[0], KafkaError) else None


def _fenced(err: KafkaError | None) -> bool:
    fenced = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH}
    return err is not None and err.code() in fenced


@dataclass(frozen=True)
class Publication:
    """What a stream's publisher needs of the configuration, resolved where it is read."""

    stream: str
    tables: list[GoldTopic]
    published_topic: str  # the stream's `published_topic`: the versions published
    replicas: tuple[int, int | None]  # the topics' replication factor and min.insync.replicas
    settings: PublishConf
    kafka: ResolvedKafka
    checkpoint: str


def publication(conf: LakehouseConf, stream_name: str) -> Publication:
    stream = conf.stream(stream_name)
    return Publication(
        stream_name,
        gold_topics(conf, stream_name),
        stream.published_versions_topic,
        (stream.replication_factor, stream.min_insync_replicas),
        conf.publish,
        kafka_access(conf),
        conf.checkpoint_path(f"publish/{stream_name}"),
    )


class GoldPublisher:
    """Publishes a stream's gold changes, one Kafka transaction per round (see the module)."""

    def __init__(self, spark: SparkSession, publication: Publication) -> None:
        self.spark, self.kafka, self.settings = spark, publication.kafka, publication.settings
        self.stream_name, self.tables = publication.stream, publication.tables
        self.published_topic, self.replicas = publication.published_topic, publication.replicas
        self.transactional_id = transactional_id(self.published_topic)
        self.positions: dict[str, Position] = {}
        self.producer: Producer | None = None
        self.checkpoint = publication.checkpoint
        self.fatal: KafkaError | None = None  # what made the producer unusable, if anything

    def _on_error(self, err: KafkaError) -> None:
        """librdkafka's error callback: a fatal error (fenced, ...) is kept for the message."""
        if err.fatal():
            self.fatal = err

    # -- start -----------------------------------------------------------------------------

    def open(self) -> None:
        """Create the topics if missing, fence every earlier producer of this stream (aborting
        its open transaction), and read back the versions published."""
        check_reachable(self.kafka)
        for topic, partitions, settings in [
            *[(t.topic, self.settings.partitions, COMPACTED) for t in self.tables],
            (self.published_topic, 1, PUBLISHED_TOPIC_SETTINGS),
        ]:
            ensure_topic(self.kafka, topic, partitions, *self.replicas, settings=settings)
        self._start_producer()
        self.positions = read_positions(self.kafka, self.published_topic, self.transactional_id)
        for t in self.tables:
            if (at := self.positions.get(t.name)) is not None:
                log.info("%s: published up to version %d (%s)", t.name, at.version, t.topic)
            else:
                log.info("%s: never published: its rows first, then its changes", t.name)

    def _start_producer(self) -> None:
        """A new transactional producer: `init_transactions` fences every earlier one of the id."""
        timeout_ms = self.settings.transaction_timeout_s * 1000
        settings = client_settings(self.kafka) | PRODUCER_SETTINGS
        settings |= {"transactional.id": self.transactional_id, "error_cb": self._on_error}
        settings |= {"transaction.timeout.ms": timeout_ms, "message.timeout.ms": timeout_ms}
        self.producer = Producer(settings)
        try:
            self.producer.init_transactions(self.kafka.kafka.request_timeout_s * 4)
        except KafkaException as e:
            self.producer = None
            raise JobFailedError(
                f"publish of stream {self.stream_name!r}: Kafka at "
                f"{self.kafka.kafka.bootstrap_servers} did not start the transactional producer "
                f"{self.transactional_id!r}: {e.args[0].str() if _kafka_error(e) else e}"
            ) from None

    def _drop_producer(self) -> None:
        """Drop the producer after an aborted transaction; the next one starts a new producer.
        Once messages of a transaction timed out (Kafka unreachable longer than
        transaction_timeout_s), librdkafka's producer fails its next transactions with skipped
        sequence numbers; a new one starts clean."""
        self._live().purge()
        self._live().flush(0)
        self.producer = None

    def _live(self) -> Producer:
        """The producer `open` started (or the next round, after an aborted transaction)."""
        if self.producer is None:
            raise JobFailedError(f"publish of stream {self.stream_name!r}: no producer started")
        return self.producer

    def close(self) -> None:
        if self.producer is not None:
            self.producer.flush(5)
            self.producer = None

    # -- one round -------------------------------------------------------------------------

    def _plan(self) -> list[Step]:
        """What each table has that is not published yet."""
        plan, most = [], self.settings.max_versions_per_transaction
        for t in self.tables:
            found = snapshot(self.spark, t.path)
            version = found.version()
            if version < 0:  # not created yet
                continue
            table_id = found.metadata().id()
            at = self.positions.get(t.name)
            if at is None:
                plan.append(Step(t, table_id, version, version, snapshot=True))
            elif at.table_id != table_id:
                raise PublishedTableChangedError(
                    f"{t.name} at {t.path} is not the table published to {t.topic}: "
                    f"{self.published_topic} says table id {at.table_id} up to version "
                    f"{at.version}, the table's id is {table_id} (recreated?). To publish the "
                    f"new table from its current rows, give the stream another published_topic "
                    f"(and gold topics) in {self.kafka.source}, or delete the old topics."
                )
            elif version > at.version:
                last = min(version, at.version + most)
                plan.append(Step(t, table_id, at.version + 1, last, snapshot=False))
        return plan

    def _messages(self, step: Step) -> DataFrame:
        """The step's messages: the table's rows, or its change data feed, as the contract's."""
        reader, t, keys = self.spark.read.format("delta"), step.table, list(step.table.key_columns)
        if step.snapshot:
            rows = reader.option("versionAsOf", step.last).load(t.path)
            return gold.publication.snapshot_messages(rows, keys, step.last)
        changes = (
            reader.option("readChangeFeed", "true")
            .option("startingVersion", step.first)
            .option("endingVersion", step.last)
            .load(t.path)
        )
        return gold.publication.change_messages(changes, keys)

    def publish_round(self) -> Round | None:
        """Publish what is new in every table (up to max_versions_per_transaction versions of
        each) in one transaction; None when nothing is. Redone from the last committed position
        when Kafka aborts it."""
        plan = self._plan()
        if not plan:
            return None
        for attempt in range(1, ATTEMPTS + 1):
            try:
                if self.producer is None:  # the last transaction was aborted
                    self._start_producer()
                return self._transaction(plan)
            except KafkaException as e:
                err = self._cause(_kafka_error(e))
                if _fenced(err):
                    raise self._fenced_error() from None
                if err is None or err.fatal() or not err.txn_requires_abort():
                    raise JobFailedError(
                        f"publish of stream {self.stream_name!r} failed on Kafka at "
                        f"{self.kafka.kafka.bootstrap_servers}: {err.str() if err else e}. "
                        "Restarted, it resumes after the last version Kafka committed."
                    ) from None
                log.warning("transaction aborted (%s): attempt %d again", err.str(), attempt + 1)
                self._abort()
                self._drop_producer()
            except (PublisherFencedError, JobFailedError):
                raise
            except Exception as e:  # reading the tables (Spark, Delta): said in one line
                self._abort_quietly()
                reading = ", ".join(step.describe() for step in plan)
                raise JobFailedError(
                    f"publish of stream {self.stream_name!r} could not read {reading}: "
                    f"{cause(e)}. Nothing of it was published; restarted, it resumes after the "
                    "last version Kafka committed."
                ) from e
        raise JobFailedError(
            f"publish of stream {self.stream_name!r}: Kafka aborted {ATTEMPTS} transactions in a "
            "row; restarted, it resumes after the last version Kafka committed"
        )

    def _abort_quietly(self) -> None:
        """Abort the open transaction if there is one (a failure here changes nothing: a
        restart's fencing aborts it)."""
        try:
            self._live().abort_transaction(self.kafka.kafka.request_timeout_s)
        except KafkaException:
            pass

    def _fenced_error(self) -> PublisherFencedError:
        return PublisherFencedError(
            f"publish of stream {self.stream_name!r} stopped: another publisher with "
            f"transactional id {self.transactional_id!r} took over (Kafka fenced this one); "
            "nothing of this one's open transaction is published"
        )

    def _cause(self, err: KafkaError | None) -> KafkaError | None:
        """The error itself, or for librdkafka's "fatal error" the one that was fatal."""
        if err is not None and err.code() == KafkaError._FATAL:
            try:
                self._live().poll(0)  # serves the error callback, or raises the fatal error
            except KafkaException as e:
                return _kafka_error(e) or self.fatal or err
            return self.fatal or err
        return err

    def _commit(self) -> None:
        """Commit the transaction, again as long as Kafka says the commit may be retried (a
        leader or coordinator moving): its outcome is then still open, never guessed."""
        for attempt in range(1, ATTEMPTS + 1):
            try:
                self._live().commit_transaction(self.settings.transaction_timeout_s)
                return
            except KafkaException as e:
                err = _kafka_error(e)
                retry = err is not None and err.retriable() and not err.txn_requires_abort()
                if err is None or not retry or err.fatal() or attempt == ATTEMPTS:
                    raise
                log.warning("commit not acknowledged (%s): attempt %d", err.str(), attempt + 1)

    def _abort(self) -> None:
        try:
            self._live().abort_transaction(self.kafka.kafka.request_timeout_s * 4)
        except KafkaException as e:
            err = self._cause(_kafka_error(e))
            if _fenced(err):
                raise self._fenced_error() from None
            raise JobFailedError(
                f"publish of stream {self.stream_name!r}: Kafka did not abort the transaction: "
                f"{err.str() if err else e}"
            ) from None

    def _transaction(self, plan: list[Step]) -> Round:
        """One Kafka transaction: every step's messages, then every table's position."""
        started = time.perf_counter()
        producer, done = self._live(), Round()
        failures: list[str] = []

        def delivered(err, msg) -> None:
            if err is not None:
                failures.append(f"{msg.topic()}[{msg.partition()}]: {err.str()}")

        producer.begin_transaction()
        positions = dict(self.positions)
        for step in plan:
            t, sent = step.table, 0
            table = t.name.encode()
            for row in self._messages(step).toLocalIterator(prefetchPartitions=True):
                headers = [
                    (f"{HEADER}table", table),
                    (f"{HEADER}version", str(row["version"]).encode()),
                    (f"{HEADER}change", row["change"].encode()),
                ]
                value = None if row["value"] is None else row["value"].encode()
                _produce(producer, t.topic, row["key"].encode(), value, headers, delivered)
                sent += 1
            # in Kafka before the next table is read: the commit then waits for nothing
            producer.flush(self.settings.transaction_timeout_s)
            positions[t.name] = Position(t.name, step.table_id, step.last)
            done.versions[t.name] = (step.first, step.last)
            done.messages[t.name] = sent
            done.snapshot[t.name] = step.snapshot
            done.newest_commit_ms[t.name] = _commit_ms(self.spark, t.path, step.last)
        # every table's position in one record: the newest committed one says it all
        paths = {t.name: t.path for t in self.tables}
        record = encode_positions(positions, paths)
        key = self.transactional_id.encode()
        _produce(producer, self.published_topic, key, record, [], delivered)
        self._commit()
        if failures:  # a commit after a failed delivery is refused; this is a second guard
            raise JobFailedError(f"publish: Kafka refused messages: {'; '.join(failures[:3])}")
        done.committed_at = time.time()
        done.seconds = time.perf_counter() - started
        self.positions = positions
        return done

    # -- position for maintenance ------------------------------------------------------------

    def write_position(self) -> None:
        """Where the job is, per table id, in its checkpoint folder: maintenance keeps what it
        has still to read (the truth is in Kafka; this is a copy for VACUUM's retention)."""
        ids = {p.table_id: p.version + 1 for p in self.positions.values()}
        Files(self.spark).write_text(
            f"{self.checkpoint}/{POSITION_FILE}", json.dumps({"next_versions": ids})
        )


def _produce(producer: Producer, topic: str, key: bytes, value, headers, on_delivery) -> None:
    while True:
        try:
            producer.produce(topic, key=key, value=value, headers=headers, on_delivery=on_delivery)
            return
        except BufferError:  # the local queue is full: let deliveries drain it
            producer.poll(0.05)


def _commit_ms(spark: SparkSession, path: str, version: int) -> int | None:
    """When a version of the table was committed (Delta's history), in epoch milliseconds; None
    when it cannot be read: a figure never stops a transaction."""
    try:
        return commit_time_ms(commit_text(spark, snapshot(spark, path), version))
    except Exception:  # noqa: BLE001 (a storage error: no figure)
        return None


def read_positions(
    conf: KafkaAccess, topic: str, key: str, window: int = 1000
) -> dict[str, Position]:
    """Every table's position in the newest record of `key` in the published topic, read
    committed: each transaction writes one with every table's, so the newest committed one is
    enough. Read from the end back, `window` offsets first, further only if needed."""
    settings = client_settings(conf) | {
        "group.id": f"lakehouse-read.{topic}",
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        "log_level": 0,
    }
    consumer = Consumer(settings)
    tp, timeout = TopicPartition(topic, 0), conf.kafka.request_timeout_s
    try:
        low, start = consumer.get_watermark_offsets(tp, timeout)
        while start > low:
            start = max(low, start - window)
            newest = _newest_value(consumer, TopicPartition(topic, 0, start), key, timeout)
            if newest is not None:
                return decode_positions(newest)
            window *= 4
        return {}
    finally:
        consumer.close()


def _newest_value(consumer: Consumer, tp: TopicPartition, key: str, timeout: float) -> bytes | None:
    """The value of the newest record of `key` from `tp`'s offset to the partition's end."""
    consumer.assign([tp])
    newest, wanted = None, key.encode()
    deadline = time.monotonic() + timeout * 4
    while time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        if (error := msg.error()) is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                return newest
            raise JobFailedError(f"reading {tp.topic}: {error.str()}")
        if msg.key() == wanted and msg.value() is not None:
            newest = msg.value()
    raise JobFailedError(f"reading {tp.topic}: not at its end after {timeout * 4:.0f}s")


def run_publish(
    spark: SparkSession,
    conf: LakehouseConf,
    stream_name: str = "orders",
    *,
    once: bool = False,
    progress: bool = True,
) -> list[Round]:
    """Publish until every table's newest version is (`once`), or until SIGINT/SIGTERM, which
    stop it between transactions. Returns the rounds of a `once` run (none kept otherwise)."""
    publisher = GoldPublisher(spark, publication(conf, stream_name))
    say = log.info if progress else log.debug
    stop = threading.Event()
    previous = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, lambda signum, _: _stop(stop, signum))
    interval = duration_seconds(conf.publish.trigger_interval)
    rounds: list[Round] = []
    lease = CheckpointLease(spark, publisher.checkpoint, "the publish job").__enter__()
    # a process group's SIGTERM (a job runner, systemd) stops this loop, not the JVM under it
    restore_jvm = jvm_ignores_sigterm() if previous else (lambda: None)
    try:
        publisher.open()
        topics = ", ".join(f"{t.name} -> {t.topic}" for t in publisher.tables)
        say("[publish] %s (transactional id %s)", topics, publisher.transactional_id)
        written, number = time.monotonic(), 0
        while not stop.is_set():
            began = time.monotonic()
            with lineage.batch(number, publisher.transactional_id):
                done = publisher.publish_round()
            lease.renew()
            if done is not None:
                number += 1
                metrics.observe_publication(done)
                say("[publish] %d: %s", number, done.describe())
                if once:
                    rounds.append(done)
                if time.monotonic() - written > 10:
                    publisher.write_position()
                    written = time.monotonic()
                continue  # more may be waiting: a backlog goes round after round
            if once:
                break
            stop.wait(max(0.0, interval - (time.monotonic() - began)))
        publisher.write_position()
        total = sum(r.total for r in rounds)
        say(
            "[publish] done%s",
            f": {total:,} messages in {len(rounds)} transactions" if once else "",
        )
        return rounds
    finally:
        publisher.close()
        lease.__exit__()
        restore_jvm()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _stop(stop: threading.Event, signum: int) -> None:
    log.warning(
        "publish: %s received, stopping after the current transaction", signal.Signals(signum).name
    )
    stop.set()
