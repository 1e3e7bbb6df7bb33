import pytest
from delta.exceptions import ConcurrentAppendException

from pipelines.streaming import delta
from pipelines.streaming.delta import TXN_APP_ID, TXN_VERSION, idempotent_txn, retry_on_conflict


def test_a_conflicting_write_is_retried_until_it_commits(monkeypatch):
    monkeypatch.setattr(delta.time, "sleep", lambda _s: None)
    calls = []

    def write():
        calls.append(1)
        if len(calls) < 3:
            raise ConcurrentAppendException("files were added by a concurrent update")
        return "committed"

    assert retry_on_conflict(write, what="silver/orders") == "committed"
    assert len(calls) == 3


def test_a_write_that_keeps_conflicting_fails_after_the_last_attempt(monkeypatch):
    monkeypatch.setattr(delta.time, "sleep", lambda _s: None)

    def write():
        raise ConcurrentAppendException("again")

    with pytest.raises(ConcurrentAppendException):
        retry_on_conflict(write, what="silver/orders", attempts=3)


def test_txn_confs_are_set_inside_and_gone_after_even_on_error(spark):
    with idempotent_txn(spark, "silver:orders:q1", 7):
        assert spark.conf.get(TXN_APP_ID) == "silver:orders:q1"
        assert spark.conf.get(TXN_VERSION) == "7"
    assert spark.conf.get(TXN_APP_ID, None) is None
    with pytest.raises(RuntimeError), idempotent_txn(spark, "x", 1):
        raise RuntimeError("boom")
    assert spark.conf.get(TXN_VERSION, None) is None
