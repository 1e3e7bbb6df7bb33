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


def test_a_retry_that_waits_for_something_starts_when_it_is_there_without_a_backoff(monkeypatch):
    monkeypatch.setattr(delta.time, "sleep", lambda s: pytest.fail(f"slept {s} s"))
    events = []

    def write():
        events.append("write")
        if events.count("write") < 3:
            raise ConcurrentAppendException("a MERGE committed meanwhile")
        return "committed"

    def wait(_attempt):
        events.append("wait")
        return "right after version 7"

    assert retry_on_conflict(write, what="silver/orders", wait=wait) == "committed"
    assert events == ["write", "wait", "write", "wait", "write"]


def test_txn_confs_are_set_inside_and_gone_after_even_on_error(spark):
    with idempotent_txn(spark, "silver:orders:q1", 7):
        assert spark.conf.get(TXN_APP_ID) == "silver:orders:q1"
        assert spark.conf.get(TXN_VERSION) == "7"
    assert spark.conf.get(TXN_APP_ID, None) is None
    with pytest.raises(RuntimeError), idempotent_txn(spark, "x", 1):
        raise RuntimeError("boom")
    assert spark.conf.get(TXN_VERSION, None) is None


def test_an_append_is_found_by_the_batch_its_commit_records_and_a_replay_appends_nothing(
    spark, tmp_path
):
    """The batch record in the commits says which batch of a query a table holds, newest first,
    no further back than asked; a replayed append commits nothing, the next batch appends."""
    import json
    import time

    from pipelines.errors import JobFailedError
    from pipelines.streaming.delta import newest_tagged_batch
    from pipelines.streaming.sink import IdempotentSink

    path = str(tmp_path / "t")
    rows = spark.range(2).selectExpr("id", "'x' AS v")
    for query, batch in [("q1", 0), ("q2", 5), ("q1", 1), (None, None)]:
        with idempotent_txn(spark, None, 0, query and json.dumps({"query": query, "batch": batch})):
            rows.write.format("delta").mode("append").save(path)
    assert spark.conf.get(TXN_APP_ID, None) is None
    assert newest_tagged_batch(spark, path, "q1", None) == 1
    assert newest_tagged_batch(spark, path, "q2", None) == 5
    assert newest_tagged_batch(spark, path, "q3", None) is None
    later = int(time.time() * 1000) + 60_000  # every commit is older: none is read past the first
    assert newest_tagged_batch(spark, path, "q1", later) is None

    class Sink(IdempotentSink):
        def write_batch(self, batch, batch_id):
            self.append(batch, "t", path, batch_id)

    checkpoint = tmp_path / "ck"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text('{"id":"q1"}\n')
    sink = Sink(str(checkpoint))
    versions = lambda: spark.sql(f"DESCRIBE HISTORY delta.`{path}`").count()  # noqa: E731
    sink(rows, 1)  # a replay of batch 1: committed already
    assert versions() == 4
    sink(rows, 2)  # the next batch: appended
    assert versions() == 5
    assert newest_tagged_batch(spark, path, "q1", None) == 2
    sink(rows, 2)  # again: a replay
    assert (versions(), spark.read.format("delta").load(path).count()) == (5, 10)

    delta.snapshot(spark, path).deltaLog().checkpoint()
    (tmp_path / "t" / "_delta_log" / f"{0:020d}.json").unlink()  # the log, cleaned up
    with pytest.raises(JobFailedError, match="no longer holds version 0"):
        newest_tagged_batch(spark, path, "q3", None)


def test_a_cached_pinned_read_stays_as_it_was_when_its_table_is_written(spark, tmp_path):
    """Spark re-plans every cached frame that reads a table it writes (the plain read sees the
    new rows); a frame over `read_pinned` keeps the version it was read at, and is not re-planned."""
    path = str(tmp_path / "t")
    spark.range(3).write.format("delta").save(path)
    pinned = delta.read_pinned(spark, path).persist()
    plain = spark.read.format("delta").load(path).persist()
    try:
        assert (pinned.count(), plain.count()) == (3, 3)
        spark.range(3, 5).write.format("delta").mode("append").save(path)
        assert (pinned.count(), plain.count()) == (3, 5)
        assert sorted(r.id for r in pinned.collect()) == [0, 1, 2]
    finally:
        pinned.unpersist()
        plain.unpersist()


def test_session_confs_hold_inside_the_block_and_what_was_there_comes_back(spark):
    from pipelines.streaming.spark import COMPILED, FACTORY_MODE, INTERPRETED, session_confs

    assert spark.conf.get(FACTORY_MODE, None) is None
    with pytest.raises(RuntimeError), session_confs(spark, INTERPRETED):
        assert spark.conf.get(FACTORY_MODE) == "NO_CODEGEN"
        with session_confs(spark, COMPILED):
            assert spark.conf.get(FACTORY_MODE) == "FALLBACK"
        assert spark.conf.get(FACTORY_MODE) == "NO_CODEGEN"
        raise RuntimeError("a failed write")
    assert spark.conf.get(FACTORY_MODE, None) is None


def test_a_lost_checkpoint_is_rebuilt_only_from_batches_that_read_its_own_source(spark, tmp_path):
    """The state table takes writes of queries on other sources (the silver job reads bronze,
    the pipeline reads Kafka): the pipeline's state query, which reads the events table, must
    not start at their positions."""
    import json

    from pipelines.streaming.checkpoints import query_id
    from pipelines.streaming.storage import Files

    def table(name: str) -> str:
        path = str(tmp_path / name)
        spark.range(1).write.format("delta").save(path)
        return path

    events, bronze, target = table("events"), table("bronze"), table("state")

    def offsets(source: dict) -> str:
        meta = {"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}}
        return "\n".join(["v1", json.dumps(meta), json.dumps(source)])

    def reservoir(path: str, version: int) -> dict:
        table_id = delta.snapshot(spark, path).metadata().id()
        return {"sourceVersion": 1, "reservoirId": table_id, "reservoirVersion": version}

    def commit(query: str, batch: int, source: dict) -> None:
        record = {"query": query, "batch": batch, "offsets": offsets(source)}
        record |= {"previous": offsets(source), "commit": "v1\n{}"}
        with idempotent_txn(spark, None, batch, json.dumps(record)):
            spark.range(1).write.format("delta").mode("append").save(target)

    commit("state-query", 4, reservoir(events, 9))
    commit("silver-job", 7, reservoir(bronze, 3))  # newer, of another source
    commit("pipeline", 8, {"orders": {"0": 12}})  # newer still, Kafka's offsets
    reads_events = delta.reads_table(spark, events)

    checkpoint = tmp_path / "ck-state"
    delta.recover_checkpoint(spark, str(checkpoint), [target], "state", reads_events)
    assert query_id(Files(spark), str(checkpoint)) == "state-query"
    assert (checkpoint / "offsets" / "4").read_text() == offsets(reservoir(events, 9))

    nothing = tmp_path / "ck-other"  # no batch of its source: it starts afresh
    delta.recover_checkpoint(spark, str(nothing), [target], "x", delta.reads_table(spark, target))
    assert not nothing.exists()
    kafka = tmp_path / "ck-pipeline"
    delta.recover_checkpoint(spark, str(kafka), [target], "pipeline", lambda o: "orders" in o)
    assert query_id(Files(spark), str(kafka)) == "pipeline"


def test_writes_side_by_side_each_commit_once_per_batch_and_a_failure_is_raised_after_all_end(
    spark, tmp_path, caplog
):
    """Two MERGEs and an append of one batch run side by side (each MERGE tagged in a session of
    its own): each commits once with the batch's record; a replay commits nothing; a failing
    write is raised once the others ended, and their commits stand for the re-run to skip."""
    import json
    import logging

    from delta.tables import DeltaTable

    from pipelines import logs
    from pipelines.streaming.sink import IdempotentSink

    paths = {n: str(tmp_path / n) for n in ("a", "b", "c")}
    for path in paths.values():
        spark.range(0).selectExpr("id", "0L AS n").write.format("delta").save(path)
    fail = {"b": False}

    class Sink(IdempotentSink):
        def write_batch(self, batch, batch_id):
            def merge(name):
                if fail.get(name):
                    raise RuntimeError(f"{name} is down")
                logs.get("test").warning("merging %s", name)
                self.transaction(
                    name,
                    batch_id,
                    lambda s: (
                        DeltaTable.forPath(s, paths[name])
                        .alias("t")
                        .merge(batch.alias("s"), "t.id = s.id")
                        .whenMatchedUpdate(set={"n": "t.n + s.n"})
                        .whenNotMatchedInsertAll()
                        .execute()
                    ),
                )

            self.in_parallel(
                lambda: merge("a"),
                lambda: merge("b"),
                lambda: self.append(batch, "c", paths["c"], batch_id),
            )

    checkpoint = tmp_path / "ck"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text('{"id":"q1"}\n')
    sink = Sink(str(checkpoint))
    rows = spark.range(3).selectExpr("id", "1L AS n")
    versions = {
        n: (lambda p=p: spark.sql(f"DESCRIBE HISTORY delta.`{p}`").count())
        for n, p in paths.items()
    }
    caplog.set_level(logging.WARNING, logger="lakehouse.test")
    sink(rows, 0)
    sink(rows, 0)  # a replay: nothing commits
    assert {n: v() for n, v in versions.items()} == {"a": 2, "b": 2, "c": 2}
    assert sorted(r.getMessage() for r in caplog.records if r.name == "lakehouse.test") == [
        "merging a", "merging a", "merging b", "merging b",
    ]  # fmt: skip
    fail["b"] = True
    with pytest.raises(RuntimeError, match="b is down"):
        sink(rows, 1)
    assert {n: v() for n, v in versions.items()} == {"a": 3, "b": 2, "c": 3}
    fail["b"] = False
    sink(rows, 1)  # the re-run: only b is written
    assert {n: v() for n, v in versions.items()} == {"a": 3, "b": 3, "c": 3}
    for name in ("a", "b"):
        table = spark.read.format("delta").load(paths[name])
        assert sorted(map(tuple, table.collect())) == [(0, 2), (1, 2), (2, 2)]
        history = DeltaTable.forPath(spark, paths[name]).history().collect()
        assert sorted(json.loads(h["userMetadata"])["batch"] for h in history[:-1]) == [0, 1]
    assert spark.read.format("delta").load(paths["c"]).count() == 6
    assert spark.conf.get(TXN_APP_ID, None) is None


def test_a_batchs_spark_jobs_are_described_by_its_batch_and_step_on_every_thread(spark, tmp_path):
    """Spark's UI and History Server list each Spark job of a batch under the batch's description
    (the query's) and the step that ran it, writes side by side on threads of their own too."""
    from pipelines.streaming.sink import DESCRIPTION, IdempotentSink

    seen = {}

    class Sink(IdempotentSink):
        def write_batch(self, batch, batch_id):
            local = batch.sparkSession.sparkContext.getLocalProperty

            def look(name):
                with self.step(name):
                    seen[name] = local(DESCRIPTION)

            look("parse")
            self.in_parallel(lambda: look("a"), lambda: look("b"))
            seen["after"] = local(DESCRIPTION)

    checkpoint = tmp_path / "ck"
    checkpoint.mkdir()
    (checkpoint / "metadata").write_text('{"id":"q1"}\n')
    sc = spark.sparkContext
    sc.setJobDescription("orders\nbatch = 0")  # as a streaming query describes its batch
    try:
        Sink(str(checkpoint))(spark.range(1), 0)
    finally:
        sc.setJobDescription(None)  # type: ignore[arg-type]
    batch = "orders\nbatch = 0"
    assert seen == {
        "parse": f"{batch}\nparse", "a": f"{batch}\na", "b": f"{batch}\nb", "after": batch,
    }  # fmt: skip
