"""What a Structured Streaming checkpoint says (offsets, query id), and rebuilding one from what
the tables recorded of it. Read and written through Hadoop's FileSystem (`Files`): a checkpoint
on a local disk and one on object storage alike."""

from __future__ import annotations

import json
import re

from pipelines.streaming.storage import Files


def batches(files: Files, folder: str) -> list[int]:
    """The batch ids that have a file in `folder` (`offsets`, `commits`), in order."""
    return sorted(int(n) for n in files.names(folder) if re.fullmatch(r"\d+", n))


def _offsets_in(files: Files, file: str, topic: str) -> dict[int, int] | None:
    """The topic's offsets per partition in a checkpoint file: the JSON line that holds them."""
    if (text := files.read_text(file)) is None:
        return None
    for line in text.splitlines():
        line = line.strip().lstrip("\x00")
        if line.startswith("{") and f'"{topic}"' in line:
            data = json.loads(line)
            if isinstance(data.get(topic), dict):
                return {int(p): int(o) for p, o in data[topic].items()}
    return None


def batch_end_offsets(
    files: Files, checkpoint: str, batch_id: int, topic: str
) -> dict[int, int] | None:
    """The Kafka offsets a batch read up to (exclusive), from `offsets/<batch_id>`."""
    return _offsets_in(files, f"{checkpoint}/offsets/{batch_id}", topic)


def planned_ms(offsets: str) -> int | None:
    """When Spark planned a batch: `batchTimestampMs` in the text of its offsets file (as
    `batch_record` keeps it), the driver's clock; a rebuilt checkpoint keeps it. None of the
    batch's writes is older."""
    for line in offsets.splitlines():
        if '"batchTimestampMs"' in line:
            return int(json.loads(line.strip().lstrip("\x00"))["batchTimestampMs"])
    return None


def initial_offsets(files: Files, checkpoint: str, topic: str) -> dict[int, int] | None:
    """Where the query first started reading (`sources/0/0`, written by the Kafka source)."""
    return _offsets_in(files, f"{checkpoint}/sources/0/0", topic)


def batch_start_offsets(
    files: Files, checkpoint: str, batch_id: int, topic: str
) -> dict[int, int] | None:
    """Where a batch began: the previous batch's end, or the initial offsets for batch 0."""
    if batch_id == 0:
        return initial_offsets(files, checkpoint, topic)
    return batch_end_offsets(files, checkpoint, batch_id - 1, topic)


def batch_offsets_read(files: Files, checkpoint: str, batch_id: int, topic: str) -> int | None:
    """How many offsets a batch read (end - start over the partitions: an upper bound on its
    records), from the checkpoint alone; None if its files do not say."""
    start = batch_start_offsets(files, checkpoint, batch_id, topic)
    end = batch_end_offsets(files, checkpoint, batch_id, topic)
    if start is None or end is None:
        return None
    return sum(max(0, o - start.get(p, 0)) for p, o in end.items())


def resume_offsets(files: Files, checkpoint: str, topic: str) -> dict[int, int] | None:
    """Where a restart from this checkpoint reads next, per partition; None without offsets.

    A batch planned but not committed is re-run from the end of the last committed one.
    """
    planned = batches(files, f"{checkpoint}/offsets")
    if not planned:
        return None
    committed = [b for b in batches(files, f"{checkpoint}/commits") if b in planned]
    return batch_start_offsets(files, checkpoint, max(committed, default=-1) + 1, topic)


def query_id(files: Files, checkpoint: str) -> str | None:
    """The id Spark gave the query of this checkpoint (new when the checkpoint is new)."""
    text = files.read_text(f"{checkpoint}/metadata")
    return json.loads(text.splitlines()[0]).get("id") if text else None


def batch_record(files: Files, checkpoint: str, batch_id: int) -> dict[str, object]:
    """What a batch's table commits record of the checkpoint (Spark's own files, verbatim), so
    that a lost checkpoint can be rebuilt to run that batch again, the same batch."""
    record: dict[str, object] = {"query": query_id(files, checkpoint), "batch": batch_id}
    offsets = files.read_text(f"{checkpoint}/offsets/{batch_id}")
    if offsets is None:  # a batch run by hand, not by the query
        return record
    record["offsets"] = offsets
    if batch_id > 0:
        record["previous"] = files.read_text(f"{checkpoint}/offsets/{batch_id - 1}")
        record["commit"] = files.read_text(f"{checkpoint}/commits/{batch_id - 1}")
    return record


def source_offsets(offsets: str) -> list[dict]:
    """The offsets of each source in the text of an offsets file (as `batch_record` keeps it):
    the JSON objects after its version and metadata lines ({} for a source without one)."""
    lines = [line.strip().lstrip("\x00") for line in offsets.splitlines()][2:]
    found = []
    for line in lines:
        try:
            value = json.loads(line)
        except ValueError:
            value = None
        found.append(value if isinstance(value, dict) else {})
    return found


def rebuild(files: Files, checkpoint: str, record: dict) -> None:
    """A checkpoint in which the recorded batch is next, under its own query id: its writes that
    committed are skipped (the tables' commits record the batch), the others are done."""
    batch = int(record["batch"])
    for folder in ("offsets", "commits"):
        files.mkdirs(f"{checkpoint}/{folder}")
    # the query id last: a checkpoint without it counts as lost, and is rebuilt again
    files.write_text(f"{checkpoint}/offsets/{batch}", record["offsets"])
    if batch > 0:
        files.write_text(f"{checkpoint}/offsets/{batch - 1}", record["previous"])
        files.write_text(f"{checkpoint}/commits/{batch - 1}", record["commit"])
    files.write_text(f"{checkpoint}/metadata", json.dumps({"id": record["query"]}) + "\n")
