import json
from collections import Counter
from decimal import Decimal

from pipelines.reference.orders_stream import INVALID_KINDS, StreamOptions, generate_orders_stream

ALL_TWISTS = StreamOptions(
    orders=400,
    seed=3,
    redelivery_rate=0.1,
    out_of_order_rate=0.3,
    late_rate=0.05,
    invalid_rate=0.05,
    null_key_rate=0.05,
    extra_field_rate=0.1,
)


def test_same_seed_same_records_other_seed_other_records():
    assert generate_orders_stream(ALL_TWISTS).records == generate_orders_stream(ALL_TWISTS).records
    other = StreamOptions(**{**ALL_TWISTS.__dict__, "seed": 4})
    assert generate_orders_stream(other).records != generate_orders_stream(ALL_TWISTS).records


def test_counts_add_up_and_every_invalid_kind_is_present():
    plan = generate_orders_stream(ALL_TWISTS)
    c = plan.counts()
    assert c["records"] == len(plan.records)
    assert c["records"] == c["valid_records"] + c["invalid_records"]
    assert c["valid_records"] == c["distinct_events"] + c["redeliveries"]
    assert sum(c[f"invalid.{k}"] for k in INVALID_KINDS) == c["invalid_records"]
    assert all(c[f"invalid.{k}"] >= 1 for k in INVALID_KINDS)
    assert len({r.event_id for r in plan.records if r.kind == "event"}) == c["distinct_events"]


def test_redelivery_repeats_the_same_bytes_after_the_first_delivery():
    plan = generate_orders_stream(ALL_TWISTS)
    first = {}
    for i, r in enumerate(plan.records):
        if r.kind == "event":
            first[r.event_id] = (i, r.value)
    redeliveries = [(i, r) for i, r in enumerate(plan.records) if r.kind == "redelivery"]
    assert redeliveries
    for i, r in redeliveries:
        assert r.value == first[r.event_id][1]
        assert i > first[r.event_id][0]


def test_some_orders_arrive_with_versions_out_of_order():
    plan = generate_orders_stream(ALL_TWISTS)
    seen: dict[str, list[int]] = {}
    for r in plan.records:
        if r.kind == "event":
            e = json.loads(r.value)
            seen.setdefault(e["order_id"], []).append(e["seq"])
    assert any(seqs != sorted(seqs) for seqs in seen.values())


def test_money_is_written_as_exact_decimal_text():
    plan = generate_orders_stream(ALL_TWISTS)
    for r in plan.records:
        if r.kind == "event":
            price = json.loads(r.value, parse_float=Decimal)["unit_price"]
            assert price == price.quantize(Decimal("0.01"))


def test_invalid_utf8_record_is_not_decodable():
    plan = generate_orders_stream(ALL_TWISTS)
    bad = [r.value for r in plan.records if r.kind == "invalid_utf8"]
    assert bad
    for value in bad:
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            continue
        raise AssertionError(f"valid UTF-8: {value!r}")


def test_late_events_are_sent_long_after_their_event_time():
    plan = generate_orders_stream(ALL_TWISTS)
    newest = None
    late_checked = 0
    for r in plan.records:
        if r.kind != "event":
            continue
        t = json.loads(r.value)["event_time"]
        if r.late:
            assert newest is not None and t < newest
            late_checked += 1
        newest = max(newest or t, t)
    assert late_checked == Counter(r.late for r in plan.records)[True]
