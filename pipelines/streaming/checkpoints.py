"""Reading what a Structured Streaming checkpoint says about Kafka offsets (local storage)."""

from __future__ import annotations

import json
import re
from pathlib import Path


def _batches(folder: Path) -> list[int]:
    if not folder.is_dir():
        return []
    return sorted(int(p.name) for p in folder.iterdir() if re.fullmatch(r"\d+", p.name))


def _source_offsets(text: str, topic: str) -> dict[int, int] | None:
    for line in text.splitlines()[1:]:
        line = line.strip().lstrip("\x00")
        if line.startswith("{") and f'"{topic}"' in line:
            data = json.loads(line)
            if topic in data and isinstance(data[topic], dict):
                return {int(p): int(o) for p, o in data[topic].items()}
    return None


def batch_end_offsets(checkpoint: str | Path, batch_id: int, topic: str) -> dict[int, int] | None:
    """The Kafka offsets a batch read up to (exclusive), from `offsets/<batch_id>`."""
    f = Path(checkpoint) / "offsets" / str(batch_id)
    return _source_offsets(f.read_text(errors="replace"), topic) if f.exists() else None


def initial_offsets(checkpoint: str | Path, topic: str) -> dict[int, int] | None:
    """Where the query first started reading (`sources/0/0`, written by the Kafka source)."""
    f = Path(checkpoint) / "sources" / "0" / "0"
    if not f.exists():
        return None
    text = f.read_bytes().decode(errors="replace").lstrip("\x00")
    return _source_offsets("\n" + text.split("\n", 1)[-1], topic)


def batch_start_offsets(checkpoint: str | Path, batch_id: int, topic: str) -> dict[int, int] | None:
    """Where a batch began: the previous batch's end, or the initial offsets for batch 0."""
    if batch_id == 0:
        return initial_offsets(checkpoint, topic)
    return batch_end_offsets(checkpoint, batch_id - 1, topic)


def resume_offsets(checkpoint: str | Path, topic: str) -> dict[int, int] | None:
    """Where a restart from this checkpoint reads next, per partition; None without offsets.

    A batch planned but not committed is re-run from the end of the last committed one.
    """
    ck = Path(checkpoint)
    planned = _batches(ck / "offsets")
    if not planned:
        return None
    committed = [b for b in _batches(ck / "commits") if b in planned]
    if committed:
        return batch_end_offsets(ck, committed[-1], topic)
    return initial_offsets(ck, topic)


def query_id(checkpoint: str | Path) -> str | None:
    """The id Spark gave the query of this checkpoint (new when the checkpoint is new)."""
    f = Path(checkpoint) / "metadata"
    if not f.exists():
        return None
    return json.loads(f.read_text().splitlines()[0]).get("id")
