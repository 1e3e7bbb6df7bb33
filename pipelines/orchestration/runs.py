"""Run states and the runs table: one row per task attempt, appended with delta-rs (no JVM)."""

from __future__ import annotations

import os
import socket
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from enum import StrEnum

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from deltalake.exceptions import TableNotFoundError

from pipelines.config import LakehouseConf
from pipelines.local.processes import process_start
from pipelines.orchestration.spec import JobSpec


class RunState(StrEnum):
    """The state of a task attempt, a task or a job run; the runs table holds its value."""

    RUNNING = "RUNNING"  # an attempt is recorded so when it starts, and again when it ends
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    TIMEDOUT = "TIMEDOUT"
    CANCELED = "CANCELED"
    UPSTREAM_FAILED = "UPSTREAM_FAILED"
    EXCLUDED = "EXCLUDED"  # not run: its run_if did not hold; counts as a success downstream
    SUCCESS_WITH_FAILURES = "SUCCESS_WITH_FAILURES"  # a job run: its leaf tasks succeeded


FAILED_STATES = frozenset({RunState.FAILED, RunState.TIMEDOUT, RunState.UPSTREAM_FAILED})
# Spark DDL like every table's schema; delta-rs writes it (no JVM here), so its types map to Arrow.
SCHEMA = (
    "run_id bigint, job string, task string, attempt int, state string, start_time timestamp, "
    "end_time timestamp, duration_s double, exit_code int, message string, log_path string, "
    "spec string, runner string"
)
_ARROW = {"bigint": pa.int64(), "int": pa.int32(), "double": pa.float64(), "string": pa.string()}
_ARROW["timestamp"] = pa.timestamp("us", tz="UTC")
RUNS_SCHEMA = pa.schema([(name, _ARROW[kind]) for name, kind in map(str.split, SCHEMA.split(","))])
# this runner: host, pid and process start, which name it even after its pid is reused
RUNNER = f"{socket.gethostname()}:{os.getpid()}:{process_start(os.getpid())}"


@dataclass
class Attempt:
    task: str
    attempt: int
    state: RunState
    start_time: datetime
    end_time: datetime | None  # None while it runs
    exit_code: int | None
    message: str
    log_path: str

    @property
    def seconds(self) -> float | None:
        if self.end_time is None:
            return None
        return (self.end_time - self.start_time).total_seconds()


@dataclass
class JobRun:
    run_id: int
    spec: JobSpec
    states: dict[str, RunState] = field(default_factory=dict)  # task -> final state
    outcomes: dict[str, str] = field(default_factory=dict)  # condition task -> "true"/"false"

    @property
    def state(self) -> RunState:
        """As Databricks decides it: from the leaf tasks (those nothing depends on); failures
        before them that they handled (run_if) make SUCCESS_WITH_FAILURES."""
        states = set(self.states.values())
        if RunState.CANCELED in states:
            return RunState.CANCELED
        upstream = {d for t in self.spec.tasks for d in t.depends_on}
        leaves = {s for key, s in self.states.items() if key not in upstream}
        if leaves & FAILED_STATES:
            return RunState.FAILED
        return RunState.SUCCESS_WITH_FAILURES if states & FAILED_STATES else RunState.SUCCESS


def runs_table(conf: LakehouseConf) -> str:
    return conf.table_path(conf.tables.job_runs)


def record_attempt(conf: LakehouseConf, run: JobRun, a: Attempt) -> None:
    """Append one attempt to the runs table."""
    row = {"run_id": run.run_id, "job": run.spec.name, **asdict(a), "spec": str(run.spec.source)}
    row |= {"duration_s": a.seconds and round(a.seconds, 3), "message": a.message[:2000]}
    _append(conf, [row | {"runner": RUNNER}])


def _append(conf: LakehouseConf, rows: list[dict]) -> None:
    table = pa.Table.from_pylist(rows, RUNS_SCHEMA)
    # append-only (rows are never changed, only followed by their final row): no deletion
    # vectors can appear, so `read_runs` may read the Parquet files as they are
    append_only = {"delta.appendOnly": "true"}
    write_deltalake(
        runs_table(conf),
        table,
        mode="append",
        schema_mode="merge",
        configuration=append_only,
        storage_options=conf.delta_rs_options(),
    )


def close_dead_runs(conf: LakehouseConf) -> list[str]:
    """Close the attempts still RUNNING whose runner on this host is gone (it died, its tasks
    stopped with it): each gets a FAILED row saying so. Returns what was closed."""
    host = socket.gethostname()
    closed, now = [], datetime.now(UTC)
    for r in read_runs(conf, limit=1_000_000):
        runner_host, _, rest = (r.get("runner") or "::").partition(":")
        pid, _, started = rest.partition(":")
        if r["state"] != RunState.RUNNING or runner_host != host or not pid.isdigit():
            continue
        if process_start(int(pid)) == (started if started != "None" else None):
            continue  # its runner still runs
        message = f"its job runner (pid {pid} on {host}) died; the task was stopped with it"
        seconds = (now - r["start_time"]).total_seconds()
        end = {"state": str(RunState.FAILED), "end_time": now, "duration_s": round(seconds, 3)}
        _append(conf, [r | end | {"message": message, "exit_code": None}])
        closed.append(f"run {r['run_id']} task {r['task']} attempt {r['attempt']}: {message}")
    return closed


def read_runs(conf: LakehouseConf, run_id: int | None = None, limit: int = 20) -> list[dict]:
    """Attempts of the newest `limit` runs (or of one run), oldest first."""
    try:
        table = DeltaTable(runs_table(conf), storage_options=conf.delta_rs_options())
    except TableNotFoundError:
        return []
    # Through delta-rs's own engine (DataFusion), on a local disk and object storage alike: not
    # pyarrow's dataset scanner, which can abort the process at exit (apache/arrow#34314).
    query = QueryBuilder().register("runs", table).execute("SELECT * FROM runs")
    rows = pa.table(query.read_all()).to_pylist()
    keep = {run_id} if run_id is not None else set(sorted({r["run_id"] for r in rows})[-limit:])
    latest: dict[tuple, dict] = {}  # an attempt's RUNNING row, or its final row once it ended
    for r in rows:
        if r["run_id"] in keep:
            attempt = (r["run_id"], r["task"], r["attempt"])
            if attempt not in latest or latest[attempt]["state"] == RunState.RUNNING:
                latest[attempt] = r
    return sorted(latest.values(), key=lambda r: (r["run_id"], r["start_time"], r["attempt"]))
