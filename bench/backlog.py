"""Backlogs of the reference stream for the benchmarks: every twist, generated on every core."""

from __future__ import annotations

import multiprocessing
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from datetime import UTC, datetime, timedelta
from itertools import chain
from pathlib import Path

from pipelines.config import LakehouseConf
from pipelines.kafka import ensure_topic
from pipelines.reference.orders_stream import generate_orders_stream, with_every_twist

CHUNK_ORDERS = 100_000  # one generated chunk: ~240,000 records, its own seed and event-time span
EVENTS_PER_SECOND = 250  # event-time pace inside a chunk: late events (15-40 min) stay in it
T0 = datetime(2026, 11, 23, 0, 0, tzinfo=UTC)
RESULTS = Path(__file__).parent / "results"  # raw figures; not in git, made here for a clone
RESULTS.mkdir(exist_ok=True)


CHUNK_SPAN = timedelta(seconds=CHUNK_ORDERS * 2.2 / EVENTS_PER_SECOND)  # event time of a chunk


def generate_chunk(k: int, t0: datetime = T0) -> list:
    """Chunk k of the stream: every twist at its realistic rate, ids unique to the chunk."""
    options = with_every_twist(
        orders=CHUNK_ORDERS,
        seed=1000 + k,
        start_time=t0 + k * CHUNK_SPAN,
        events_per_second=EVENTS_PER_SECOND,
    )
    return generate_orders_stream(options).records


def chunks_for(records: int) -> int:
    """How many chunks hold at least `records` records."""
    return max(1, -(-records // int(CHUNK_ORDERS * 2.4)))


def generated(records: int, first_chunk: int = 0, t0: datetime = T0) -> Iterator[list]:
    """Chunks holding at least `records` records, in order, generated on every core: a backlog
    too large to hold in memory is sent a chunk at a time."""
    ks, window = range(first_chunk, first_chunk + chunks_for(records)), 2 * (os.cpu_count() or 1)
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(os.cpu_count(), mp_context=spawn) as pool:
        for i in range(0, len(ks), window):  # a few chunks ahead of the one sent, not all
            yield from pool.map(generate_chunk, ks[i : i + window], [t0] * window)


def generate(records: int, first_chunk: int = 0, t0: datetime = T0) -> list:
    """At least `records` records, generated on every core."""
    return list(chain(*generated(records, first_chunk, t0)))


def fresh(conf: LakehouseConf, name: str) -> LakehouseConf:
    """`conf` with an empty storage root (a new local folder, or a new prefix under a remote
    root: `--env s3-local` benchmarks the S3 endpoint) and a new topic `bench.<name>.<id>`,
    created; logs go to a new local folder either way (`conf.log_dir`)."""
    run = uuid.uuid4().hex[:8]
    topic = f"bench.{name}.{run}"
    local = tempfile.mkdtemp(prefix=f"lakehouse-bench-{name}-")
    root = f"{conf.root}/bench-{name}-{run}" if conf.remote else local
    conf = conf.updated(
        {"storage.root": root, "storage.log_dir": local, "streams.orders.topic": topic}
    )
    stream = conf.stream("orders")
    ensure_topic(
        conf, topic, stream.partitions, stream.replication_factor, stream.min_insync_replicas
    )
    return conf


def descendants(pid: int, exclude: frozenset[int] = frozenset()) -> Iterator[int]:
    """A process and all its descendants, now (but `exclude` and theirs)."""
    todo = [pid]
    while todo:
        p = todo.pop()
        if p in exclude:
            continue
        yield p
        try:
            todo += [int(c) for c in Path(f"/proc/{p}/task/{p}/children").read_text().split()]
        except OSError:
            continue


def cpu_ticks(stat: Path) -> int:
    """User + system clock ticks of a process or thread, from its `stat` file."""
    fields = stat.read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def cpu_seconds(pid: int, exclude: frozenset[int] = frozenset()) -> float:
    """User + system CPU seconds of a process and all its descendants (but `exclude` and theirs),
    now."""
    total = 0
    for p in descendants(pid, exclude):
        try:
            total += cpu_ticks(Path(f"/proc/{p}/stat"))
        except OSError:
            continue
    return total / os.sysconf("SC_CLK_TCK")


def commit() -> str:
    """The commit the benchmark ran on (with `+` if the work tree differs from it)."""
    git = ["git", "-C", str(Path(__file__).parent)]
    head = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    dirty = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.strip()
    return head.stdout.strip() + ("+" if dirty else "")


def record(name: str, command: str, figures: list[str], ran_on: str | None = None) -> Path:
    """Put a benchmark's latest figures in bench/RESULTS.md, in its own section (replaced each
    run), with the date, the commit (`ran_on`: the one a long run started on) and the command;
    returns the file."""
    path = Path(__file__).parent / "RESULTS.md"
    text = path.read_text() if path.exists() else RESULTS_HEADER
    heading = f"## {name}\n"
    body = (
        f"{heading}\n- when: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, commit {ran_on or commit()}, "
        f"{os.cpu_count()} cores\n- command: `{command}`\n"
        + "".join(f"- {line}\n" for line in figures)
        + "\n"
    )
    start = text.find(heading)
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + body
    else:
        end = text.find("\n## ", start + len(heading))
        text = text[:start] + body + (text[end + 1 :] if end >= 0 else "")
    path.write_text(text.rstrip("\n") + "\n")
    return path


RESULTS_HEADER = """# Benchmark results

The latest figures of every benchmark under `bench/`, each written by the benchmark itself when it
finishes (its section is replaced), with the date, the commit and the command. Raw figures of
every run go to `bench/results/*.json`. Compare a change against these before merging it.
"""
