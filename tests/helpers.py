"""Helpers shared by the integration tests: producing, watching Delta commits, killing jobs."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

from pipelines.config import LakehouseConf
from pipelines.reference.orders_stream import StreamOptions, generate_orders_stream
from pipelines.reference.producer import ProduceReport, produce_plan

# the silver and gold tables of the orders stream, for comparing two runs
SILVER_AND_GOLD = [
    "silver/order_events",
    "silver/orders",
    "silver/orders_quarantine",
    "gold/revenue_by_category_1m",
    "gold/orders_by_country_5m",
    "gold/late_events",
]


def produce(conf: LakehouseConf, orders: int, seed: int, **twists: float) -> ProduceReport:
    """Send the reference stream to the configuration's topic; the report has every offset."""
    plan = generate_orders_stream(StreamOptions(orders=orders, seed=seed, **twists))
    return produce_plan(conf, plan, conf.streams["orders"].topic)


def files():
    """The test session's `Files`: paths on the S3 endpoint through S3A, as the jobs see them."""
    from pyspark.sql import SparkSession

    from pipelines.streaming.storage import Files

    return Files(SparkSession.getActiveSession() or SparkSession.builder.getOrCreate())


def s3_objects(conf: LakehouseConf) -> Path:
    """Where the S3 server keeps the objects of `conf`'s root, as files."""
    bucket, _, prefix = conf.root.removeprefix("s3a://").partition("/")
    return conf.storage_data_dir / "objects" / bucket / prefix


def delta_commits(table_path: str) -> int:
    """How many commits a Delta table has (0 before it exists)."""
    if "://" in table_path:
        return sum(n.endswith(".json") for n in files().names(f"{table_path}/_delta_log"))
    log_dir = Path(table_path) / "_delta_log"
    return len(list(log_dir.glob("*.json"))) if log_dir.exists() else 0


def remove_tree(path: str) -> None:
    """Delete a folder (a checkpoint, a table), on a local disk or on the S3 endpoint."""
    if "://" in path:
        files().delete(path, recursive=True)
    else:
        shutil.rmtree(path)


def download(folder: str, local: str) -> None:
    """Copy a folder (a table) of the S3 endpoint into a local folder that does not exist yet."""
    assert files().download(folder, Path(local)), f"{folder} does not exist"


def run_module(module: str, env: dict[str, str], *args: str, timeout: float = 300):
    """Run `python -m module args` to its end (a CLI command, a job), output captured as text."""
    cmd = [sys.executable, "-m", module, *args]
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)


def start_job(module: str, env: dict[str, str], log: Path, *args: str) -> subprocess.Popen:
    """A layer's job in its own process group (its JVM included), output appended to `log`."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@contextmanager
def running_beside(run: Callable[[], object]) -> Iterator[None]:
    """Run `run` in a thread while the block runs (an uninterrupted reference beside a job under
    test: the second core works too); its error, if any, is raised once the block ends."""
    with ThreadPoolExecutor(1) as pool:
        ran = pool.submit(run)
        yield
        ran.result()


def kill_at_random_instants(
    module: str,
    env: dict[str, str],
    log: Path,
    watched_table: str,
    rng: random.Random,
    *,
    kills: int = 3,
    batches: tuple[int, int] = (1, 3),
    jitter_s: float = 0.5,
) -> int:
    """Start `module --once` and SIGKILL it (JVM and all) `kills` times, each time after it
    committed a random number of batches to `watched_table` plus a random fraction of the next.
    Returns how many runs were really killed (a run that finished first is not)."""
    killed = 0
    for _ in range(kills):
        proc = start_job(module, env, log, "--once")
        target = delta_commits(watched_table) + rng.randint(*batches)
        deadline = time.monotonic() + 180
        poll_s = 0.5 if "://" in watched_table else 0.02  # a listing on S3 costs three processes
        while delta_commits(watched_table) < target and proc.poll() is None:
            assert time.monotonic() < deadline, log.read_text()[-2000:]
            time.sleep(poll_s)
        time.sleep(rng.uniform(0.0, jitter_s))
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            killed += 1
        proc.wait()
    return killed


def on_commit(tables: Iterable[str], check: Callable[[], bool]) -> Callable[[], bool]:
    """`check` (one that reads tables), evaluated again only once one of the Delta `tables` has a
    new commit: a poll that reads tables each time keeps a core busy."""
    tables, seen = list(tables), {}

    def gated() -> bool:
        commits = [delta_commits(t) for t in tables]
        if seen.get("commits") != commits:
            seen.update(commits=commits, result=check())
        return seen["result"]

    return gated


def wait_for(done, job: subprocess.Popen, log: Path, timeout_s: float = 180, poll_s: float = 0.2):
    """Poll `done` until true; fail with the job's log if it ends or the time runs out."""
    deadline = time.monotonic() + timeout_s
    while not done():
        assert job.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(poll_s)
