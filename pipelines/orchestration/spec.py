"""Job specs in the shape of the Databricks Jobs API 2.1, read and checked before anything runs.

A spec (YAML or JSON) names tasks with `task_key`, `depends_on`, `spark_python_task`
(`python_file`, `parameters`), `max_retries`, `min_retry_interval_millis`, `retry_on_timeout`,
`timeout_seconds`, `run_if`, and cluster settings (`job_clusters` with `new_cluster.spark_conf`
and `spark_env_vars`, or `existing_cluster_id`: a Spark master URL such as spark://host:7077).
Job `parameters` (`name`, `default`) fill `{{job.parameters.<name>}}` in task parameters; also
`{{job.run_id}}`, `{{job.name}}`, `{{task.name}}` and `{{task.attempt}}`.
Every error names the spec file and the key, and all of them are reported at once.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from pipelines.errors import ConfigError

RUN_IF = ("ALL_SUCCESS", "AT_LEAST_ONE_SUCCESS", "NONE_FAILED", "ALL_DONE", "AT_LEAST_ONE_FAILED",
          "ALL_FAILED")  # fmt: skip
JOB_KEYS = {"name", "description", "tasks", "job_clusters", "parameters", "timeout_seconds",
            "max_concurrent_runs", "tags", "email_notifications", "format", "continuous"}  # fmt: skip
TASK_KEYS = {"task_key", "description", "depends_on", "spark_python_task", "job_cluster_key",
             "existing_cluster_id", "new_cluster", "max_retries", "min_retry_interval_millis",
             "retry_on_timeout", "timeout_seconds", "run_if", "libraries"}  # fmt: skip
CLUSTER_KEYS = {"spark_version", "spark_conf", "spark_env_vars", "num_workers", "node_type_id",
                "driver_node_type_id", "custom_tags", "autoscale"}  # fmt: skip
REFERENCE = re.compile(r"\{\{\s*([\w.]+)\s*\}\}")


class InvalidJobSpecError(ConfigError):
    """The spec cannot run; the message lists every problem with its key."""


@dataclass(frozen=True)
class Cluster:
    master: str | None = None  # None: the environment's spark.master
    spark_conf: dict[str, str] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Task:
    key: str
    python_file: Path
    parameters: tuple[str, ...] = ()
    depends_on: tuple[str, ...] = ()
    run_if: str = "ALL_SUCCESS"
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

    def task(self, key: str) -> Task:
        return next(t for t in self.tasks if t.key == key)


def _int(problems: list[str], where: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        problems.append(f"{where}: expected an integer >= {minimum}, got {value!r}")
        return minimum
    return value


def _unknown(problems: list[str], where: str, data: dict, known: set[str]) -> None:
    for k in sorted(set(data) - known):
        problems.append(f"{where}.{k}: unknown key (known: {', '.join(sorted(known))})")


def _cluster(problems: list[str], where: str, spec: dict) -> Cluster:
    if not isinstance(spec, dict):
        problems.append(f"{where}: expected a mapping")
        return Cluster()
    _unknown(problems, where, spec, CLUSTER_KEYS)
    conf = {str(k): str(v) for k, v in (spec.get("spark_conf") or {}).items()}
    env = {str(k): str(v) for k, v in (spec.get("spark_env_vars") or {}).items()}
    return Cluster(master=conf.pop("spark.master", None), spark_conf=conf, env=env)


def find_cycle(deps: dict[str, tuple[str, ...]]) -> list[str] | None:
    """A dependency cycle as a path (a -> b -> a), or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for d in deps.get(node, ()):
            if state.get(d) == 1:
                return path[path.index(d) :] + [d]
            if d in deps and d not in state and (cycle := visit(d)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in deps:
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def load_job_spec(path: str | Path, project_root: Path | None = None) -> JobSpec:
    """Read and check a spec; raise InvalidJobSpecError listing every problem."""
    source = Path(path)
    if not source.is_file():
        raise InvalidJobSpecError(f"job spec {source} does not exist")
    text = source.read_text()
    try:
        data = json.loads(text) if source.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as e:
        raise InvalidJobSpecError(
            f"job spec {source} is not valid {source.suffix[1:].upper()}: {e}"
        ) from None
    if not isinstance(data, dict):
        raise InvalidJobSpecError(f"job spec {source}: expected a mapping at the top level")
    root = project_root or Path.cwd()
    problems: list[str] = []
    _unknown(problems, "job", data, JOB_KEYS)
    name = data.get("name")
    if not isinstance(name, str) or not name:
        problems.append("job.name: required, a non-empty string")
    clusters: dict[str, Cluster] = {}
    for i, jc in enumerate(data.get("job_clusters") or []):
        key = jc.get("job_cluster_key") if isinstance(jc, dict) else None
        if not key:
            problems.append(f"job_clusters[{i}].job_cluster_key: required")
            continue
        clusters[key] = _cluster(
            problems, f"job_clusters[{key}].new_cluster", jc.get("new_cluster") or {}
        )
    parameters = {}
    for i, p in enumerate(data.get("parameters") or []):
        if not isinstance(p, dict) or "name" not in p:
            problems.append(f"parameters[{i}]: expected {{name, default}}")
            continue
        parameters[str(p["name"])] = str(p.get("default", ""))
    raw_tasks = data.get("tasks")
    if not isinstance(raw_tasks, list) or not raw_tasks:
        problems.append("job.tasks: required, a non-empty list")
        raw_tasks = []
    tasks: list[Task] = []
    keys = [t.get("task_key") for t in raw_tasks if isinstance(t, dict)]
    for i, t in enumerate(raw_tasks):
        if not isinstance(t, dict) or not isinstance(t.get("task_key"), str) or not t["task_key"]:
            problems.append(f"tasks[{i}].task_key: required, a non-empty string")
            continue
        key = t["task_key"]
        where = f"tasks[{key}]"
        if keys.count(key) > 1 and keys.index(key) == i:
            problems.append(f"{where}: task_key used {keys.count(key)} times")
        _unknown(problems, where, t, TASK_KEYS)
        deps = []
        for d in t.get("depends_on") or []:
            dep = d.get("task_key") if isinstance(d, dict) else None
            if dep not in keys:
                problems.append(f"{where}.depends_on: unknown task_key {dep!r}")
            else:
                deps.append(dep)
        run_if = t.get("run_if", "ALL_SUCCESS")
        if run_if not in RUN_IF:
            problems.append(f"{where}.run_if: {run_if!r} is not one of {', '.join(RUN_IF)}")
        task_py = t.get("spark_python_task")
        if not isinstance(task_py, dict) or not task_py.get("python_file"):
            problems.append(f"{where}.spark_python_task.python_file: required")
            continue
        python_file = Path(task_py["python_file"])
        if not python_file.is_absolute():
            python_file = root / python_file
        if not python_file.is_file():
            problems.append(f"{where}.spark_python_task.python_file: {python_file} does not exist")
        params = task_py.get("parameters") or []
        if not isinstance(params, list):
            problems.append(f"{where}.spark_python_task.parameters: expected a list of strings")
            params = []
        for ref in REFERENCE.findall(" ".join(map(str, params))):
            known = ref in ("job.run_id", "job.name", "task.name", "task.attempt") or (
                ref.startswith("job.parameters.") and ref.split(".", 2)[2] in parameters
            )
            if not known:
                problems.append(
                    f"{where}.spark_python_task.parameters: unknown reference {{{{{ref}}}}}"
                )
        if "job_cluster_key" in t and t["job_cluster_key"] not in clusters:
            problems.append(f"{where}.job_cluster_key: unknown cluster {t['job_cluster_key']!r}")
        cluster = clusters.get(t.get("job_cluster_key"), Cluster())
        if "new_cluster" in t:
            cluster = _cluster(problems, f"{where}.new_cluster", t["new_cluster"])
        if "existing_cluster_id" in t:
            cluster = Cluster(master=str(t["existing_cluster_id"]))
        tasks.append(Task(
            key=key, python_file=python_file, parameters=tuple(str(p) for p in params),
            depends_on=tuple(deps), run_if=run_if,
            max_retries=_int(problems, f"{where}.max_retries", t.get("max_retries", 0), -1),
            min_retry_interval_ms=_int(problems, f"{where}.min_retry_interval_millis",
                                       t.get("min_retry_interval_millis", 0), 0),
            retry_on_timeout=bool(t.get("retry_on_timeout", False)),
            timeout_seconds=_int(problems, f"{where}.timeout_seconds", t.get("timeout_seconds", 0), 0),
            cluster=cluster,
        ))  # fmt: skip
    deps: dict[str, tuple[str, ...]] = {}
    for t in tasks:
        deps.setdefault(t.key, t.depends_on)
    cycle = find_cycle(deps)
    if cycle:
        problems.append(f"tasks: dependency cycle {' -> '.join(cycle)}")
    timeout = _int(problems, "job.timeout_seconds", data.get("timeout_seconds", 0), 0)
    if problems:
        raise InvalidJobSpecError(
            f"job spec {source} is invalid ({len(problems)} problem{'s' * (len(problems) > 1)}):\n"
            + "\n".join(f"  - {p}" for p in problems)
        )
    return JobSpec(name=name, source=source, tasks=tuple(tasks), parameters=parameters,
                   timeout_seconds=timeout)  # fmt: skip


def resolve(value: str, refs: dict[str, str]) -> str:
    """Fill `{{...}}` references from `refs` (checked to exist when the spec was loaded)."""
    return REFERENCE.sub(lambda m: refs[m.group(1)], value)
