"""Run states and the runs table: one row per task attempt, appended with delta-rs (no JVM)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime
from enum import StrEnum
from urllib.parse import unquote, urlparse

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.exceptions import TableNotFoundError

from pipelines.config import LakehouseConf
from pipelines.orchestration.spec import JobSpec


class RunState(StrEnum):
    """The state of a task attempt, a task or a job run; the runs table holds its value."""

    RUNNING = "RUNNING"  # the scheduler's "start it"; attempts are recorded once they end
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    TIMEDOUT = "TIMEDOUT"
    CANCELED = "CANCELED"
    UPSTREAM_FAILED = "UPSTREAM_FAILED"
    EXCLUDED = "EXCLUDED"  # not run: its run_if did not hold


FAILED_STATES = frozenset({RunState.FAILED, RunState.TIMEDOUT, RunState.UPSTREAM_FAILED})
# Spark DDL like every table's schema; delta-rs writes it (no JVM here), so its types map to Arrow.
SCHEMA = (
    "run_id bigint, job string, task string, attempt int, state string, start_time timestamp, "
    "end_time timestamp, duration_s double, exit_code int, message string, log_path string, "
    "spec string"
)
_ARROW = {"bigint": pa.int64(), "int": pa.int32(), "double": pa.float64(), "string": pa.string()}
_ARROW["timestamp"] = pa.timestamp("us", tz="UTC")
RUNS_SCHEMA = pa.schema([(name, _ARROW[kind]) for name, kind in map(str.split, SCHEMA.split(","))])


@dataclass
class Attempt:
    task: str
    attempt: int
    state: RunState
    start_time: datetime
    end_time: datetime
    exit_code: int | None
    message: str
    log_path: str

    @property
    def seconds(self) -> float:
        return (self.end_time - self.start_time).total_seconds()


@dataclass
class JobRun:
    run_id: int
    spec: JobSpec
    states: dict[str, RunState] = field(default_factory=dict)  # task -> final state

    @property
    def state(self) -> RunState:
        states = set(self.states.values())
        if RunState.CANCELED in states:
            return RunState.CANCELED
        return RunState.FAILED if states & FAILED_STATES else RunState.SUCCESS


def runs_table(conf: LakehouseConf) -> str:
    return conf.table_path(conf.tables.job_runs)


def record_attempt(conf: LakehouseConf, run: JobRun, a: Attempt) -> None:
    """Append one attempt to the runs table."""
    row = {"run_id": run.run_id, "job": run.spec.name, **asdict(a), "spec": str(run.spec.source)}
    row |= {"duration_s": round(a.seconds, 3), "message": a.message[:2000]}
    write_deltalake(runs_table(conf), pa.Table.from_pylist([row], RUNS_SCHEMA), mode="append")


def read_runs(conf: LakehouseConf, run_id: int | None = None, limit: int = 20) -> list[dict]:
    """Attempts of the newest `limit` runs (or of one run), oldest first."""
    try:
        files = DeltaTable(runs_table(conf)).file_uris()
    except TableNotFoundError:
        return []
    # File by file: pyarrow's dataset scanner can abort the process at exit (apache/arrow#34314,
    # delta-io/delta-rs#2184); the table is append-only, small, and has no deletion vectors.
    rows = [r for f in files for r in pq.ParquetFile(unquote(urlparse(f).path)).read().to_pylist()]
    keep = {run_id} if run_id is not None else set(sorted({r["run_id"] for r in rows})[-limit:])
    rows = [r for r in rows if r["run_id"] in keep]
    return sorted(rows, key=lambda r: (r["run_id"], r["start_time"], r["attempt"]))
