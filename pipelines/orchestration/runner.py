"""Run a job spec on open-source Spark: each task a `spark-submit` process, like a Databricks job.

Tasks start when their dependencies are done and their `run_if` holds; independent tasks run in
parallel. A failed attempt is retried up to `max_retries` after `min_retry_interval_millis`; an
attempt past `timeout_seconds` is stopped (SIGTERM to its process group, then SIGKILL after the
grace period) and is TIMEDOUT. SIGINT or SIGTERM to the runner stops every running task the same
graceful way (the layer jobs finish their micro-batch and stop their queries) and starts nothing
new. Every attempt is a row of the `_jobs/runs` Delta table; each attempt's output is a log file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from pipelines.config import LakehouseConf
from pipelines.orchestration.spec import JobSpec, Task, resolve

FAILED_STATES = ("FAILED", "TIMEDOUT", "UPSTREAM_FAILED")
RUNS_SCHEMA = (
    ("run_id", "int64"), ("job", "string"), ("task", "string"), ("attempt", "int32"),
    ("state", "string"), ("start_time", "timestamp"), ("end_time", "timestamp"),
    ("duration_s", "float64"), ("exit_code", "int32"), ("message", "string"),
    ("log_path", "string"), ("spec", "string"),
)  # fmt: skip


@dataclass
class Attempt:
    task: str
    attempt: int
    state: str
    start: datetime
    end: datetime
    exit_code: int | None
    message: str
    log_path: str


@dataclass
class JobRun:
    run_id: int
    spec: JobSpec
    states: dict[str, str] = field(default_factory=dict)  # task -> final state
    attempts: list[Attempt] = field(default_factory=list)

    @property
    def state(self) -> str:
        if any(s == "CANCELED" for s in self.states.values()):
            return "CANCELED"
        return "FAILED" if any(s in FAILED_STATES for s in self.states.values()) else "SUCCESS"


def runs_table(conf: LakehouseConf) -> str:
    return conf.table_path("_jobs/runs")


def record_attempt(conf: LakehouseConf, run: JobRun, a: Attempt) -> None:
    """Append one attempt to the runs table (delta-rs: no JVM in the runner)."""
    import pyarrow as pa
    from deltalake import write_deltalake

    types = {"int64": pa.int64(), "int32": pa.int32(), "string": pa.string(),
             "float64": pa.float64(), "timestamp": pa.timestamp("us", tz="UTC")}  # fmt: skip
    schema = pa.schema([(n, types[t]) for n, t in RUNS_SCHEMA])
    row = {
        "run_id": run.run_id, "job": run.spec.name, "task": a.task, "attempt": a.attempt,
        "state": a.state, "start_time": a.start, "end_time": a.end,
        "duration_s": round((a.end - a.start).total_seconds(), 3), "exit_code": a.exit_code,
        "message": a.message[:2000], "log_path": a.log_path, "spec": str(run.spec.source),
    }  # fmt: skip
    write_deltalake(runs_table(conf), pa.Table.from_pylist([row], schema=schema), mode="append")


def read_runs(conf: LakehouseConf, run_id: int | None = None, limit: int = 20) -> list[dict]:
    """Attempts of the newest `limit` runs (or of one run), oldest first."""
    from urllib.parse import unquote, urlparse

    import pyarrow.parquet as pq
    from deltalake import DeltaTable
    from deltalake.exceptions import TableNotFoundError

    try:
        files = DeltaTable(runs_table(conf)).file_uris()
    except TableNotFoundError:
        return []
    # File by file: pyarrow's dataset scanner can abort the process at exit (apache/arrow#34314,
    # delta-io/delta-rs#2184); the table is append-only, small, and has no deletion vectors.
    rows = [r for f in files for r in pq.ParquetFile(unquote(urlparse(f).path)).read().to_pylist()]
    run_ids = sorted({r["run_id"] for r in rows})
    keep = {run_id} if run_id is not None else set(run_ids[-limit:])
    return sorted((r for r in rows if r["run_id"] in keep),
                  key=lambda r: (r["run_id"], r["start_time"], r["attempt"]))  # fmt: skip


def spark_submit_command(
    conf: LakehouseConf, task: Task, parameters: list[str], master: str | None = None
) -> list[str]:
    from pipelines.local.jars import spark_jars
    from pipelines.spark_conf import LOG4J2, session_settings

    settings = {**session_settings(conf), **task.cluster.spark_conf}
    settings.pop("spark.driver.memory", None)  # a driver setting: given as --driver-memory
    cmd = [
        str(Path(sys.executable).with_name("spark-submit")),
        "--master", master or task.cluster.master or conf.spark.master,
        "--name", f"{task.key}",
        "--driver-memory", task.cluster.spark_conf.get("spark.driver.memory", conf.spark.driver_memory),
        "--jars", ",".join(str(j) for j in spark_jars()),
        "--driver-java-options", f"-Dlog4j2.configurationFile=file:{LOG4J2}",
    ]  # fmt: skip
    for key, value in settings.items():
        cmd += ["--conf", f"{key}={value}"]
    return [*cmd, str(task.python_file), *parameters]


class _Stop(Exception):
    pass


class JobRunner:
    """Runs one spec once; `run()` returns the JobRun with every attempt."""

    def __init__(self, conf: LakehouseConf, spec: JobSpec, *, parameters: dict[str, str] | None = None,
                 grace_seconds: float = 120, echo=print, env: dict[str, str] | None = None,
                 master: str | None = None) -> None:  # fmt: skip
        self.conf, self.spec, self.grace = conf, spec, grace_seconds
        self.env = dict(os.environ if env is None else env)
        self.master = master
        self.parameters = {**spec.parameters, **(parameters or {})}
        unknown = set(parameters or {}) - set(spec.parameters)
        if unknown:
            from pipelines.orchestration.spec import InvalidJobSpecError

            raise InvalidJobSpecError(f"job spec {spec.source} has no parameter "
                                      f"{', '.join(sorted(unknown))} (it has: {', '.join(spec.parameters) or 'none'})")  # fmt: skip
        self.run_id = int(time.time() * 1000)
        self.logs = conf.root / "_jobs" / "logs" / str(self.run_id)
        self.echo = echo
        self.stopping = threading.Event()
        self.lock = threading.Lock()
        self.record_lock = threading.Lock()
        self.processes: dict[str, subprocess.Popen] = {}
        self.done = threading.Condition(self.lock)

    # --- one task ------------------------------------------------------------------------------
    def _refs(self, task: Task, attempt: int) -> dict[str, str]:
        refs = {f"job.parameters.{k}": v for k, v in self.parameters.items()}
        return {**refs, "job.run_id": str(self.run_id), "job.name": self.spec.name,
                "task.name": task.key, "task.attempt": str(attempt)}  # fmt: skip

    def _attempt(self, run: JobRun, task: Task, attempt: int) -> Attempt:
        params = [resolve(p, self._refs(task, attempt)) for p in task.parameters]
        cmd = spark_submit_command(self.conf, task, params, self.master)
        log_path = self.logs / f"{task.key}-{attempt}.log"
        env = {**self.env, **task.cluster.env, "PYSPARK_PYTHON": sys.executable,
               "PYSPARK_DRIVER_PYTHON": sys.executable, "LAKEHOUSE_JOB_RUN_ID": str(self.run_id),
               "LAKEHOUSE_TASK_KEY": task.key}  # fmt: skip
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        start = datetime.now(UTC)
        self.echo(f"[{self.spec.name}] {task.key}: attempt {attempt} started (log {log_path})")
        with open(log_path, "wb") as log:
            log.write(("$ " + " ".join(cmd) + "\n").encode())
            log.flush()
            proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                    cwd=Path.cwd(), start_new_session=True)  # fmt: skip
            with self.lock:
                self.processes[task.key] = proc
            timed_out = False
            try:
                proc.wait(timeout=task.timeout_seconds or None)
            except subprocess.TimeoutExpired:
                timed_out = True
                self._terminate(task.key, proc, f"timed out after {task.timeout_seconds}s")
            finally:
                with self.lock:
                    self.processes.pop(task.key, None)
        end = datetime.now(UTC)
        code = proc.returncode
        if timed_out:
            state, message = "TIMEDOUT", f"timed out after {task.timeout_seconds}s"
        elif self.stopping.is_set():
            state = "CANCELED"
            message = ("stopped cleanly on request" if code == 0
                       else f"stopped on request, exit code {code}: {last_error(log_path)}")  # fmt: skip
        elif code == 0:
            state, message = "SUCCESS", ""
        else:
            state, message = "FAILED", f"exit code {code}: {last_error(log_path)}"
        return Attempt(task.key, attempt, state, start, end, code, message, str(log_path))

    def _terminate(self, key: str, proc: subprocess.Popen, why: str) -> None:
        """SIGTERM the task's process group (the layer jobs stop gracefully), SIGKILL after grace."""
        self.echo(f"[{self.spec.name}] {key}: {why}; stopping it (SIGTERM)")
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=self.grace)
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            self.echo(f"[{self.spec.name}] {key}: still running after {self.grace:.0f}s; SIGKILL")
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def _record(self, run: JobRun, a: Attempt) -> None:
        with self.record_lock:  # one writer at a time: appends never race each other
            record_attempt(self.conf, run, a)

    def _run_task(self, run: JobRun, task: Task) -> None:
        try:
            self._attempts(run, task)
        except Exception as e:  # the runner itself failed (not the task): never hang the job
            self.echo(f"[{self.spec.name}] {task.key}: runner error: {e}")
            with self.done:
                run.states[task.key] = "FAILED"
                self.done.notify_all()

    def _attempts(self, run: JobRun, task: Task) -> None:
        attempt = 0
        while True:
            a = self._attempt(run, task, attempt)
            self._record(run, a)
            with self.lock:
                run.attempts.append(a)
            detail = f": {a.message}" if a.message else ""
            self.echo(f"[{self.spec.name}] {task.key}: attempt {attempt} {a.state} in "
                      f"{(a.end - a.start).total_seconds():.1f}s{detail}")  # fmt: skip
            retry = a.state == "FAILED" or (a.state == "TIMEDOUT" and task.retry_on_timeout)
            if not retry or self.stopping.is_set() or (0 <= task.max_retries <= attempt):
                break
            attempt += 1
            if self.stopping.wait(task.min_retry_interval_ms / 1000):
                break
        with self.done:
            run.states[task.key] = a.state
            self.done.notify_all()

    # --- the job -------------------------------------------------------------------------------
    def _decide(self, run: JobRun, task: Task) -> str | None:
        """None: wait; "RUN"; or the state of a task that will not run."""
        states = [run.states.get(d) for d in task.depends_on]
        if any(s is None for s in states):
            return None
        if self.stopping.is_set():
            return "CANCELED"
        ok = [s == "SUCCESS" for s in states]
        failed = [s in FAILED_STATES for s in states]
        rule = {
            "ALL_SUCCESS": all(ok),
            "AT_LEAST_ONE_SUCCESS": any(ok),
            "NONE_FAILED": not any(failed),
            "ALL_DONE": True,
            "AT_LEAST_ONE_FAILED": any(failed),
            "ALL_FAILED": bool(states) and all(failed),
        }[task.run_if]
        if rule:
            return "RUN"
        return "UPSTREAM_FAILED" if any(failed) and task.run_if == "ALL_SUCCESS" else "EXCLUDED"

    def stop(self, signum: int | None = None, _frame=None) -> None:
        if signum:
            self.echo(f"[{self.spec.name}] {signal.Signals(signum).name} received: stopping every "
                      "running task gracefully, starting nothing new")  # fmt: skip
        self.stopping.set()
        with self.lock:
            running = list(self.processes.items())
        for key, proc in running:
            threading.Thread(
                target=self._terminate, args=(key, proc, "stop requested"), daemon=True
            ).start()
        with self.done:
            self.done.notify_all()

    def run(self) -> JobRun:
        self.logs.mkdir(parents=True, exist_ok=True)
        run = JobRun(self.run_id, self.spec)
        previous = {}
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                previous[sig] = signal.signal(sig, self.stop)
        deadline = (
            time.monotonic() + self.spec.timeout_seconds if self.spec.timeout_seconds else None
        )
        self.echo(f"[{self.spec.name}] run {self.run_id}: {len(self.spec.tasks)} tasks from "
                  f"{self.spec.source}, logs in {self.logs}")  # fmt: skip
        threads: list[threading.Thread] = []
        try:
            started: set[str] = set()
            while True:
                with self.done:
                    for task in self.spec.tasks:
                        if task.key in started:
                            continue
                        decision = self._decide(run, task)
                        if decision is None:
                            continue
                        started.add(task.key)
                        if decision == "RUN":
                            t = threading.Thread(
                                target=self._run_task, args=(run, task), daemon=True
                            )
                            threads.append(t)
                            t.start()
                        else:
                            run.states[task.key] = decision
                            now = datetime.now(UTC)
                            a = Attempt(task.key, 0, decision, now, now, None,
                                        f"not run: run_if {task.run_if} not met" if decision != "CANCELED"
                                        else "not run: the job was stopped", "")  # fmt: skip
                            run.attempts.append(a)
                            self.echo(f"[{self.spec.name}] {task.key}: {decision} ({a.message})")
                            self._record(run, a)
                    if len(run.states) == len(self.spec.tasks):
                        break
                    self.done.wait(1)
                if deadline and time.monotonic() > deadline and not self.stopping.is_set():
                    self.echo(
                        f"[{self.spec.name}] job timed out after {self.spec.timeout_seconds}s"
                    )
                    self.stop()
        finally:
            for t in threads:
                t.join()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        summary = ", ".join(f"{k} {run.states[k]}" for k in (t.key for t in self.spec.tasks))
        self.echo(f"[{self.spec.name}] run {self.run_id} {run.state}: {summary}")
        return run


def last_error(log_path: Path) -> str:
    """The line of a task's log a person needs: our `error: ...` line, else the last exception."""
    try:
        lines = log_path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    for line in reversed(lines):
        if line.startswith("error: "):
            return line[len("error: ") :]
    for line in reversed(lines):
        if "Error" in line or "Exception" in line:
            return line.strip()[:500]
    return lines[-1].strip()[:500] if lines else ""
