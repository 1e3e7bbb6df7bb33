"""Job specs (YAML or JSON) in the shape of the Databricks Jobs API 2.1, checked before running.

The keys are those of the API (docs/operations.md, "Jobs: Databricks-style multi-task jobs",
says what they do here); `existing_cluster_id` is a Spark master URL such as spark://host:7077
or a cluster of the configuration's `jobs.clusters`.
Every problem is reported at once, naming file and key.
"""

from __future__ import annotations

import difflib
import json
import os
import re
from collections.abc import Collection
from dataclasses import dataclass, field, replace
from enum import StrEnum
from graphlib import CycleError, TopologicalSorter
from pathlib import Path
from typing import Any

import yaml

from pipelines.errors import ConfigError
from pipelines.orchestration.bundle import BundleChoice, bundle_job, is_bundle
from pipelines.orchestration.schedule import InvalidScheduleError, Schedule

# The fields of the Jobs API objects, from the Databricks SDK (scripts/databricks_job_fields.py).
API: dict[str, list[str]] = json.loads(
    (
        Path(__file__).resolve().parent.parent / "resources" / "databricks_job_fields.json"
    ).read_text()
)["objects"]
# What a field does here: honoured (read below), refused with the reason, or (any other field of
# the API) accepted with one warning that it has no effect here (docs/operations.md has the table).
HONOURED = {
    "Job": {"settings", "job_id"},
    "JobSettings": {"name", "tasks", "job_clusters", "parameters", "timeout_seconds", "schedule"}
    | {"max_concurrent_runs", "queue"},
    "Task": {"task_key", "depends_on", "job_cluster_key", "new_cluster"}
    | {"existing_cluster_id", "max_retries", "min_retry_interval_millis", "retry_on_timeout"}
    | {"timeout_seconds", "run_if", "spark_python_task", "spark_submit_task"}
    | {"python_wheel_task", "notebook_task", "condition_task", "run_job_task"},
    "TaskDependency": {"task_key", "outcome"},
    "SparkPythonTask": {"python_file", "parameters", "source"},
    "SparkSubmitTask": {"parameters"},
    "PythonWheelTask": {"package_name", "entry_point", "parameters", "named_parameters"},
    "NotebookTask": {"notebook_path", "base_parameters", "source"},
    "ConditionTask": {"op", "left", "right"},
    "RunJobTask": {"job_id", "job_parameters"},
    "JobCluster": {"job_cluster_key", "new_cluster"},
    "ClusterSpec": {"spark_conf", "spark_env_vars"},
    "CronSchedule": {"quartz_cron_expression", "timezone_id", "pause_status"},
    "JobParameterDefinition": {"name", "default"},
}
_NOT_TASKS = "is not run here (docs/operations.md lists the task types that are)"
REFUSED = {
    "JobSettings": {
        "continuous": "give the tasks continuous queries instead (conf/jobs/orders_continuous.yaml)",
        "trigger": "file-arrival, table and periodic triggers do not run here: use schedule",
        "triggers": "file-arrival, table and periodic triggers do not run here: use schedule",
        "git_source": "tasks run from this checkout, not from a Git source",
        "environments": "no serverless environments here: install packages into the project",
    },
    "Task": {
        f: f"{f} {_NOT_TASKS}"
        for f in API["Task"]
        if f.endswith("_task") and f not in HONOURED["Task"]
    }
    | {
        "libraries": "a job installs no libraries here: add them to the project's environment",
        "disabled": "a disabled task: remove it from the spec",
        "environment_key": "no serverless environments here",
        "compute": "no serverless compute here: use new_cluster or job_cluster_key",
    },
    "NotebookTask": {"warehouse_id": "SQL warehouses are not run here"},
    "RunJobTask": {
        f: "give the job's parameters as job_parameters"
        for f in API["RunJobTask"]
        if f.endswith(("_params", "_commands"))
    },
    "JobCluster": {f: "no serverless compute here" for f in API["JobCluster"] if "serverless" in f},
    "ClusterSpec": {
        "init_scripts": "init scripts are not run here",
        "docker_image": "no cluster images here: the tasks run in the project's environment",
    },
    "CronSchedule": {"sql_condition": "SQL conditions are not evaluated here"},
}
REFERENCE = re.compile(r"\{\{\s*([\w.]+)\s*\}\}")
START_TIME = "iso_date iso_datetime timestamp_ms year month day hour minute second is_weekday"
BUILTIN_REFERENCES = "job.id job.run_id job.name task.name task.run_id task.attempt".split()
BUILTIN_REFERENCES += ["task.execution_count", *(f"job.start_time.{p}" for p in START_TIME.split())]


class RunIf(StrEnum):
    """When a task runs, given the final states of the tasks it depends on."""

    ALL_SUCCESS = "ALL_SUCCESS"
    AT_LEAST_ONE_SUCCESS = "AT_LEAST_ONE_SUCCESS"
    NONE_FAILED = "NONE_FAILED"
    ALL_DONE = "ALL_DONE"
    AT_LEAST_ONE_FAILED = "AT_LEAST_ONE_FAILED"
    ALL_FAILED = "ALL_FAILED"


class TaskKind(StrEnum):
    """What a task runs: its field in the spec."""

    SPARK_PYTHON = "spark_python_task"
    SPARK_SUBMIT = "spark_submit_task"
    PYTHON_WHEEL = "python_wheel_task"
    NOTEBOOK = "notebook_task"
    CONDITION = "condition_task"
    RUN_JOB = "run_job_task"


API_OBJECT = {kind: "".join(w.title() for w in kind.split("_")) for kind in TaskKind}
CONDITION_OPS = {
    "EQUAL_TO": "==",
    "NOT_EQUAL": "!=",
    "GREATER_THAN": ">",
    "GREATER_THAN_OR_EQUAL": ">=",
    "LESS_THAN": "<",
    "LESS_THAN_OR_EQUAL": "<=",
}


class InvalidJobSpecError(ConfigError):
    """The spec cannot run; the message lists every problem with its key."""


@dataclass(frozen=True)
class Cluster:
    master: str | None = None  # None: the configuration's (jobs.clusters, then spark.master)
    name: str | None = None  # its job_cluster_key or existing_cluster_id: jobs.clusters's key
    spark_conf: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    key: str
    python_file: Path | None = None  # a Python task's file; a notebook task's notebook
    parameters: tuple[str, ...] = ()  # command-line arguments (a spark_submit_task: spark-submit's)
    kind: TaskKind = TaskKind.SPARK_PYTHON
    # a wheel's named_parameters, a notebook's base_parameters, a run_job_task's job_parameters
    named: dict[str, str] = field(default_factory=dict)
    # a wheel's (package_name, entry_point); a condition's (op, left, right); (job_id,) of run_job
    target: tuple[str, ...] = ()
    depends_on: tuple[str, ...] = ()
    outcomes: dict[str, str] = field(default_factory=dict)  # dependency -> the outcome it needs
    run_if: RunIf = RunIf.ALL_SUCCESS
    max_retries: int = 0  # -1: retry for ever (a continuous task)
    min_retry_interval_ms: int = 0
    retry_on_timeout: bool = False
    timeout_seconds: int = 0  # 0: no timeout
    cluster: Cluster = field(default_factory=Cluster)


@dataclass(frozen=True)
class JobSpec:
    name: str
    source: Path
    tasks: tuple[Task, ...]
    parameters: dict[str, str] = field(default_factory=dict)
    timeout_seconds: int = 0
    schedule: Schedule | None = None  # `lakehouse jobs schedule` runs it at these times
    warnings: tuple[str, ...] = ()  # Jobs API fields it has that have no effect here
    job_id: str = ""  # {{job.id}}: an export's job_id, else the name
    max_concurrent_runs: int = 1  # runs of a schedule at once; a fire time past them waits
    queue: bool = False  # (queued) or is skipped


def find_cycle(deps: dict[str, tuple[str, ...]]) -> list[str] | None:
    """A dependency cycle as a path (a -> b -> a), or None."""
    try:
        TopologicalSorter(deps).prepare()
    except CycleError as e:
        return e.args[1][::-1]  # graphlib lists each node before the ones depending on it
    return None


def _read_mapping(source: Path) -> dict:
    """The spec file's top-level mapping; a missing or unparseable file stops here."""
    if not source.is_file():
        raise InvalidJobSpecError(f"job spec {source} does not exist")
    text = source.read_text()
    try:
        data = json.loads(text) if source.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        kind = source.suffix[1:].upper()
        raise InvalidJobSpecError(f"job spec {source} is not valid {kind}: {e}") from None
    if not isinstance(data, dict):
        raise InvalidJobSpecError(f"job spec {source}: expected a mapping at the top level")
    return data


class _SpecReader:
    """Reads a spec's parts, collecting every problem instead of stopping at the first."""

    def __init__(self, data: dict, base: Path, clusters: Collection[str]) -> None:
        self.data, self.base, self.known_clusters = data, base, clusters
        self.problems: list[str] = []
        self.warnings: list[str] = []
        self.job_id = str(data.get("job_id", ""))
        if isinstance(data.get("settings"), dict):  # `databricks jobs get` output
            self.unknown("job", {k: v for k, v in data.items() if k != "job_id"}, "Job")
            self.data = data = data["settings"]
        self.unknown("job", data, "JobSettings")
        self.clusters = self._job_clusters()
        self.parameters = self._parameters()

    def integer(self, data: dict, where: str, key: str, minimum: int, default: int = 0) -> int:
        value = data.get(key, default)
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            self.problems.append(f"{where}.{key}: expected an integer >= {minimum}, got {value!r}")
            return minimum
        return value

    def typed(self, data: dict, where: str, key: str, kind: type, what: str) -> Any:
        """`data[key]` if it is a `kind`, else an empty one (a wrong type is a problem)."""
        value = data.get(key)
        if value is not None and not isinstance(value, kind):
            self.problems.append(f"{where}.{key}: expected {what}, got {value!r}")
        return value if isinstance(value, kind) else kind()

    def unknown(self, where: str, data: dict, api: str) -> None:
        """Each field of `data` (an object of the Jobs API): honoured, refused with the reason,
        accepted with a warning (an API field with no effect here), or unknown (a typo)."""
        for k in sorted(set(data) - HONOURED[api]):
            if reason := REFUSED.get(api, {}).get(k):
                self.problems.append(f"{where}.{k}: {reason}")
            elif k in API[api]:
                self.warnings.append(f"{where}.{k}: a Jobs API field with no effect here")
            else:
                near = difflib.get_close_matches(k, API[api], n=1)
                hint = f"; did you mean {near[0]!r}?" if near else ""
                self.problems.append(f"{where}.{k}: not a field of the Jobs API's {api}{hint}")

    def cluster(self, where: str, spec: Any, name: str | None = None) -> Cluster:
        if not isinstance(spec, dict):
            self.problems.append(f"{where}: expected a mapping, got {spec!r}")
            return Cluster()
        self.unknown(where, spec, "ClusterSpec")
        conf = self.typed(spec, where, "spark_conf", dict, "a mapping")
        env = self.typed(spec, where, "spark_env_vars", dict, "a mapping")
        conf, env = ({str(k): str(v) for k, v in m.items()} for m in (conf, env))
        return Cluster(conf.pop("spark.master", None), name, spark_conf=conf, env=env)

    def _job_clusters(self) -> dict[str, Cluster]:
        clusters = {}
        for i, jc in enumerate(self.typed(self.data, "job", "job_clusters", list, "a list")):
            key = jc.get("job_cluster_key") if isinstance(jc, dict) else None
            if not key:
                self.problems.append(f"job_clusters[{i}].job_cluster_key: required")
                continue
            self.unknown(f"job_clusters[{key}]", jc, "JobCluster")
            where = f"job_clusters[{key}].new_cluster"
            clusters[key] = self.cluster(where, jc.get("new_cluster") or {}, str(key))
        return clusters

    def schedule(self) -> Schedule | None:
        """`schedule: {quartz_cron_expression, timezone_id, pause_status}`, None without one."""
        if (spec := self.data.get("schedule")) is None:
            return None
        if not isinstance(spec, dict) or not spec.get("quartz_cron_expression"):
            self.problems.append("job.schedule.quartz_cron_expression: required, a string")
            return None
        self.unknown("job.schedule", spec, "CronSchedule")
        status = spec.get("pause_status", "UNPAUSED")
        if status not in ("PAUSED", "UNPAUSED"):
            self.problems.append(f"job.schedule.pause_status: {status!r} is not PAUSED or UNPAUSED")
        try:
            return Schedule(
                str(spec["quartz_cron_expression"]),
                str(spec.get("timezone_id", "UTC")),
                paused=status == "PAUSED",
            )
        except InvalidScheduleError as e:
            self.problems.append(f"job.schedule: {e}")
            return None

    def _parameters(self) -> dict[str, str]:
        parameters = {}
        for i, p in enumerate(self.typed(self.data, "job", "parameters", list, "a list")):
            if not isinstance(p, dict) or "name" not in p:
                self.problems.append(f"parameters[{i}]: expected {{name, default}}")
                continue
            self.unknown(f"parameters[{i}]", p, "JobParameterDefinition")
            parameters[str(p["name"])] = str(p.get("default", ""))
        return parameters

    def tasks(self) -> list[Task]:
        raw = self.data.get("tasks")
        if not isinstance(raw, list) or not raw:
            self.problems.append("job.tasks: required, a non-empty list")
            return []
        keys = [t.get("task_key") if isinstance(t, dict) else None for t in raw]
        self.conditions = {t.get("task_key") for t in raw if "condition_task" in (t or {})}
        return [task for i, t in enumerate(raw) if (task := self._task(i, t, keys))]

    def _task(self, i: int, t: Any, keys: list) -> Task | None:
        if not isinstance(t, dict) or not isinstance(t.get("task_key"), str) or not t["task_key"]:
            self.problems.append(f"tasks[{i}].task_key: required, a non-empty string")
            return None
        key = t["task_key"]
        where = f"tasks[{key}]"
        if keys.count(key) > 1 and keys.index(key) == i:
            self.problems.append(f"{where}: task_key used {keys.count(key)} times")
        self.unknown(where, t, "Task")
        deps, outcomes = self._depends_on(where, t, keys)
        run_if = t.get("run_if", RunIf.ALL_SUCCESS)
        if run_if not in list(RunIf):
            self.problems.append(f"{where}.run_if: {run_if!r} is not one of {', '.join(RunIf)}")
            run_if = RunIf.ALL_SUCCESS
        kinds = [k for k in TaskKind if k in t]
        if len(kinds) != 1:
            if not any(k in REFUSED["Task"] for k in t):  # else a type refused above
                got = f"got {', '.join(kinds)}" if kinds else "got none"
                self.problems.append(f"{where}: one task type of {', '.join(TaskKind)}; {got}")
            return None
        kind = kinds[0]
        spec = self.typed(t, where, kind, dict, "a mapping")
        self.unknown(f"{where}.{kind}", spec, API_OBJECT[kind])
        if (work := self._work(f"{where}.{kind}", kind, spec)) is None:
            return None
        self._check_references(f"{where}.{kind}", spec, keys)
        return replace(
            work,
            key=key,
            depends_on=tuple(deps),
            outcomes=outcomes,
            run_if=RunIf(run_if),
            max_retries=self.integer(t, where, "max_retries", -1),
            min_retry_interval_ms=self.integer(t, where, "min_retry_interval_millis", 0),
            retry_on_timeout=bool(t.get("retry_on_timeout", False)),
            timeout_seconds=self.integer(t, where, "timeout_seconds", 0),
            cluster=self._task_cluster(where, t),
        )

    def _depends_on(self, where: str, t: dict, keys: list) -> tuple[list[str], dict[str, str]]:
        """The dependencies, and the outcome each dependency on a condition task needs."""
        deps = self.typed(t, where, "depends_on", list, "a list of {task_key}")
        outcomes = {}
        for d in deps:
            if not isinstance(d, dict):
                continue
            self.unknown(f"{where}.depends_on", d, "TaskDependency")
            if "outcome" not in d:
                continue
            if d.get("task_key") not in self.conditions:
                self.problems.append(
                    f"{where}.depends_on.outcome: {d.get('task_key')!r} is not a condition_task"
                )
            elif str(d["outcome"]).lower() not in ("true", "false"):
                self.problems.append(f"{where}.depends_on.outcome: {d['outcome']!r}: true or false")
            outcomes[str(d["task_key"])] = str(d["outcome"]).lower()
        deps = [d.get("task_key") if isinstance(d, dict) else None for d in deps]
        unknown = [d for d in deps if d not in keys]
        self.problems += [f"{where}.depends_on: unknown task_key {d!r}" for d in unknown]
        return [d for d in deps if d in keys], outcomes

    def _strings(self, where: str, spec: dict, key: str, kind: type = list) -> Any:
        """A list of strings (or a mapping to strings) of `spec`, as strings."""
        value = self.typed(spec, where, key, kind, "a list" if kind is list else "a mapping")
        if isinstance(value, dict):
            return {str(k): str(v) for k, v in value.items()}
        return tuple(map(str, value))

    def _file(self, where: str, spec: dict, key: str, suffixes: tuple[str, ...] = ("",)) -> Path:
        """A file the spec names, from the spec's folder (an absolute path as it is)."""
        if spec.get("source", "WORKSPACE") != "WORKSPACE":
            self.problems.append(
                f"{where}.source: {spec['source']!r}: only WORKSPACE here (a file beside the "
                "spec); GIT needs git_source, which is not run here"
            )
        path = Path(os.path.normpath(self.base / str(spec[key])))
        found = [p for p in (Path(f"{path}{s}") for s in suffixes) if p.is_file()]
        if not found:
            self.problems.append(f"{where}.{key}: {path} does not exist")
        return found[0] if found else path

    def _work(self, where: str, kind: TaskKind, spec: dict) -> Task | None:
        """The task's work, by kind (its key and scheduling are set by the caller)."""
        required = {
            TaskKind.SPARK_PYTHON: ("python_file",),
            TaskKind.SPARK_SUBMIT: ("parameters",),
            TaskKind.PYTHON_WHEEL: ("package_name", "entry_point"),
            TaskKind.NOTEBOOK: ("notebook_path",),
            TaskKind.CONDITION: ("op", "left", "right"),
            TaskKind.RUN_JOB: ("job_id",),
        }[kind]
        if missing := [k for k in required if spec.get(k) in (None, "", [])]:
            self.problems += [f"{where}.{k}: required" for k in missing]
            return None
        params = self._strings(where, spec, "parameters")
        if kind == TaskKind.SPARK_PYTHON:
            return Task("", self._file(where, spec, "python_file"), params)
        if kind == TaskKind.SPARK_SUBMIT:
            return Task("", None, params, kind)
        if kind == TaskKind.PYTHON_WHEEL:
            named = self._strings(where, spec, "named_parameters", dict)
            if params and named:
                self.problems.append(f"{where}: parameters or named_parameters, not both")
            target = (str(spec["package_name"]), str(spec["entry_point"]))
            return Task("", None, params, kind, named, target)
        if kind == TaskKind.NOTEBOOK:
            notebook = self._file(where, spec, "notebook_path", ("", ".ipynb"))
            return Task("", notebook, (), kind, self._strings(where, spec, "base_parameters", dict))
        if kind == TaskKind.CONDITION:
            if spec["op"] not in CONDITION_OPS:
                self.problems.append(
                    f"{where}.op: {spec['op']!r} is not one of {', '.join(CONDITION_OPS)}"
                )
            return Task(
                "", None, (), kind, target=(str(spec["op"]), str(spec["left"]), str(spec["right"]))
            )
        named = self._strings(where, spec, "job_parameters", dict)
        return Task("", None, (), kind, named, (str(spec["job_id"]),))

    def _check_references(self, where: str, spec: dict, keys: list) -> None:
        """Every {{...}} in the task's fields names something a run fills."""
        known = {*BUILTIN_REFERENCES, *(f"job.parameters.{name}" for name in self.parameters)}
        for field_name, value in spec.items():
            for ref in REFERENCE.findall(json.dumps(value)):
                parts = ref.split(".")
                task_value = len(parts) == 4 and parts[0] == "tasks" and parts[2] == "values"
                if ref not in known and not (task_value and parts[1] in keys):
                    self.problems.append(f"{where}.{field_name}: unknown reference {{{{{ref}}}}}")

    def _task_cluster(self, where: str, t: dict) -> Cluster:
        key = t.get("job_cluster_key")
        if "job_cluster_key" in t and key not in self.clusters:
            self.problems.append(f"{where}.job_cluster_key: unknown cluster {key!r}")
        cluster = self.clusters.get(str(key), Cluster())
        if "new_cluster" in t:
            cluster = self.cluster(f"{where}.new_cluster", t["new_cluster"])
        if "existing_cluster_id" in t:
            cluster_id = str(t["existing_cluster_id"])
            if cluster_id in self.known_clusters:
                return Cluster(name=cluster_id)
            if not re.match(r"(spark|k8s|mesos)://|local(\[|$)|yarn$", cluster_id):
                self.problems.append(
                    f"{where}.existing_cluster_id: {cluster_id!r} is neither a cluster of the "
                    "configuration's jobs.clusters nor a Spark master URL (spark://host:7077, "
                    "local[N], yarn, k8s://...)"
                )
            cluster = Cluster(master=cluster_id, name=cluster_id)
        return cluster


def _invalid(source: Path, problems: list[str]) -> InvalidJobSpecError:
    count = f"{len(problems)} problem{'s' * (len(problems) > 1)}"
    listing = "\n".join(f"  - {p}" for p in problems)
    return InvalidJobSpecError(f"job spec {source} is invalid ({count}):\n{listing}")


def load_job_spec(
    path: str | Path,
    base: Path | None = None,
    clusters: Collection[str] = (),
    bundle: BundleChoice | None = None,
) -> JobSpec:
    """Read and check a spec, or a job of a bundle (`bundle`: which); raise InvalidJobSpecError
    listing every problem. A relative `python_file` is a path from `base`: by default the spec's
    folder, in a bundle the folder of the file holding it (never the working directory).
    `clusters`: the ids an `existing_cluster_id` may name (jobs.clusters)."""
    source = Path(path)
    data, found, said = _read_mapping(source), list[str](), list[str]()
    if is_bundle(data):
        data = bundle_job(source, data, bundle or BundleChoice(), found, said)
        if found:
            raise _invalid(source, found)
    reader = _SpecReader(data, base or source.resolve().parent, clusters)
    data, problems = reader.data, reader.problems
    reader.warnings[:0] = said
    name = data.get("name")
    if not isinstance(name, str) or not name:
        problems.append("job.name: required, a non-empty string")
        name = ""
    tasks = reader.tasks()
    deps: dict[str, tuple[str, ...]] = {}
    for t in tasks:
        deps.setdefault(t.key, t.depends_on)  # a duplicate key is reported already
    if cycle := find_cycle(deps):
        problems.append(f"tasks: dependency cycle {' -> '.join(cycle)}")
    timeout = reader.integer(data, "job", "timeout_seconds", 0)
    concurrent = reader.integer(data, "job", "max_concurrent_runs", 1, default=1)
    queue = reader.typed(data, "job", "queue", dict, "a mapping")
    problems += [f"job.queue.{k}: not a field of QueueSettings" for k in queue if k != "enabled"]
    if not isinstance(queued := queue.get("enabled", False), bool):
        problems.append(f"job.queue.enabled: expected true or false, got {queued!r}")
    schedule = reader.schedule()
    if problems:
        raise _invalid(source, problems)
    warnings = tuple(f"job spec {source}: {w}" for w in reader.warnings)
    job_id = reader.job_id or str(name)
    return JobSpec(
        name,
        source,
        tuple(tasks),
        reader.parameters,
        timeout,
        schedule,
        warnings,
        job_id,
        concurrent,
        queued is True,
    )


def resolve(value: str, refs: dict[str, str]) -> str:
    """Fill `{{...}}` references from `refs` (checked to exist when the spec was loaded)."""
    return REFERENCE.sub(lambda m: refs[m.group(1)], value)
