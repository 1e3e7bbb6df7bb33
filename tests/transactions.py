"""A seeded mix of Kafka transactions and plain records, and what of it belongs to the stream.

Records of a plan go out interleaved: plain ones from an idempotent producer, the others in
transactions of several transactional producers, each transaction spanning partitions and ending
committed or aborted at random; `hold_open` leaves one transaction of a producer open, to be
committed or aborted later. Only the records of committed transactions and the plain ones belong
to the stream (the contract): `stream_report` is what a read_committed consumer must see.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from confluent_kafka import Producer

from pipelines.config import LakehouseConf
from pipelines.kafka import client_settings, ensure_topic
from pipelines.reference.orders_stream import StreamOptions, StreamRecord, generate_orders_stream
from pipelines.reference.producer import PRODUCER_SETTINGS, DeliveredRecord, ProduceReport

FATES = ("plain", "committed", "aborted", "open")


@dataclass
class Sent:
    record: StreamRecord
    producer: str  # "plain" or a transactional id
    transaction: int | None  # the transaction's number, None for a plain record
    partition: int = -1
    offset: int = -1


@dataclass
class TransactionalMix:
    """Sends records through plain and transactional producers; remembers every fate."""

    conf: LakehouseConf
    topic: str
    seed: int
    producers: int = 3
    plain_share: float = 0.35
    abort_share: float = 0.3
    sent: list[Sent] = field(default_factory=list)
    fates: dict[int, str] = field(default_factory=dict)  # transaction -> committed/aborted/open

    def __post_init__(self) -> None:
        stream = self.conf.stream("orders")
        ensure_topic(self.conf, self.topic, stream.partitions, stream.replication_factor)
        self.rng = random.Random(self.seed)
        base = client_settings(self.conf) | PRODUCER_SETTINGS
        self.plain = Producer(base)
        self.ids = [f"{self.topic}.tx{i}" for i in range(self.producers)]
        self.txn = {}
        for tid in self.ids:
            p = Producer(base | {"transactional.id": tid, "transaction.timeout.ms": 600_000})
            p.init_transactions(30)
            self.txn[tid] = p
        self.current: dict[str, tuple[int, int]] = {}  # id -> (transaction, records left)
        self.held: dict[str, int] = {}  # id -> its transaction left open
        self.count = 0

    def _deliver(self, sent: Sent):
        def done(err, msg) -> None:
            assert err is None, err.str()
            sent.partition, sent.offset = msg.partition(), msg.offset()

        return done

    def _send(self, producer: Producer, name: str, record: StreamRecord, txn: int | None) -> None:
        sent = Sent(record, name, txn)
        self.sent.append(sent)
        producer.produce(
            self.topic,
            value=record.value,
            key=record.key,
            partition=record.partition,
            headers=list(record.headers) or None,
            on_delivery=self._deliver(sent),
        )
        producer.poll(0)

    def send(self, records: list[StreamRecord]) -> None:
        """Send `records` in order, each plain or in a transaction of a random producer."""
        for record in records:
            free = [t for t in self.ids if t not in self.held]
            if not free or self.rng.random() < self.plain_share:
                self._send(self.plain, "plain", record, None)
                continue
            tid = self.rng.choice(free)
            if tid not in self.current:
                self.count += 1
                self.txn[tid].begin_transaction()
                self.current[tid] = (self.count, self.rng.randint(1, 12))
            number, left = self.current[tid]
            self._send(self.txn[tid], tid, record, number)
            if left > 1:
                self.current[tid] = (number, left - 1)
            else:
                self._end(tid, commit=self.rng.random() >= self.abort_share)
        self.plain.flush(30)

    def _end(self, tid: str, *, commit: bool) -> None:
        number, _ = self.current.pop(tid)
        producer = self.txn[tid]
        if commit:
            producer.commit_transaction(30)
        else:
            producer.flush(30)  # delivered, then aborted: their offsets are taken
            producer.abort_transaction(30)
        self.fates[number] = "committed" if commit else "aborted"

    def finish(self) -> None:
        """End every transaction still going (not those held open) as the dice say."""
        for tid in list(self.current):
            self._end(tid, commit=self.rng.random() >= self.abort_share)
        self.plain.flush(30)

    def hold_open(self, records: list[StreamRecord]) -> str:
        """Send `records` in a new transaction of a free producer and leave it open; its id."""
        tid = next(t for t in self.ids if t not in self.held)
        if tid in self.current:  # its transaction going ends first
            self._end(tid, commit=self.rng.random() >= self.abort_share)
        self.count += 1
        self.txn[tid].begin_transaction()
        for record in records:
            self._send(self.txn[tid], tid, record, self.count)
        self.txn[tid].flush(30)
        self.held[tid] = self.count
        self.fates[self.count] = "open"
        return tid

    def resolve(self, tid: str, *, commit: bool) -> None:
        """Commit or abort the transaction `hold_open` left open."""
        number = self.held.pop(tid)
        self.current[tid] = (number, 0)
        self._end(tid, commit=commit)

    def fate(self, sent: Sent) -> str:
        return "plain" if sent.transaction is None else self.fates[sent.transaction]

    def stream_report(self, *, below: dict[int, int] | None = None) -> ProduceReport:
        """What belongs to the stream, as a producer report: plain records and those of
        committed transactions, at their offsets (only offsets under `below`, per partition,
        if given: what a read_committed consumer can read while a transaction is open)."""
        kept = [
            s
            for s in self.sent
            if self.fate(s) in ("plain", "committed")
            and (below is None or s.offset < below.get(s.partition, 0))
        ]
        assert all(s.offset >= 0 for s in kept), "a record was not acknowledged"
        delivered = [
            DeliveredRecord(**{**vars(s.record), "partition": s.partition}, offset=s.offset)
            for s in kept
        ]
        return ProduceReport(self.topic, {}, 0.0, delivered)

    def counts(self) -> dict[str, int]:
        """Records per fate."""
        found: dict[str, int] = {}
        for s in self.sent:
            found[self.fate(s)] = found.get(self.fate(s), 0) + 1
        return found

    def close(self) -> None:
        for producer in self.txn.values():
            producer.flush(10)


def produce_mixed(conf: LakehouseConf, orders: int, seed: int, **twists: float) -> ProduceReport:
    """`helpers.produce`'s stream through a mix: every transaction ended, committed or aborted.
    The report is what belongs to the stream (plain and committed records, at their offsets)."""
    plan = generate_orders_stream(StreamOptions(orders=orders, seed=seed, **twists))
    mix = TransactionalMix(conf, conf.stream("orders").topic, seed)
    mix.send(plan.records)
    mix.finish()
    mix.close()
    return mix.stream_report()
