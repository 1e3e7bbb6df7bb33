import logging

from pipelines.streaming import checkpoints
from pipelines.streaming.console import kafka_lag
from pipelines.streaming.storage import Files

HEADER = 'v1\n{"batchWatermarkMs":0,"batchTimestampMs":1,"conf":{}}\n'


def make_checkpoint(root, offsets: dict[int, dict], commits: list[int], initial: dict):
    (root / "offsets").mkdir(parents=True)
    (root / "commits").mkdir()
    (root / "sources" / "0").mkdir(parents=True)
    import json

    for batch, offs in offsets.items():
        (root / "offsets" / str(batch)).write_text(HEADER + json.dumps({"t": offs}))
    for batch in commits:
        (root / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    (root / "sources" / "0" / "0").write_bytes(b"\x00v1\n" + json.dumps({"t": initial}).encode())


def test_resume_after_the_last_committed_batch(spark, tmp_path):
    make_checkpoint(tmp_path, {0: {"0": 5}, 1: {"0": 9}, 2: {"0": 14}}, [0, 1], {"0": 0})
    assert checkpoints.resume_offsets(Files(spark), str(tmp_path), "t") == {0: 9}
    assert checkpoints.batch_start_offsets(Files(spark), str(tmp_path), 2, "t") == {0: 9}
    assert checkpoints.batch_end_offsets(Files(spark), str(tmp_path), 2, "t") == {0: 14}


def test_resume_from_the_initial_offsets_when_nothing_committed(spark, tmp_path):
    make_checkpoint(tmp_path, {0: {"0": 5, "1": 2}}, [], {"0": 3, "1": 0})
    assert checkpoints.resume_offsets(Files(spark), str(tmp_path), "t") == {0: 3, 1: 0}
    assert checkpoints.batch_start_offsets(Files(spark), str(tmp_path), 0, "t") == {0: 3, 1: 0}


def test_no_checkpoint_means_no_offsets(spark, tmp_path):
    assert checkpoints.resume_offsets(Files(spark), str(tmp_path / "missing"), "t") is None
    assert checkpoints.batch_offsets_read(Files(spark), str(tmp_path / "missing"), 0, "t") is None


def test_a_batch_read_the_offsets_between_its_start_and_its_end(spark, tmp_path):
    # partition 2 appears in batch 1 (read from 0); batch 0 starts at the initial offsets
    make_checkpoint(tmp_path, {0: {"0": 5, "1": 2}, 1: {"0": 9, "1": 2, "2": 4}}, [0], {"0": 3})
    assert checkpoints.batch_offsets_read(Files(spark), str(tmp_path), 0, "t") == 2 + 2
    assert checkpoints.batch_offsets_read(Files(spark), str(tmp_path), 1, "t") == 4 + 0 + 4
    assert checkpoints.batch_offsets_read(Files(spark), str(tmp_path), 2, "t") is None


def test_lag_sums_offsets_behind_over_partitions():
    assert kafka_lag('{"t":{"0":100,"1":50}}', '{"t":{"0":90,"1":50}}') == 10
    assert kafka_lag(None, '{"t":{"0":1}}') is None
    assert kafka_lag("null", '{"sourceVersion":1,"reservoirVersion":3}') is None


def test_the_console_says_where_a_batch_s_time_went(caplog):
    from types import SimpleNamespace

    from pipelines.streaming.console import ConsoleProgress

    steps = {7: {"silver.parse": 1.234, "silver/order_events": 0.5}}
    caplog.set_level(logging.INFO, logger="lakehouse.progress")
    console = ConsoleProgress("pipeline", steps=steps)
    batch = SimpleNamespace(
        batchId=7,
        numInputRows=3000,
        sources=[],
        durationMs={"triggerExecution": 2000, "addBatch": 1900},
        processedRowsPerSecond=1500.0,
    )
    console._print(batch)
    console._print(SimpleNamespace(**{**vars(batch), "batchId": 8}))  # no steps: one line
    assert [(r.getMessage(), r.batch_id) for r in caplog.records] == [
        ("[pipeline] batch 7: 3,000 rows in 2.0s (1,500 rows/s), 3,000 rows so far", 7),
        ("[pipeline]   where the time went: silver.parse 1.2s, silver/order_events 0.5s", 7),
        ("[pipeline] batch 8: 3,000 rows in 2.0s (1,500 rows/s), 6,000 rows so far", 8),
    ]
