"""What a Structured Streaming checkpoint says (offsets, query id), and rebuilding one from what
the tables recorded of it (local storage)."""

from __future__ import annotations

import json
import re
from pathlib import Path


def _batches(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if re.fullmatch(r"\d+", p.name))


def _offsets_in(file: Path, topic: str) -> dict[int, int] | None:
    """The topic's offsets per partition in a checkpoint file: the JSON line that holds them."""
    if not file.exists():
        return None
    for line in file.read_text(errors="replace").splitlines():
        line = line.strip().lstrip("\x00")
        if line.startswith("{") and f'"{topic}"' in line:
            data = json.loads(line)
            if isinstance(data.get(topic), dict):
                return {int(p): int(o) for p, o in data[topic].items()}
    return None


def batch_end_offsets(checkpoint: str | Path, batch_id: int, topic: str) -> dict[int, int] | None:
    """The Kafka offsets a batch read up to (exclusive), from `offsets/<batch_id>`."""
    return _offsets_in(Path(checkpoint) / "offsets" / str(batch_id), topic)


def batch_time_ms(checkpoint: str | Path, batch_id: int) -> int | None:
    """When Spark planned a batch (`batchTimestampMs` of `offsets/<batch_id>`, the driver's clock;
    a rebuilt checkpoint keeps it): none of the batch's writes is older. None without the file."""
    file = Path(checkpoint) / "offsets" / str(batch_id)
    if not file.exists():
        return None
    for line in file.read_text(errors="replace").splitlines():
        if '"batchTimestampMs"' in line:
            return int(json.loads(line.strip().lstrip("\x00"))["batchTimestampMs"])
    return None


def initial_offsets(checkpoint: str | Path, topic: str) -> dict[int, int] | None:
    """Where the query first started reading (`sources/0/0`, written by the Kafka source)."""
    return _offsets_in(Path(checkpoint) / "sources" / "0" / "0", topic)


def batch_start_offsets(checkpoint: str | Path, batch_id: int, topic: str) -> dict[int, int] | None:
    """Where a batch began: the previous batch's end, or the initial offsets for batch 0."""
    if batch_id == 0:
        return initial_offsets(checkpoint, topic)
    return batch_end_offsets(checkpoint, batch_id - 1, topic)


def batch_offsets_read(checkpoint: str | Path, batch_id: int, topic: str) -> int | None:
    """How many offsets a batch read (end - start over the partitions: an upper bound on its
    records), from the checkpoint alone; None if its files do not say."""
    start = batch_start_offsets(checkpoint, batch_id, topic)
    end = batch_end_offsets(checkpoint, batch_id, topic)
    if start is None or end is None:
        return None
    return sum(max(0, o - start.get(p, 0)) for p, o in end.items())


def resume_offsets(checkpoint: str | Path, topic: str) -> dict[int, int] | None:
    """Where a restart from this checkpoint reads next, per partition; None without offsets.

    A batch planned but not committed is re-run from the end of the last committed one.
    """
    ck = Path(checkpoint)
    planned = _batches(ck / "offsets")
    if not planned:
        return None
    committed = [b for b in _batches(ck / "commits") if b in planned]
    return batch_start_offsets(ck, max(committed, default=-1) + 1, topic)


def query_id(checkpoint: str | Path) -> str | None:
    """The id Spark gave the query of this checkpoint (new when the checkpoint is new)."""
    f = Path(checkpoint) / "metadata"
    return json.loads(f.read_text().splitlines()[0]).get("id") if f.exists() else None


def batch_record(checkpoint: str | Path, batch_id: int) -> dict[str, object]:
    """What a batch's table commits record of the checkpoint (Spark's own files, verbatim), so
    that a lost checkpoint can be rebuilt to run that batch again, the same batch."""
    ck = Path(checkpoint)
    record: dict[str, object] = {"query": query_id(ck), "batch": batch_id}
    if not (ck / "offsets" / str(batch_id)).exists():  # a batch run by hand, not by the query
        return record
    record["offsets"] = (ck / "offsets" / str(batch_id)).read_text()
    if batch_id > 0:
        record["previous"] = (ck / "offsets" / str(batch_id - 1)).read_text()
        record["commit"] = (ck / "commits" / str(batch_id - 1)).read_text()
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


def rebuild(checkpoint: str | Path, record: dict) -> None:
    """A checkpoint in which the recorded batch is next, under its own query id: its writes that
    committed are skipped (the tables' commits record the batch), the others are done."""
    ck, batch = Path(checkpoint), int(record["batch"])
    for folder in ("offsets", "commits"):
        (ck / folder).mkdir(parents=True, exist_ok=True)
    (ck / "metadata").write_text(json.dumps({"id": record["query"]}) + "\n")
    (ck / "offsets" / str(batch)).write_text(record["offsets"])
    if batch > 0:
        (ck / "offsets" / str(batch - 1)).write_text(record["previous"])
        (ck / "commits" / str(batch - 1)).write_text(record["commit"])
