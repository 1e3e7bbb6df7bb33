"""Run a job spec on open-source Spark: each task a `spark-submit` process, like a Databricks job.

Independent tasks run in parallel. A task is stopped, on its timeout or on SIGINT or SIGTERM to the
runner, by SIGTERM to its process group (the layer jobs finish their micro-batch and stop their
queries), then SIGKILL after the grace period. Every attempt is a row of the runs table.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import cast

from pipelines import logs, task_values
from pipelines.config import JobClusterConf, LakehouseConf
from pipelines.errors import ExitCode
from pipelines.local.cds import archive_java_options, driver_java_options
from pipelines.local.jars import spark_jars
from pipelines.local.processes import die_with_parent, terminate
from pipelines.orchestration.runs import (
    FAILED_STATES,
    RUNNER,
    Attempt,
    JobRun,
    RunState,
    close_dead_runs,
    record_attempt,
)
from pipelines.orchestration.schedule import Schedule
from pipelines.orchestration.spec import (
    CONDITION_OPS,
    InvalidJobSpecError,
    JobSpec,
    RunIf,
    Task,
    TaskKind,
    load_job_spec,
    resolve,
)
from pipelines.orchestration.task_logs import remove_old_runs, rotate
from pipelines.spark_conf import session_settings

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
JOBS = Path(__file__).resolve().parent.parent / "jobs"  # the launchers of wheel and notebook tasks
DRIVER_PYTHON = JOBS.parent / "resources" / "driver-python"  # a task's output into its log
SPEC_SUFFIXES = (".yaml", ".yml", ".json")


class TaskValueMissingError(InvalidJobSpecError):
    """A task's parameters name a task value that was not set."""


# Failures a retry repeats: retrying a refused login would only hammer the broker (and may lock
# the account); the next run of the job, with new settings, tries again.
NOT_RETRIED = {ExitCode.DENIED: "the broker refused the login or its certificate (exit code 7)"}


def spark_submit_command(
    conf: LakehouseConf, task: Task, parameters: list[str], master: str | None = None
) -> list[str]:
    mapped = conf.jobs.clusters.get(task.cluster.name or "", JobClusterConf())
    settings = {**session_settings(conf), **mapped.spark_conf, **task.cluster.spark_conf}
    # a Python driver's output straight into the task's log (`_command` names it)
    settings.setdefault("spark.pyspark.driver.python", str(DRIVER_PYTHON))
    memory = settings.pop("spark.driver.memory")  # a driver setting: given as --driver-memory
    submit = str(Path(sys.executable).with_name("spark-submit"))
    master = master or task.cluster.master or mapped.master or conf.spark.master
    if master == conf.cluster.master_url and (options := archive_java_options()):
        # the project's own cluster runs its executors on this machine: the archive is theirs too
        settings.setdefault("spark.executor.extraJavaOptions", options)
    cmd = [submit, "--master", master]
    cmd += ["--name", task.key, "--driver-memory", memory]
    cmd += ["--jars", ",".join(str(j) for j in spark_jars(s3=conf.uses_s3))]
    cmd += ["--driver-java-options", driver_java_options(json_logs=conf.log.format == "json")]
    cmd += [arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")]
    if task.kind == TaskKind.SPARK_SUBMIT:  # its parameters are spark-submit's own
        return [*cmd, *parameters]
    if task.kind == TaskKind.PYTHON_WHEEL:
        return [*cmd, str(JOBS / "wheel_task.py"), *task.target, *parameters]
    return [*cmd, str(task.python_file), *parameters]


def condition_holds(op: str, left: str, right: str) -> bool:
    """A condition_task's outcome: numbers compared as numbers, anything else as strings (only
    EQUAL_TO and NOT_EQUAL hold for strings that are not both numbers)."""
    try:
        a, b = float(left), float(right)
    except ValueError:
        if op not in ("EQUAL_TO", "NOT_EQUAL"):
            return False
        return (left == right) == (op == "EQUAL_TO")
    compare = {"==": a == b, "!=": a != b, ">": a > b, ">=": a >= b, "<": a < b, "<=": a <= b}
    return compare[CONDITION_OPS[op]]


def find_job(source: Path, job_id: str) -> Path:
    """The spec a run_job_task names by job name or job_id: beside `source`, else in conf/jobs."""
    folders = dict.fromkeys([source.resolve().parent, JOBS.parent.parent / "conf" / "jobs"])
    for path in (p for f in folders for p in sorted(f.glob("*.*")) if p.suffix in SPEC_SUFFIXES):
        try:
            spec = load_job_spec(path)
        except InvalidJobSpecError:
            continue
        if job_id in (spec.name, spec.job_id):
            return path
    listed = ", ".join(str(f) for f in folders)
    raise InvalidJobSpecError(f"run_job_task: no job {job_id!r} in {listed}")


def run_if_outcome(run_if: RunIf, states: list[RunState]) -> RunState:
    """RUNNING if a task runs after its dependencies ended in `states`, else the state it gets, as
    in Databricks: an excluded dependency counts as a success, a task whose dependencies were all
    excluded is excluded, and a run_if that handles failures is EXCLUDED when unmet, any other
    UPSTREAM_FAILED."""
    if states and all(s == RunState.EXCLUDED for s in states):
        return RunState.EXCLUDED
    ok = [s in (RunState.SUCCESS, RunState.EXCLUDED) for s in states]
    failed = [s in FAILED_STATES for s in states]
    ran = [s in (RunState.SUCCESS, RunState.FAILED, RunState.TIMEDOUT) for s in states]
    holds = {
        RunIf.ALL_SUCCESS: all(ok),
        RunIf.AT_LEAST_ONE_SUCCESS: any(ok),
        RunIf.NONE_FAILED: not any(failed) and any(ran),
        RunIf.ALL_DONE: True,
        RunIf.AT_LEAST_ONE_FAILED: any(failed),
        RunIf.ALL_FAILED: bool(states) and all(failed),
    }[run_if]
    if holds:
        return RunState.RUNNING
    handles_failures = run_if in (RunIf.AT_LEAST_ONE_FAILED, RunIf.ALL_FAILED)
    return RunState.EXCLUDED if handles_failures else RunState.UPSTREAM_FAILED


def start_time_references(run_id: int) -> dict[str, str]:
    """{{job.start_time.*}} of a run (its id is its start in ms), in UTC, as Databricks gives them."""
    t = datetime.fromtimestamp(run_id / 1000, UTC)
    parts = {"iso_date": t.date().isoformat(), "iso_datetime": t.isoformat(timespec="seconds")}
    parts |= {"timestamp_ms": str(run_id), "is_weekday": str(t.weekday() < 5).lower()}
    parts |= {p: str(getattr(t, p)) for p in ("year", "month", "day", "hour", "minute", "second")}
    return {f"job.start_time.{k}": v for k, v in parts.items()}


_last_run_id = [0]
_run_ids = threading.Lock()


def _new_run_id() -> int:
    """The time in ms, made unique within this process (runs of a schedule may start at once)."""
    with _run_ids:
        _last_run_id[0] = max(int(time.time() * 1000), _last_run_id[0] + 1)
        return _last_run_id[0]


class JobRunner:
    """Runs one spec once; `run()` returns the JobRun with each task's final state."""

    def __init__(
        self,
        conf: LakehouseConf,
        spec: JobSpec,
        *,
        parameters: dict[str, str] | None = None,
        grace_seconds: float = 120,
        echo: Callable[[str], None] | None = None,
        env: dict[str, str] | None = None,
        master: str | None = None,
    ) -> None:
        if unknown := sorted(set(parameters or {}) - set(spec.parameters)):
            raise InvalidJobSpecError(
                f"job spec {spec.source} has no parameter {', '.join(unknown)} "
                f"(it has: {', '.join(spec.parameters) or 'none'})"
            )
        self.conf, self.spec, self.master = conf, spec, master
        self.grace, self.env = grace_seconds, dict(os.environ if env is None else env)
        self.parameters = {**spec.parameters, **(parameters or {})}
        self.run_id = _new_run_id()
        run = {"run_id": str(self.run_id)}  # the run's lines name it, as its tasks' lines do
        self.echo = echo or (lambda line: logs.get("jobs").info("%s", line, extra=run))
        self.logs = conf.log_dir / str(self.run_id)
        self.stopping = threading.Event()
        self.done = threading.Condition()  # guards the run's states
        self.record_lock = threading.Lock()
        self.children: list[JobRunner] = []  # runs of run_job_tasks

    def _say(self, message: str) -> None:
        self.echo(f"[{self.spec.name}] {message}")

    def _references(self, task: Task, attempt: int) -> dict[str, str]:
        """What the attempt's {{...}} are filled with, task values of earlier tasks included."""
        refs = {f"job.parameters.{k}": v for k, v in self.parameters.items()}
        refs |= {"job.id": self.spec.job_id, "job.run_id": str(self.run_id)}
        refs |= {"job.name": self.spec.name, "task.name": task.key, "task.attempt": str(attempt)}
        index = [t.key for t in self.spec.tasks].index(task.key)
        refs |= {"task.run_id": str(self.run_id * 1000 + index)}
        refs |= {"task.execution_count": str(attempt + 1)}  # Databricks counts from 1
        refs |= start_time_references(self.run_id)
        for t in self.spec.tasks:
            for key, value in task_values.read(self.logs, t.key).items():
                text = value if isinstance(value, str) else json.dumps(value)
                refs[f"tasks.{t.key}.values.{key}"] = text
        return refs

    def _fill(self, values: Iterable[str], refs: dict[str, str]) -> list[str]:
        """`values` with their references filled; a task value not set fails the attempt."""
        try:
            return [resolve(v, refs) for v in values]
        except KeyError as e:
            raise TaskValueMissingError(
                f"{{{{{e.args[0]}}}}}: that task set no such value"
            ) from None

    def _command(self, task: Task, attempt: int) -> tuple[list[str], dict[str, str]]:
        """The attempt's command line (spark-submit, or the notebook's kernel) and environment."""
        refs = self._references(task, attempt)
        params = self._fill(task.parameters, refs)
        named = dict(zip(task.named, self._fill(task.named.values(), refs), strict=True))
        if task.kind == TaskKind.PYTHON_WHEEL:  # named_parameters, as Databricks passes them
            params += [f"--{k}={v}" for k, v in named.items()]
        env = {"SPARK_LOCAL_IP": "127.0.0.1", **self.env, **task.cluster.env}
        env |= {"PYSPARK_PYTHON": sys.executable, "PYSPARK_DRIVER_PYTHON": sys.executable}
        log = self._log_path(task, attempt)
        env |= {"LAKEHOUSE_DRIVER_PYTHON": sys.executable, "LAKEHOUSE_TASK_LOG": str(log)}
        env |= {"LAKEHOUSE_TASK_KEY": task.key, "LAKEHOUSE_JOB_RUN_ID": str(self.run_id)}
        env |= {task_values.DIR: str(self.logs)}
        # the task watches this process and stops when it is gone (pipelines/jobs/layer_job.py)
        env |= {
            "LAKEHOUSE_RUNNER": RUNNER.split(":", 1)[1],
            "LAKEHOUSE_RUNNER_GRACE_S": str(self.grace),
        }
        if task.kind == TaskKind.NOTEBOOK:  # a kernel of this environment, beside its log
            out = self.logs / f"{task.key}-{attempt}.ipynb"
            module = [sys.executable, "-m", "pipelines.jobs.notebook_task"]
            return [*module, str(task.python_file), str(out), json.dumps(named)], env
        return spark_submit_command(self.conf, task, params, self.master), env

    def _log_path(self, task: Task, attempt: int) -> Path:
        return self.logs / f"{task.key}-{attempt}.log"

    def _attempt(self, run: JobRun, task: Task, attempt: int) -> Attempt:
        log_path = self._log_path(task, attempt)
        in_process = task.kind in (TaskKind.CONDITION, TaskKind.RUN_JOB)  # no process, no log
        start = datetime.now(UTC)
        shown = "" if in_process else str(log_path)
        running = Attempt(task.key, attempt, RunState.RUNNING, start, None, None, "", shown)
        self._record(run, running, f"attempt {attempt} started" + f" (log {shown})" * bool(shown))
        task_values.values_file(self.logs, task.key).unlink(missing_ok=True)  # a retry's own
        try:
            if in_process:
                state, message = self._in_process(run, task, attempt)
                return Attempt(
                    task.key, attempt, state, start, datetime.now(UTC), None, message, ""
                )
            cmd, env = self._command(task, attempt)
        except (TaskValueMissingError, InvalidJobSpecError) as e:
            end = datetime.now(UTC)
            return Attempt(task.key, attempt, RunState.FAILED, start, end, None, str(e), "")
        # appending and unbuffered: the command line comes first, and a rotation's cut holds
        with open(log_path, "ab", buffering=0) as log:
            log.write(("$ " + " ".join(cmd) + "\n").encode())
            # SIGTERM to the task if this thread ends (the runner died): it stops gracefully
            proc = subprocess.Popen(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=die_with_parent,  # noqa: PLW1509 (one prctl call, resolved before the fork)
            )
        timed_out, code = self._wait(task, proc, log_path), proc.returncode
        state, message = self._outcome(task, code, timed_out, log_path)
        end = datetime.now(UTC)
        return Attempt(task.key, attempt, state, start, end, code, message, str(log_path))

    def _in_process(self, run: JobRun, task: Task, attempt: int) -> tuple[RunState, str]:
        """A condition_task (its outcome kept for the tasks after it) or a run_job_task (the
        other job run here, to its end)."""
        refs = self._references(task, attempt)
        if task.kind == TaskKind.CONDITION:
            op, left, right = task.target[0], *self._fill(task.target[1:], refs)
            outcome = str(condition_holds(op, left, right)).lower()
            run.outcomes[task.key] = outcome
            return RunState.SUCCESS, f"outcome {outcome}: {left!r} {op} {right!r}"
        spec = load_job_spec(
            find_job(self.spec.source, task.target[0]), clusters=self.conf.jobs.clusters
        )
        params = dict(zip(task.named, self._fill(task.named.values(), refs), strict=True))
        child = JobRunner(
            self.conf,
            spec,
            parameters=params,
            grace_seconds=self.grace,
            echo=self.echo,
            env=self.env,
            master=self.master,
        )
        self.children.append(child)
        if self.stopping.is_set():
            child.stop()
        done = child.run()
        ok = done.state in (RunState.SUCCESS, RunState.SUCCESS_WITH_FAILURES)
        state = (
            RunState.SUCCESS
            if ok
            else (RunState.CANCELED if done.state == RunState.CANCELED else RunState.FAILED)
        )
        return state, f"job {spec.name!r} run {done.run_id} {done.state}"

    def _wait(self, task: Task, proc: subprocess.Popen, log: Path) -> bool:
        """Wait for the attempt to end, stopping it on timeout or on request, its log rotated by
        size meanwhile; True: timed out."""
        deadline = time.monotonic() + (task.timeout_seconds or math.inf)
        limit = self.conf.log.task_max_mb * 1024**2
        while not self.stopping.is_set() and time.monotonic() < deadline:
            try:
                proc.wait(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
                return False
            except subprocess.TimeoutExpired:
                rotate(log, limit, self.conf.log.task_backups)  # then look at stop and deadline
        timed_out = not self.stopping.is_set()
        why = f"timed out after {task.timeout_seconds}s" if timed_out else "stop requested"
        self._say(f"{task.key}: {why}; stopping it (SIGTERM)")
        on_kill = partial(self._say, f"{task.key}: still running after {self.grace:.0f}s; SIGKILL")
        # the layer jobs stop gracefully on SIGTERM; terminate() reaps the child, so it has the code
        proc.returncode = terminate(proc.pid, group=True, grace_s=self.grace, on_kill=on_kill)
        return timed_out

    def _outcome(self, task: Task, code: int | None, timed_out: bool, log: Path) -> tuple:
        """The attempt's state and message (the error line of its log when it failed)."""
        if timed_out:
            return RunState.TIMEDOUT, f"timed out after {task.timeout_seconds}s"
        error = f"exit code {code}: {last_error(log)}" if code != 0 else ""
        if self.stopping.is_set():
            why = f"stopped on request, {error}" if error else "stopped cleanly on request"
            return RunState.CANCELED, why
        return (RunState.FAILED, error) if error else (RunState.SUCCESS, "")

    def _record(self, run: JobRun, a: Attempt, news: str) -> None:
        self._say(f"{a.task}: {news}")
        with self.record_lock:  # one writer at a time: appends never race each other
            record_attempt(self.conf, run, a)

    def _attempts(self, run: JobRun, task: Task) -> RunState:
        """Attempt the task until it succeeds, its retries are used up or the job stops."""
        retry_on = {RunState.FAILED} | ({RunState.TIMEDOUT} if task.retry_on_timeout else set())
        attempt = 0
        while True:
            a = self._attempt(run, task, attempt)
            detail = f": {a.message}" if a.message else ""
            self._record(run, a, f"attempt {attempt} {a.state} in {a.seconds:.1f}s{detail}")
            last = a.state not in retry_on or 0 <= task.max_retries <= attempt
            if a.exit_code in NOT_RETRIED and not last:
                self._say(f"{task.key}: not retried: {NOT_RETRIED[a.exit_code]}")
                return a.state
            if last or self.stopping.wait(task.min_retry_interval_ms / 1000):
                return a.state
            attempt += 1

    def _run_task(self, run: JobRun, task: Task) -> None:
        state = RunState.FAILED
        try:
            state = self._attempts(run, task)
        except Exception as e:  # the runner itself failed (not the task): never hang the job
            self._say(f"{task.key}: runner error: {e}")
        with self.done:
            run.states[task.key] = state
            self.done.notify_all()

    def _decide(self, run: JobRun, task: Task) -> RunState | None:
        """None: wait; RUNNING: start it; else the state of a task that will not run."""
        states = [run.states.get(d) for d in task.depends_on]
        if None in states:
            return None
        # a dependency on a condition's other branch is excluded, as Databricks has it
        branch = {d: run.outcomes.get(d) == need for d, need in task.outcomes.items()}
        states = [
            RunState.EXCLUDED if s == RunState.SUCCESS and not branch.get(d, True) else s
            for d, s in zip(task.depends_on, states, strict=True)
        ]
        if self.stopping.is_set():
            return RunState.CANCELED
        return run_if_outcome(task.run_if, cast(list[RunState], states))

    def _skip(self, run: JobRun, task: Task, state: RunState) -> None:
        run.states[task.key] = state
        stopped = state == RunState.CANCELED
        why = "the job was stopped" if stopped else f"run_if {task.run_if} not met"
        now = datetime.now(UTC)
        a = Attempt(task.key, 0, state, now, now, None, f"not run: {why}", "")
        self._record(run, a, f"{state} ({a.message})")

    def _schedule(self, run: JobRun, threads: list[threading.Thread]) -> None:
        """Start each task once its dependencies are done, until every task has a final state."""
        deadline = time.monotonic() + (self.spec.timeout_seconds or math.inf)
        pending = list(self.spec.tasks)
        with self.done:
            while True:
                for task in list(pending):
                    if (decision := self._decide(run, task)) is None:
                        continue
                    pending.remove(task)
                    if decision == RunState.RUNNING:
                        threads.append(threading.Thread(target=self._run_task, args=(run, task)))
                        threads[-1].start()
                    else:
                        self._skip(run, task, decision)
                if len(run.states) == len(self.spec.tasks):
                    return
                self.done.wait(1)
                if time.monotonic() > deadline and not self.stopping.is_set():
                    self._say(f"job timed out after {self.spec.timeout_seconds}s")
                    self.stop()

    def stop(self, signum: int | None = None, _frame=None) -> None:
        """Stop every running task gracefully and start nothing new (also the signal handler)."""
        if signum:
            what = "stopping every running task gracefully, starting nothing new"
            self._say(f"{signal.Signals(signum).name} received: {what}")
        self.stopping.set()
        for child in self.children:
            child.stop()
        with self.done:
            self.done.notify_all()

    def run(self) -> JobRun:
        for old in remove_old_runs(self.conf.log_dir, self.conf.log.task_retention_days):
            self._say(f"removed the logs of run {old.name} (log.task_retention_days)")
        self.logs.mkdir(parents=True, exist_ok=True)
        for closed in close_dead_runs(self.conf):
            self._say(f"closed {closed}")
        run = JobRun(self.run_id, self.spec)
        main = threading.current_thread() is threading.main_thread()  # signals: main thread only
        previous = {sig: signal.signal(sig, self.stop) for sig in STOP_SIGNALS if main}
        tasks = len(self.spec.tasks)
        self._say(f"run {self.run_id}: {tasks} tasks from {self.spec.source}, logs in {self.logs}")
        threads: list[threading.Thread] = []
        try:
            self._schedule(run, threads)
        finally:
            for t in threads:
                t.join()
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        summary = ", ".join(f"{t.key} {run.states[t.key]}" for t in self.spec.tasks)
        self._say(f"run {self.run_id} {run.state}: {summary}")
        return run


def last_error(log_path: Path) -> str:
    """The line of a task's log a person needs: our `error: ...` line, else the last exception."""
    try:
        lines = [line.strip() for line in log_path.read_text(errors="replace").splitlines()]
    except OSError:
        return ""
    ours = [line.removeprefix("error: ") for line in lines if line.startswith("error: ")]
    exceptions = [line[:500] for line in lines if "Error" in line or "Exception" in line]
    return (ours or exceptions or [line[:500] for line in lines] or [""])[-1]


def run_on_schedule(
    conf: LakehouseConf,
    spec: JobSpec,
    schedule: Schedule | None = None,
    *,
    runs: int | None = None,
    **options,
) -> list[JobRun]:
    """Start a run of the job at each fire time of its schedule (or `schedule`), until SIGINT or
    SIGTERM (which stops the runs going), or until `runs` runs have ended. As Databricks: at most
    `max_concurrent_runs` runs at once; a fire time past them is queued (`queue.enabled`: the run
    starts when one ends) or skipped, and said so. `options`: JobRunner's."""
    schedule = schedule or spec.schedule
    if schedule is None:
        raise InvalidJobSpecError(
            f"job spec {spec.source} has no schedule: add schedule.quartz_cron_expression, or "
            "give one with --cron"
        )
    if schedule.paused:
        raise InvalidJobSpecError(
            f"job spec {spec.source}: schedule.pause_status is PAUSED; set UNPAUSED to run it on "
            "its schedule (`lakehouse jobs run` runs it once now)"
        )
    echo = options.get("echo") or (lambda line: logs.get("jobs").info("%s", line))
    say = partial(_say_as, echo, spec.name)
    wake = threading.Event()  # a signal, or a run that ended
    stopping = threading.Event()

    def stop(*_) -> None:
        stopping.set()
        wake.set()

    main = threading.current_thread() is threading.main_thread()
    previous = {sig: signal.signal(sig, stop) for sig in STOP_SIGNALS if main}
    done: list[JobRun] = []
    going: list[tuple[JobRunner, threading.Thread]] = []
    started = queued = 0

    def start() -> None:
        runner = JobRunner(conf, spec, **options)

        def run() -> None:
            done.append(runner.run())
            wake.set()

        going.append((runner, threading.Thread(target=run, name=f"run {runner.run_id}")))
        going[-1][1].start()

    fire, announced = schedule.next_after(datetime.now(UTC)), None
    try:
        while not stopping.is_set() and (runs is None or len(done) < runs):
            wake.clear()  # a run ending from here on wakes the wait below
            going[:] = [(r, t) for r, t in going if t.is_alive()]
            while queued and len(going) < spec.max_concurrent_runs:
                queued, started = queued - 1, started + 1
                say("a queued run starts")
                start()
            if (runs is not None and started + queued >= runs) or fire is None:
                if not going and not queued:
                    if fire is None:
                        say(f"schedule {schedule.expression!r}: no fire time left")
                    break
                wake.wait()
                continue
            if fire != announced:
                say(f"next run at {fire.isoformat()} ({schedule.expression!r})")
                announced = fire
            if wake.wait(max(0.0, (fire - datetime.now(UTC)).total_seconds())):
                continue  # a run ended, or a signal came, before the fire time
            if datetime.now(UTC) < fire:
                continue  # the wait's monotonic clock ended it before the wall clock's fire time
            if len(going) < spec.max_concurrent_runs:
                started += 1
                start()
            elif spec.queue:
                queued += 1
                say(f"run queued: {len(going)} run(s) going (max_concurrent_runs)")
            else:
                say(f"fire time skipped: {len(going)} run(s) going (max_concurrent_runs)")
            now = datetime.now(UTC)
            fire = schedule.next_after(fire)
            if fire is not None and fire < now:  # the machine slept: these fire times are gone
                say(f"{fires_between(schedule, fire, now)} fire time(s) skipped: past already")
                fire = schedule.next_after(now)
    finally:
        for runner, _ in going:
            runner.stop(signal.SIGTERM if stopping.is_set() else None)
        for _, thread in going:
            thread.join()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    say(f"schedule stopped after {len(done)} run(s)")
    return done


def _say_as(echo: Callable[[str], None], name: str, message: str) -> None:
    echo(f"[{name}] {message}")


def fires_between(schedule: Schedule, first: datetime, end: datetime) -> int:
    fire: datetime | None = first
    count = 0
    while fire is not None and fire < end and count < 10_000:
        count, fire = count + 1, schedule.next_after(fire)
    return count
