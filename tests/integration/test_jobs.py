"""The job runner with real spark-submit: order, parallel branches, retries, run_if, timeouts,
the runs table, and a continuous job stopped gracefully."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from datetime import UTC, datetime, timedelta
from importlib.metadata import version
from pathlib import Path

import pytest

from pipelines.orchestration.runner import JobRunner
from pipelines.orchestration.runs import read_runs
from pipelines.orchestration.spec import load_job_spec
from tests.conftest import subprocess_env
from tests.helpers import delta_commits, produce

pytestmark = pytest.mark.integration

TASK = textwrap.dedent("""
    import json, os, sys, time, pathlib
    out, name, mode, seconds = pathlib.Path(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4])
    tries = out / f"{name}.tries"
    attempt = int(tries.read_text()) if tries.exists() else 0
    tries.write_text(str(attempt + 1))
    start = time.time()
    time.sleep(seconds)
    if mode == "fail" or (mode == "flaky" and attempt == 0):
        print(f"error: {name} failed on purpose (attempt {attempt})", flush=True)
        sys.exit(3)
    (out / f"{name}.json").write_text(json.dumps(
        {"start": start, "end": time.time(), "argv": sys.argv[1:], "run_id": os.environ["LAKEHOUSE_JOB_RUN_ID"]}))
""")


def _spec(tmp_path: Path) -> Path:
    script = tmp_path / "task.py"
    script.write_text(TASK)
    out = tmp_path / "out"
    out.mkdir()

    def task(key, mode="ok", seconds=0.0, deps=(), **extra):
        return {
            "task_key": key,
            "depends_on": [{"task_key": d} for d in deps],
            "spark_python_task": {
                "python_file": str(script),
                "parameters": [
                    str(out),
                    "{{task.name}}",
                    mode,
                    str(seconds),
                    "{{job.parameters.color}}",
                ],
            },
            **extra,
        }

    spec = {
        "name": "runner-test",
        "parameters": [{"name": "color", "default": "blue"}],
        "tasks": [
            task("a", seconds=1),
            task("b", seconds=4, deps=["a"]),
            task("c", seconds=4, deps=["a"]),
            task("d", "flaky", deps=["b", "c"], max_retries=2, min_retry_interval_millis=1500),
            task("e", "fail", deps=["d"], max_retries=1),
            task("f", deps=["e"]),  # run_if ALL_SUCCESS: not run
            task("g", deps=["e"], run_if="AT_LEAST_ONE_FAILED"),
            task("h", seconds=600, timeout_seconds=8),
        ],
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def test_runner_orders_parallelises_retries_applies_run_if_and_times_out(lake, tmp_path):
    spec = load_job_spec(_spec(tmp_path))
    lines: list[str] = []
    run = JobRunner(
        lake,
        spec,
        parameters={"color": "red"},
        grace_seconds=10,
        echo=lines.append,
        env=subprocess_env(lake),
    ).run()
    out = tmp_path / "out"
    done = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}

    assert run.states == {
        "a": "SUCCESS",
        "b": "SUCCESS",
        "c": "SUCCESS",
        "d": "SUCCESS",
        "e": "FAILED",
        "f": "UPSTREAM_FAILED",
        "g": "SUCCESS",
        "h": "TIMEDOUT",
    }, "\n".join(lines)
    assert run.state == "FAILED"
    assert sorted(done) == ["a", "b", "c", "d", "g"]
    # dependency order, and b, c in parallel
    assert done["a"]["end"] <= done["b"]["start"] and done["a"]["end"] <= done["c"]["start"]
    assert max(done["b"]["start"], done["c"]["start"]) < min(done["b"]["end"], done["c"]["end"])
    assert done["d"]["start"] >= max(done["b"]["end"], done["c"]["end"])
    # parameters: task name and job parameter resolved, run id handed to the task
    assert done["b"]["argv"][1:] == ["b", "ok", "4", "red"]
    assert done["b"]["run_id"] == str(run.run_id)
    # retries: d failed once then succeeded; e used its one retry; h was not retried
    assert (out / "d.tries").read_text() == "2" and (out / "e.tries").read_text() == "2"
    assert (out / "h.tries").read_text() == "1"

    rows = read_runs(lake, run.run_id)
    assert sorted((r["task"], r["attempt"], r["state"]) for r in rows) == [
        ("a", 0, "SUCCESS"),
        ("b", 0, "SUCCESS"),
        ("c", 0, "SUCCESS"),
        ("d", 0, "FAILED"),
        ("d", 1, "SUCCESS"),
        ("e", 0, "FAILED"),
        ("e", 1, "FAILED"),
        ("f", 0, "UPSTREAM_FAILED"),
        ("g", 0, "SUCCESS"),
        ("h", 0, "TIMEDOUT"),
    ]
    by_key = {(r["task"], r["attempt"]): r for r in rows}
    assert by_key[("e", 1)]["message"] == "exit code 3: e failed on purpose (attempt 1)"
    assert by_key[("h", 0)]["message"] == "timed out after 8s"
    assert 8 <= by_key[("h", 0)]["duration_s"] < 8 + 10 + 5
    assert by_key[("d", 1)]["start_time"] >= by_key[("d", 0)]["end_time"]
    for r in rows:
        if r["state"] not in ("UPSTREAM_FAILED",):
            assert (
                Path(r["log_path"]).is_file() and "spark-submit" in Path(r["log_path"]).read_text()
            )

    listing = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "jobs", "runs", "--run-id", str(run.run_id)],
        env=subprocess_env(lake),
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert listing.count(f"{run.run_id} ") == 10
    assert "e failed on purpose (attempt 1)" in listing


def _checkpoint_batches(checkpoint: str) -> tuple[int, int]:
    """(last planned batch, last committed batch) of a streaming checkpoint."""

    def last(folder: str) -> int:
        return max(int(p.name) for p in Path(checkpoint, folder).iterdir() if p.name.isdigit())

    return last("offsets"), last("commits")


def _txn_versions(table: str) -> list[int]:
    """The batch ids of every idempotent write in a Delta table's log: the batch its commit
    records (appends and MERGEs), and a MERGE's txn version."""
    versions = []
    for f in Path(table, "_delta_log").glob("*.json"):
        for line in f.read_text().splitlines():
            action = json.loads(line)
            if "txn" in action:
                versions.append(action["txn"]["version"])
            record = json.loads(action.get("commitInfo", {}).get("userMetadata") or "{}")
            if "batch" in record:
                versions.append(record["batch"])
    return versions


def _start_runner(env: dict[str, str], log: Path) -> subprocess.Popen:
    command = [sys.executable, "-m", "pipelines.cli", "jobs", "run"]
    command += ["conf/jobs/orders_continuous.yaml", "--param", "env=test", "--grace-seconds", "90"]
    with open(log, "wb") as out:
        return subprocess.Popen(
            command, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )


def _all_running(conf) -> bool:
    """Every long-running task of the continuous job's run has started its query."""
    logs = {p.name: p.read_text() for p in Path(conf.root, "_jobs", "logs").glob("*/*-0.log")}
    marks = {"bronze": "started (id", "silver": "started (id", "gold": "started (id"}
    marks["publish"] = "[publish] "
    return all(mark in logs.get(f"{task}-0.log", "") for task, mark in marks.items())


def _processes_of_runner(pid: int) -> list[int]:
    """The processes started for the runner `pid`: its tasks' spark-submit JVMs and drivers."""
    mine = f"LAKEHOUSE_RUNNER={pid}:".encode()
    found = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if mine in environ.read_bytes():
                found.append(int(environ.parent.name))
        except OSError:  # gone meanwhile, or not ours to read
            pass
    return found


def test_a_killed_runner_takes_its_tasks_with_it_and_the_next_stops_gracefully_on_sigterm(
    spark, lake, tmp_path
):
    from pyspark.sql import functions as F

    from pipelines.layers.bronze import bronze_tables
    from pipelines.layers.gold import gold_tables
    from pipelines.layers.silver import silver_tables
    from pipelines.orchestration.runs import close_dead_runs
    from pipelines.streaming import checkpoints
    from pipelines.streaming.storage import Files

    produce(lake, orders=300, seed=51, redelivery_rate=0.05, invalid_rate=0.02)
    env = subprocess_env(
        lake,
        LAKEHOUSE__BRONZE__TRIGGER_INTERVAL="1 second",
        LAKEHOUSE__SILVER__TRIGGER_INTERVAL="1 second",
        LAKEHOUSE__GOLD__TRIGGER_INTERVAL="1 second",
    )
    stream = lake.streams["orders"]
    bronze, silver, gold = (
        bronze_tables(lake, stream),
        silver_tables(lake, stream),
        gold_tables(lake),
    )
    # the first runner dies without a word (what an OOM killer does) once bronze has written and
    # every task is running its query (a task still starting dies with its JVM, unlogged)
    first = _start_runner(env, tmp_path / "runner-1.log")
    deadline = time.monotonic() + 300
    try:
        while delta_commits(bronze.raw) < 2 or not _all_running(lake):
            assert first.poll() is None and time.monotonic() < deadline, (
                tmp_path / "runner-1.log"
            ).read_text()[-3000:]
            time.sleep(0.5)
        tasks = _processes_of_runner(first.pid)
        assert len(tasks) >= 6, tasks  # three layers at least: a JVM and a Python driver each
        os.killpg(first.pid, signal.SIGKILL)
        first.wait()
        deadline = time.monotonic() + 120
        while _processes_of_runner(first.pid):  # its tasks stop with it, within seconds
            assert time.monotonic() < deadline, _processes_of_runner(first.pid)
            time.sleep(0.5)
    finally:
        for pid in _processes_of_runner(first.pid):
            os.kill(pid, signal.SIGKILL)
    resumed_at = checkpoints.resume_offsets(Files(spark), bronze.checkpoint, stream.topic) or {}
    produce(lake, orders=100, seed=52)  # so that every layer of the next run has a batch to do

    # the next runner closes the dead run's rows when it starts; once gold has added a batch,
    # it gets a SIGTERM to its whole process group, as Kubernetes or systemd send
    log = tmp_path / "runner-2.log"
    runner = _start_runner(env, log)
    gold_commits = max(2, delta_commits(gold.aggregates["gold/revenue_by_category_1m"]) + 1)
    deadline = time.monotonic() + 300
    try:
        while delta_commits(gold.aggregates["gold/revenue_by_category_1m"]) < gold_commits:
            assert runner.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        os.killpg(runner.pid, signal.SIGTERM)
        assert runner.wait(timeout=180) == 130, log.read_text()[-3000:]
    finally:
        if runner.poll() is None:
            runner.terminate()
            runner.wait(timeout=180)

    text = log.read_text()
    runs: dict[int, dict[str, dict]] = {}
    for r in read_runs(lake):
        if r["job"] == "orders-continuous":
            runs.setdefault(r["run_id"], {})[r["task"]] = r
    (dead_id, dead), (run_id, last) = sorted(runs.items())
    died = f"its job runner (pid {first.pid} on {socket.gethostname()}) died"
    assert {t: (r["state"], r["message"].split(";")[0]) for t, r in dead.items()} == {
        "setup": ("SUCCESS", ""),
        "bronze": ("FAILED", died),
        "silver": ("FAILED", died),
        "gold": ("FAILED", died),
        "publish": ("FAILED", died),
    }
    for task in ("bronze", "silver", "gold", "publish"):
        assert "the job runner (pid" in Path(dead[task]["log_path"]).read_text()
    assert close_dead_runs(lake) == []  # the second runner closed them, once
    rows = list(last.values())
    states = {r["task"]: (r["state"], r["exit_code"]) for r in rows}
    assert states == {
        "setup": ("SUCCESS", 0),
        "bronze": ("CANCELED", 0),
        "silver": ("CANCELED", 0),
        "gold": ("CANCELED", 0),
        "publish": ("CANCELED", 0),
    }, text[-3000:]
    for r in rows:
        task_log = Path(r["log_path"]).read_text()
        # the only traceback allowed: a batch that started after the signal, refused unwritten
        assert "Traceback" not in task_log or "StopRequested" in task_log, task_log[-3000:]
        if r["task"] == "publish":
            assert "SIGTERM received, stopping after the current transaction" in task_log
        elif r["task"] != "setup":
            assert "SIGTERM received, stopping after the current batch" in task_log
    # nothing half-written: no table holds a write of a batch its checkpoint did not commit
    layers = {
        bronze.checkpoint: [bronze.raw],
        silver.checkpoint: [silver.events, silver.quarantine],
        silver.state_checkpoint: [silver.state],
        gold.checkpoint: [
            gold.aggregates["gold/revenue_by_category_1m"],
            gold.aggregates["gold/orders_by_country_5m"],
            gold.late,
            gold.high_water,
        ],
    }
    for checkpoint, tables in layers.items():
        _, committed = _checkpoint_batches(checkpoint)
        for table in tables:
            assert max(_txn_versions(table), default=-1) <= committed, (table, committed)
    assert max(_txn_versions(gold.aggregates["gold/revenue_by_category_1m"])) >= 1
    # and bronze holds exactly the records up to the last committed batch's end offsets
    ends = checkpoints.batch_end_offsets(
        Files(spark), bronze.checkpoint, _checkpoint_batches(bronze.checkpoint)[1], stream.topic
    )
    in_table = {
        r[0]: r[1] + 1
        for r in spark.read.format("delta")
        .load(bronze.raw)
        .groupBy("partition")
        .agg(F.max("offset"))
        .collect()
    }
    assert in_table == {p: o for p, o in ends.items() if o > 0}

    # the progress table: one row per batch of each layer, tagged with the job run and task
    events = spark.read.format("delta").load(lake.table_path("system/query_progress"))
    events = events.where(F.col("job_run_id") == str(run_id))
    assert {r.task for r in events.select("task").distinct().collect()} == {
        "bronze",
        "silver",
        "gold",
    }
    read = sum(o - resumed_at.get(p, 0) for p, o in ends.items())  # by the second run
    assert events.where("task = 'bronze'").agg(F.sum("input_rows")).first()[0] == read
    assert (
        events.where("task = 'bronze' AND input_rows > 0").agg(F.max("kafka_lag")).first()[0] == 0
    )
    # each query's: the silver task runs two, its own and its state query (task and query id)
    queries = set()
    for task, checkpoint in (
        ("bronze", bronze.checkpoint),
        ("silver", silver.checkpoint),
        ("silver", silver.state_checkpoint),
        ("gold", gold.checkpoint),
    ):
        query = json.loads(Path(checkpoint, "metadata").read_text())["id"]
        queries.add((task, query))
        with_rows = {
            r[0]
            for r in events.where(f"task = '{task}' AND query_id = '{query}' AND input_rows > 0")
            .select("batch_id")
            .collect()
        }
        committed = {int(p.name) for p in Path(checkpoint, "commits").iterdir() if p.name.isdigit()}
        assert with_rows and with_rows <= committed, (task, with_rows, committed)
    assert {tuple(r) for r in events.select("task", "query_id").distinct().collect()} == queries

    # the publish task, killed with its runner, then stopped by SIGTERM: once caught up, every
    # gold change is in its topic once
    from pipelines.layers.publish import run_publish
    from tests.integration.test_publish import assert_published_exactly

    run_publish(spark, lake, once=True, progress=False)
    assert_published_exactly(spark, lake)


def test_a_scheduled_job_runs_at_its_fire_times_one_run_at_a_time(lake, tmp_path):
    """`lakehouse jobs schedule --cron '*/6 * * * * ?' --runs 2`: two runs, each started at a
    fire time (a multiple of 6 s), never two at once, each its own run in the runs table."""
    spec = json.loads(_spec(tmp_path).read_text())
    spec["tasks"] = spec["tasks"][:1]  # a: 1 s
    path = tmp_path / "scheduled.json"
    path.write_text(json.dumps(spec))
    cmd = [sys.executable, "-m", "pipelines.cli", "jobs", "schedule", str(path)]
    cmd += ["--cron", "*/6 * * * * ?", "--runs", "2", "--grace-seconds", "10"]
    done = subprocess.run(
        cmd, env=subprocess_env(lake), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-3000:]
    fires = [
        datetime.fromisoformat(line.split("next run at ")[1].split(" ")[0])
        for line in done.stderr.splitlines()
        if "next run at" in line
    ]
    # a fire time that finds the first run still going (max_concurrent_runs 1) is skipped, said so
    skipped = done.stderr.count("fire time skipped: 1 run(s) going (max_concurrent_runs)")
    assert len(fires) == 2 + skipped, done.stderr[-3000:]
    assert all(f.second % 6 == 0 and f.microsecond == 0 for f in fires)
    assert "schedule stopped after 2 run(s)" in done.stderr
    runs = {}
    for row in read_runs(lake, None, 10):
        runs.setdefault(row["run_id"], []).append((row["task"], row["state"]))
    assert sorted(runs.values()) == [[("a", "SUCCESS")], [("a", "SUCCESS")]]
    # each run began at its own fire time, never before it (a run id is the runner's start, in ms)
    starts = sorted(datetime.fromtimestamp(run_id / 1000, UTC) for run_id in runs)
    at = [max((f for f in fires if f <= s), default=None) for s in starts]  # its fire time
    assert None not in at and at[0] < at[1], (starts, fires)
    assert all(s - f < timedelta(seconds=2) for s, f in zip(starts, at, strict=True)), at


def test_a_spark_submit_task_and_a_wheel_task_run_through_spark_submit(lake, tmp_path):
    """The two task types run through the real spark-submit: the submit task's own arguments
    (a script that counts in Spark), and the installed package's console entry point."""
    script = tmp_path / "count.py"
    script.write_text(
        "import sys\nfrom pyspark.sql import SparkSession\n"
        "print('rows', SparkSession.builder.getOrCreate().range(7).count(), sys.argv[1:])\n"
    )
    path = tmp_path / "spec.yaml"
    path.write_text(
        "name: real-types\ntasks:\n  - task_key: submit\n    spark_submit_task:\n"
        f"      parameters: [--conf, spark.ui.enabled=false, '{script}', from-submit]\n"
        "  - task_key: wheel\n    python_wheel_task: {package_name: streaming-lakehouse, "
        "entry_point: lakehouse, parameters: [--version]}\n"
    )
    job = JobRunner(lake, load_job_spec(path), echo=lambda line: None, env=subprocess_env(lake))
    run = job.run()
    assert run.states == {"submit": "SUCCESS", "wheel": "SUCCESS"}
    said = {k: (job.logs / f"{k}-0.log").read_text().splitlines() for k in ("submit", "wheel")}
    assert "rows 7 ['from-submit']" in said["submit"]
    assert f"lakehouse {version('streaming-lakehouse')}" in said["wheel"]
