"""The reference stream of order events, generated deterministically from a seed.

Pure Python, no Kafka: `generate_orders_stream` returns the records in emission order, each with
its key, value bytes, target partition and what kind it is, so a test can build its oracle from
exactly what was sent. Twists of the contract (docs/orders-stream.md) are injected on request:
re-delivered events (same `event_id`, same bytes, possibly another partition), out-of-order
versions, late events, null keys, fields the contract does not know, and invalid records of every
kind.
"""

from __future__ import annotations

import json
import random
import zlib
from collections import Counter
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

from silver.order_events import CURRENCIES, REQUIRED_FIELDS

INVALID_KINDS = tuple(
    "not_json not_object missing_field null_field wrong_type rule_broken unknown_event_type "
    "unknown_currency too_many_decimals bad_event_time invalid_utf8 trailing_content "
    "future_event_time".split()
)
# what a trailing_content record has after a valid event's JSON: a second object, or text
TRAILERS = (b' {"event_id": "again"}', b"{}", b" and more", b"\n]")
FUTURE = timedelta(days=36_525)  # a future_event_time's, ahead of its template's: 100 years


@dataclass(frozen=True)
class StreamOptions:
    """What to generate. Rates are fractions in [0, 1]."""

    orders: int = 1000
    seed: int = 7
    partitions: int = 4
    start_time: datetime = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)
    events_per_second: float = 20.0
    redelivery_rate: float = 0.0  # share of valid events sent a second time
    out_of_order_rate: float = 0.0  # share of orders whose versions are emitted shuffled
    late_rate: float = 0.0  # share of events emitted well after the allowed lateness
    late_by_minutes: tuple[int, int] = (15, 40)
    invalid_rate: float = 0.0  # invalid records added, as a share of valid events
    null_key_rate: float = 0.0  # share of valid events sent with a null key
    extra_field_rate: float = 0.0  # share of events carrying a field the contract does not know
    products: int = 300
    customers: int = 3000
    unknown_dimension_rate: float = 0.0  # share of events whose product/customer id is unknown


# Every twist the contract allows, at the rates a real stream shows them.
REALISTIC_TWISTS = {
    "redelivery_rate": 0.05,
    "out_of_order_rate": 0.10,
    "late_rate": 0.01,
    "invalid_rate": 0.02,
    "null_key_rate": 0.03,
    "extra_field_rate": 0.05,
    "unknown_dimension_rate": 0.01,
}


def with_every_twist(**options) -> StreamOptions:
    """Options with every twist at its realistic rate; `options` override any field."""
    return StreamOptions(**{**REALISTIC_TWISTS, **options})


@dataclass(frozen=True)
class StreamRecord:
    """One Kafka record to send."""

    key: bytes | None
    value: bytes
    partition: int
    kind: str  # "event", "redelivery", or an invalid kind
    event_id: str | None = None
    late: bool = False
    headers: tuple[tuple[str, bytes], ...] = ()


@dataclass
class StreamPlan:
    """Records in emission order plus the counts a report needs."""

    options: StreamOptions
    records: list[StreamRecord] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        kinds = Counter(r.kind for r in self.records)
        valid = kinds["event"] + kinds["redelivery"]
        return {
            "records": len(self.records),
            "valid_records": valid,
            "distinct_events": kinds["event"],
            "redeliveries": kinds["redelivery"],
            "invalid_records": len(self.records) - valid,
            "late_events": sum(1 for r in self.records if r.late),
            "null_keys": sum(1 for r in self.records if r.key is None),
            **{f"invalid.{k}": kinds[k] for k in INVALID_KINDS},
        }


def _iso(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.") + f"{t.microsecond // 1000:03d}Z"


def encode_event(fields: dict[str, object]) -> bytes:
    """JSON with money written as exact decimal text (never through a float)."""
    parts = []
    for name, value in fields.items():
        exact = isinstance(value, Decimal)
        text = format(value, "f") if exact else json.dumps(value, ensure_ascii=False)
        parts.append(f"{json.dumps(name)}: {text}")
    return ("{" + ", ".join(parts) + "}").encode("utf-8")


def _order_versions(rng: random.Random, opts: StreamOptions, order_no: int) -> list[dict]:
    order_id = f"o-{opts.seed}-{order_no:07d}"
    if order_no % 97 == 5:  # a few ids beyond ASCII, as real systems have
        order_id = f"ordre-é-{opts.seed}-{order_no:07d}-ü"
    unknown = rng.random() < opts.unknown_dimension_rate
    product_no = rng.randrange(1, opts.products + 1)
    customer_no = rng.randrange(1, opts.customers + 1)
    product_id = f"p-{product_no:04d}" if not unknown else f"p-unknown-{product_no}"
    customer_id = f"c-{customer_no:05d}" if not (unknown and rng.random() < 0.5) else "c-unknown"
    price = (Decimal(rng.randrange(10, 50_000)) / Decimal(100)).quantize(Decimal("0.01"))
    # now and then a price at the edges: ten cents, over a million
    price = {3: Decimal("0.10"), 4: Decimal("1234567.89")}.get(order_no % 211, price)
    quantity = rng.randrange(1, 6)
    currency = CURRENCIES[rng.randrange(len(CURRENCIES))]
    path = ["created", "paid", "shipped"] if rng.random() < 0.8 else ["created", "cancelled"]
    if rng.random() < 0.2:
        path = path[: rng.randrange(1, len(path) + 1)]
    return [
        {
            "event_id": f"e-{opts.seed}-{order_no:07d}-{seq}",
            "order_id": order_id,
            "seq": seq,
            "event_type": event_type,
            "customer_id": customer_id,
            "product_id": product_id,
            "quantity": quantity,
            "unit_price": price,
            "currency": currency,
        }
        for seq, event_type in enumerate(path, start=1)
    ]


def _invalid_value(kind: str, rng: random.Random, template: dict) -> bytes:
    bad = {**template, "event_id": f"{template['event_id']}-bad-{kind}"}
    if kind == "not_json":
        return b'{"event_id": "' + bad["event_id"].encode() + b'", oops'
    if kind == "not_object":
        return rng.choice([b"[1, 2, 3]", b'"just a string"', b"42", b"null"])
    if kind == "missing_field":
        del bad[rng.choice(REQUIRED_FIELDS)]
    elif kind == "null_field":
        bad[rng.choice(REQUIRED_FIELDS)] = None
    elif kind == "wrong_type":
        bad[rng.choice(["quantity", "seq"])] = rng.choice(["3", 1.5, True])
    elif kind == "rule_broken":
        name, value = rng.choice([("quantity", 0), ("seq", 0), ("unit_price", Decimal("-1.00"))])
        bad[name] = value
    elif kind == "unknown_event_type":
        bad["event_type"] = "refunded"
    elif kind == "unknown_currency":
        bad["currency"] = "JPY"
    elif kind == "too_many_decimals":
        bad["unit_price"] = Decimal("12.345")
    elif kind == "bad_event_time":
        bad["event_time"] = rng.choice(["yesterday", "2026-13-45T99:00:00Z", "1700000000"])
    elif kind == "invalid_utf8":
        return encode_event(bad).replace(b'"currency": "', b'"currency": "\xff\xfe', 1)
    elif kind == "trailing_content":
        return encode_event(bad) + rng.choice(TRAILERS)
    elif kind == "future_event_time":  # invalid whatever day the record is sent
        at = datetime.fromisoformat(template["event_time"].replace("Z", "+00:00"))
        bad["event_time"] = _iso(at + FUTURE)
    return encode_event(bad)


def event_time_span(plan: StreamPlan) -> timedelta:
    """From the first event time of a plan to its last (the stream clock's run)."""
    events = sum(1 for r in plan.records if r.kind == "event")
    return max(0, events - 1) * timedelta(seconds=1 / plan.options.events_per_second)


def generate_orders_stream(opts: StreamOptions) -> StreamPlan:
    """All records of one run, in emission order, deterministic for `opts`."""
    rng = random.Random(opts.seed)
    step = timedelta(seconds=1 / opts.events_per_second)
    # 1. every valid event, in a natural order: orders interleave, versions follow each other.
    emitted: list[dict] = []
    pending: list[list[dict]] = []
    order_no = 0
    while order_no < opts.orders or pending:
        if order_no < opts.orders and (not pending or rng.random() < 0.6):
            order_no += 1
            versions = _order_versions(rng, opts, order_no)
            if rng.random() < opts.out_of_order_rate and len(versions) > 1:
                shuffled = versions[:]
                while shuffled == versions:
                    rng.shuffle(shuffled)
                versions = shuffled
            pending.append(versions)
        i = rng.randrange(len(pending))
        emitted.append(pending[i].pop(0))
        if not pending[i]:
            pending.pop(i)
    # 2. event time follows the stream clock; a late event keeps an old time and goes out later.
    late_delay = [0] * len(emitted)
    for n, event in enumerate(emitted):
        event["event_time"] = opts.start_time + n * step
        if rng.random() < opts.late_rate:
            late_delay[n] = int(timedelta(minutes=rng.randrange(*opts.late_by_minutes)) / step)
        if rng.random() < opts.extra_field_rate:
            event["channel"] = rng.choice(["web", "app", "store"])
            event["note"] = {"gift": rng.random() < 0.5}
    slots: list[tuple[int, int, StreamRecord]] = []
    for n, event in enumerate(emitted):
        value = encode_event({**event, "event_time": _iso(event["event_time"])})
        null_key = rng.random() < opts.null_key_rate
        key = None if null_key else event["order_id"].encode()
        partition_key = event["event_id" if null_key else "order_id"].encode()
        partition = zlib.crc32(partition_key) % opts.partitions
        headers = (("source", b"lakehouse-producer"),) if n % 3 else ()
        position = n + late_delay[n]
        late = late_delay[n] > 0
        record = StreamRecord(key, value, partition, "event", event["event_id"], late, headers)
        slots.append((position, 0, record))
        if rng.random() < opts.redelivery_rate:
            # a retry soon after, or a replay much later, maybe on another partition
            gap = (1, 50) if rng.random() < 0.7 else (50, max(51, len(emitted)))
            later = position + rng.randrange(*gap)
            part = (partition + 1) % opts.partitions if rng.random() < 0.5 else partition
            slots.append((later, 1, replace(record, partition=part, kind="redelivery", late=False)))
    invalid_count = round(len(emitted) * opts.invalid_rate)
    if opts.invalid_rate > 0:
        invalid_count = max(invalid_count, len(INVALID_KINDS))
    for j in range(invalid_count):
        kind = INVALID_KINDS[j % len(INVALID_KINDS)]
        template = {**emitted[rng.randrange(len(emitted))]}
        template["event_time"] = _iso(template["event_time"])
        value = _invalid_value(kind, rng, template)
        position = rng.randrange(len(emitted) + 1)
        key = template["order_id"].encode() if rng.random() < 0.8 else None
        slots.append((position, 2, StreamRecord(key, value, rng.randrange(opts.partitions), kind)))
    slots.sort(key=lambda s: s[:2])
    return StreamPlan(opts, [s[2] for s in slots])
