"""Hostile records for the order-events contract, seeded, and a plain-Python oracle of silver.

The generator mixes random bytes, random JSON, truncated JSON, valid events followed by
whitespace or by more (another object, text, a bracket), event times ahead of the time the records
are sent, and valid events with fields replaced by boundary values (numbers beyond a long or
decimal(12,2), exponent forms, dates that do not exist, offsets out of range, empty ids, huge
strings). The oracle decides each record from the contract (`docs/orders-stream.md`) and
its Kafka timestamp without Spark: valid with its typed row, or invalid.
"""

from __future__ import annotations

import json
import random
import re
from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

MAX_LONG = 2**63 - 1
IDS = ("event_id", "order_id", "customer_id", "product_id")
STRINGS = (*IDS, "event_type", "currency")
INTEGERS = ("seq", "quantity")
FIELDS = (*STRINGS, *INTEGERS, "unit_price", "event_time")
# JSON texts a field may be replaced with: boundaries of every type the contract names
CANDIDATES = {
    "id": ['""', '" "', '"\\u0000"', '"é-ü-订单-😀"', '"\\ud83d\\ude00"', "1", "true", "[]", "{}"],
    "int": [
        "0",
        "1",
        "-1",
        "-0",
        str(MAX_LONG),
        str(MAX_LONG + 1),
        str(-MAX_LONG - 1),
        "1" + "0" * 30,
        "1" + "0" * 50,
        "1.0",
        "7.00",
        "1." + "0" * 40,
        "1e2",
        "1E0",
        "0.5",
        "1e400",
        '"1"',
        "[1]",
    ],
    "price": [
        "0",
        "0.00",
        "0.01",
        "12.30",
        "12.300",
        "12.345",
        "-0.01",
        "-0",
        "9999999999.99",
        "10000000000.00",
        "99999999999",
        "1e-2",
        "1.5e1",
        "1E+2",
        "1e400",
        "1." + "0" * 41 + "1",
        "1" + "0" * 40,
        '"12.30"',
    ],
    "event_type": ['"created"', '"paid"', '"shipped"', '"cancelled"', '"PAID"', '""'],
    "currency": ['"EUR"', '"USD"', '"GBP"', '"eur"', '"JPY"', '""'],
    "time": [
        '"2026-11-22T10:15:03.123Z"',
        '"2024-02-29T00:00:00Z"',
        '"2026-02-29T00:00:00Z"',
        '"2026-11-22T24:00:00Z"',
        '"2026-11-22T23:59:60Z"',
        '"2026-11-31T10:00:00Z"',
        '"0001-01-01T00:00:00Z"',
        '"0999-12-31T23:59:59Z"',
        '"1000-01-01T00:30:00+01:00"',
        '"1000-01-01T00:00:00Z"',
        '"9999-12-31T23:59:59.999999999Z"',
        '"9999-12-31T23:59:59-14:00"',
        '"2026-11-22T10:15:03.1234Z"',
        '"2026-11-22T10:15:03.1234567891Z"',
        '"2026-11-22T10:15:03+14:00"',
        '"2026-11-22T10:15:03-18:00"',
        '"2026-11-22T10:15:03+19:00"',
        '"2026-11-22T10:15:03+0100"',
        '"2026-11-22T10:15:03"',
        '"2026-11-22t10:15:03z"',
        '"+12026-11-22T10:15:03Z"',
        '"1700000000"',
        "1700000000",
    ],
}
KIND_OF = {**dict.fromkeys(IDS, "id"), **dict.fromkeys(INTEGERS, "int")}
KIND_OF |= {"unit_price": "price", "event_type": "event_type", "currency": "currency"}
KIND_OF["event_time"] = "time"
# what may follow a valid event's JSON: JSON whitespace (still valid), or anything else (invalid)
AROUND = [b" ", b"\n", b"\t\r\n  "]
AFTER = [
    *AROUND,
    b' {"event_id": "again"}',
    b"{}",
    b"garbage",
    b" x",
    b"]",
    b",0]",
    b",{}",
    b",",
    b" ,",
    b"/*c*/",
    b"\x00",
    b"\x0b",
    b"\x0c",
    "\u00a0".encode(),
    "\u2028".encode(),
]
# how far ahead of the time the records are generated (before they are sent) an event_time goes
AHEAD = [
    timedelta(minutes=4, seconds=59),
    timedelta(minutes=5),
    timedelta(minutes=5, seconds=1),
    timedelta(minutes=10),
    timedelta(days=1),
    timedelta(days=365),
]


def _valid_fields(rng: random.Random, n: int) -> dict[str, str]:
    """JSON texts of a valid event, its ids unique to `n`."""
    t = datetime(2026, 11, 22, 10, tzinfo=UTC) + timedelta(seconds=rng.randrange(86_400))
    return {
        "event_id": json.dumps(f"h-{n}"),
        "order_id": json.dumps(f"ho-{n % 50}"),
        "event_type": json.dumps(rng.choice(["created", "paid", "shipped", "cancelled"])),
        "customer_id": '"c-00001"',
        "product_id": '"p-0001"',
        "currency": json.dumps(rng.choice(["EUR", "USD", "GBP"])),
        "seq": str(rng.randrange(1, 9)),
        "quantity": str(rng.randrange(1, 9)),
        "unit_price": f"{rng.randrange(1, 100_000) / 100:.2f}",
        "event_time": json.dumps(t.strftime("%Y-%m-%dT%H:%M:%SZ")),
    }


def _json_instant(t: datetime, offset: timedelta = timedelta(0)) -> str:
    """The JSON text of instant `t` written in the local time of `offset`, milliseconds kept."""
    local = (t + offset).replace(tzinfo=timezone(offset))
    return json.dumps(local.isoformat(timespec="milliseconds").replace("+00:00", "Z"))


def _object(fields: dict[str, str]) -> bytes:
    return ("{" + ", ".join(f"{json.dumps(k)}: {v}" for k, v in fields.items()) + "}").encode()


def _random_json(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randrange(7 if depth < 4 else 4)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice([0, -1, MAX_LONG + 1, 3.25, 1e300])
    if kind == 2:
        return "".join(rng.choice('ab€"\\ \n') for _ in range(rng.randrange(8)))
    if kind == 3:
        return rng.choice(FIELDS)
    if kind in (4, 5):
        keys = rng.sample(FIELDS, rng.randrange(1, len(FIELDS)))
        return {k: _random_json(rng, depth + 1) for k in keys}
    return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]


def hostile_values(seed: int, n: int, now: datetime) -> list[bytes]:
    """`n` hostile record values, deterministic for `seed` and `now` (about when they are sent:
    not after); about a third of them valid."""
    rng = random.Random(seed)
    values: list[bytes] = []
    for i in range(n):
        fields = _valid_fields(rng, i)
        roll = rng.random()
        if roll < 0.25:  # valid as generated
            value = _object(fields)
        elif roll < 0.55:  # one to three fields replaced by a boundary value
            for name in rng.sample(FIELDS, rng.randrange(1, 4)):
                fields[name] = rng.choice(CANDIDATES[KIND_OF[name]])
            value = _object(fields)
        elif roll < 0.62:  # a field missing, a field twice, or an extra field
            name = rng.choice(FIELDS)
            how = rng.randrange(3)
            if how == 0:
                del fields[name]
                value = _object(fields)
            elif how == 1:
                value = _object(fields)[:-1] + f", {json.dumps(name)}: {fields[name]}}}".encode()
            else:
                value = _object({**fields, "note": json.dumps(_random_json(rng))})
        elif roll < 0.69:  # any JSON at all
            value = json.dumps(_random_json(rng)).encode()
        elif roll < 0.75:  # a valid event cut short
            whole = _object(fields)
            value = whole[: rng.randrange(len(whole))]
        elif roll < 0.83:  # whitespace or more after a valid event, maybe with more than one `}`
            how = rng.randrange(3)
            if how == 1:  # a nested object
                fields["note"] = json.dumps({"gift": {"wrap": rng.random() < 0.5}})
            elif how == 2:  # a `}` in a string
                fields["product_id"] = json.dumps(rng.choice(["p-}", "}{", "p-0001}"]))
            value = rng.choice([b"", *AROUND]) + _object(fields) + rng.choice(AFTER)
        elif roll < 0.87:  # an event time ahead of when it is sent: the producer's clock is wrong
            offset = timedelta(minutes=rng.choice([0, 0, 330, -600]))
            fields["event_time"] = (
                _json_instant(now + rng.choice(AHEAD), offset)
                if rng.random() < 0.8
                else rng.choice(['"9999-06-01T00:00:00Z"', '"9999-12-31T23:59:59+14:00"'])
            )
            value = _object(fields)
        elif roll < 0.95:  # random bytes
            value = rng.randbytes(rng.randrange(0, 300))
        elif roll < 0.97:  # a huge id, string or record
            fields["event_id"] = json.dumps("x" * rng.randrange(10_000, 200_000) + str(i))
            value = _object(fields)
        else:  # a re-delivery of an earlier record, byte for byte
            value = values[rng.randrange(len(values))] if values else _object(fields)
        values.append(value)
    return values


def edge_values(seed: int, now: datetime, max_skew_minutes: int) -> list[bytes]:
    """Valid events at the edges (quantity 1,000,000, the earliest event_time, the latest one the
    clock bound allows records sent from `now` on, an event_id of 8 MB), an event_time in year
    9999 (ahead of any Kafka timestamp), an unknown currency of 4 MB, and 9 MB of random bytes:
    the local broker takes 10 MB."""
    rng = random.Random(seed)
    latest = now.replace(microsecond=now.microsecond // 1000 * 1000)  # Kafka keeps milliseconds
    edges = [
        {"quantity": "1000000"},
        {"event_time": '"1000-01-01T00:00:00Z"'},
        {"event_time": _json_instant(latest + timedelta(minutes=max_skew_minutes))},
        {"event_time": '"9999-06-01T00:00:00Z"'},
        {"event_id": json.dumps("\U0010ffff" + "x" * 8_000_000)},  # the greatest key too
        {"currency": json.dumps("E" * 4_000_000)},
    ]
    values = [_object(_valid_fields(rng, -1 - i) | edge) for i, edge in enumerate(edges)]
    return [*values, rng.randbytes(9_000_000)]


_TIME = re.compile(
    r"(\d{4})-(\d\d)-(\d\d)[Tt](\d\d):(\d\d):(\d\d)(?:\.(\d{1,9}))?(?:([Zz])|([+-])(\d\d):(\d\d))"
)


def _instant(text: str) -> datetime | None:
    """The UTC instant of an ISO-8601 time with offset, or None (the contract's rules)."""
    m = _TIME.fullmatch(text)
    if not m:
        return None
    y, mo, d, h, mi, s, frac, z, sign, oh, om = m.groups()
    if int(oh or 0) > 18 or int(om or 0) > 59:
        return None
    try:
        local = datetime(int(y), int(mo), int(d), int(h), int(mi), int(s))
        local += timedelta(microseconds=int((frac or "0")[:6].ljust(6, "0")))
        offset = timedelta(hours=int(oh or 0), minutes=int(om or 0))
        return local - offset if sign == "+" else local + offset
    except (ValueError, OverflowError):  # a day that does not exist, or beyond years 1-9999
        return None


class _Number(str):
    """A JSON number kept as its text."""


def _no_duplicates(pairs: list) -> dict:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("duplicate key")
    return dict(pairs)


def _plain_decimal(text: str) -> Decimal | None:
    """A JSON number in plain decimal notation of at most 38 digits, else None."""
    if "e" in text.lower() or len(text.lstrip("-").replace(".", "")) > 38:
        return None
    return Decimal(text)


def oracle_row(
    value: bytes | None, kafka_timestamp: datetime | None, max_skew_minutes: int
) -> tuple | None:
    """The typed silver row of a record (in EVENT_COLUMNS order), or None when it is invalid.
    `kafka_timestamp`: the record's, naive UTC (as Spark returns it in this process), or None."""
    try:
        e = json.loads(
            value.decode("utf-8"),
            object_pairs_hook=_no_duplicates,
            parse_int=_Number,
            parse_float=_Number,
            parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)),
        )
        _strict_text(e)
    except (AttributeError, ValueError, RecursionError):
        return None
    if not isinstance(e, dict) or any(e.get(f) is None for f in FIELDS):
        return None
    if not all(type(e[f]) is str for f in (*STRINGS, "event_time")) or any(e[f] == "" for f in IDS):
        return None
    numbers = [_plain_decimal(e[f]) if type(e[f]) is _Number else None for f in INTEGERS]
    # an integer-valued decimal (1.0) is an integer, as in JSON Schema
    if not all(n is not None and n == n.to_integral_value() for n in numbers):
        return None
    seq, quantity = map(int, numbers)
    if not (1 <= seq <= MAX_LONG and 1 <= quantity <= MAX_LONG):
        return None
    price = _plain_decimal(e["unit_price"]) if type(e["unit_price"]) is _Number else None
    if price is None or price < 0 or price != price.quantize(Decimal("0.01")) or price >= 10**10:
        return None
    if e["event_type"] not in ("created", "paid", "shipped", "cancelled"):
        return None
    if e["currency"] not in ("EUR", "USD", "GBP"):
        return None
    t = _instant(e["event_time"])
    if t is None or not 1000 <= t.year <= 9999:
        return None
    if kafka_timestamp is not None and t > kafka_timestamp + timedelta(minutes=max_skew_minutes):
        return None  # the producer's clock is wrong
    return (
        e["event_id"],
        e["order_id"],
        seq,
        e["event_type"],
        e["customer_id"],
        e["product_id"],
        quantity,
        price.quantize(Decimal("0.01")),
        e["currency"],
        t,
        t.strftime("%Y-%m-%d"),
    )


def _strict_text(e: object) -> None:
    """Every string of the document is valid Unicode (no lone surrogate from a \\u escape)."""
    if isinstance(e, str):
        e.encode("utf-8")
    elif isinstance(e, dict):
        for k, v in e.items():
            _strict_text(k)
            _strict_text(v)
    elif isinstance(e, list):
        for v in e:
            _strict_text(v)
