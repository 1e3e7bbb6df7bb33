"""The task types of a job spec besides spark_python_task, task values and condition branches,
run by the job runner with plain Python processes in place of spark-submit (no JVM here)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

import nbformat
import pytest

from pipelines.config import load_config
from pipelines.jobs import layer_job, pipeline_job
from pipelines.orchestration import runner
from pipelines.orchestration.runs import RunState
from pipelines.orchestration.spec import InvalidJobSpecError, TaskKind, load_job_spec

TASKS = Path(__file__).resolve().parents[1] / "databricks" / "tasks"


def _python(conf, task, params, master=None) -> list[str]:
    """spark-submit's command line without spark-submit: the file, or the wheel's launcher."""
    if task.kind == TaskKind.PYTHON_WHEEL:
        return [sys.executable, str(runner.JOBS / "wheel_task.py"), *task.target, *params]
    return [sys.executable, str(task.python_file), *params]


def test_every_task_type_runs_with_task_values_branches_and_a_child_job(tmp_path, monkeypatch):
    """A count hands its value on; a condition on it takes the true branch (the false one is
    EXCLUDED); a wheel's entry point gets named parameters filled from task values; a notebook
    runs with its parameters and is kept executed; a run_job_task runs child.yaml by its name."""
    monkeypatch.setattr(runner, "spark_submit_command", _python)
    conf = load_config("test").updated({"storage.root": str(tmp_path / "lake")})
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TASKS), *sys.path])}
    out = tmp_path / "child.txt"
    job = runner.JobRunner(
        conf,
        load_job_spec(TASKS / "every_type.yaml"),
        parameters={"out": str(out)},
        env=env,
        echo=lambda line: None,
    )
    run = job.run()
    assert run.states == {
        "count": RunState.SUCCESS,
        "check": RunState.SUCCESS,
        "big": RunState.SUCCESS,
        "small": RunState.EXCLUDED,
        "greet": RunState.SUCCESS,
        "child": RunState.SUCCESS,
    }
    assert (run.outcomes, run.state) == ({"check": "true"}, RunState.SUCCESS)
    values = {t: json.loads((job.logs / f"{t}.values.json").read_text()) for t in ("big", "greet")}
    assert values == {
        "big": {"argv": ["--rows=5", "--label=big batch"]},
        "greet": {"greeting": f"hello run {run.run_id}"},
    }
    executed = nbformat.read(job.logs / "greet-0.ipynb", as_version=4)
    printed = [o.get("text") for c in executed.cells if c.cell_type == "code" for o in c.outputs]
    assert printed == [f"hello run {run.run_id}\n"]
    assert out.read_text() == "5"  # the child job's task, with the parameters it was given


def test_a_condition_compares_numbers_as_numbers_and_strings_only_for_equality():
    holds = runner.condition_holds
    assert holds("GREATER_THAN", "10", "9") and not holds("GREATER_THAN", "9", "10")
    assert holds("EQUAL_TO", "1.0", "1") and holds("NOT_EQUAL", "a", "b")
    assert holds("EQUAL_TO", "paid", "paid") and not holds("LESS_THAN", "a", "b")
    assert holds("LESS_THAN_OR_EQUAL", "-2", "-2") and holds("GREATER_THAN_OR_EQUAL", "3", "2.5")


def test_a_task_value_never_set_fails_the_task_that_needs_it(tmp_path, monkeypatch):
    monkeypatch.setattr(runner, "spark_submit_command", _python)
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"name: j\ntasks:\n  - task_key: a\n    spark_python_task: {{python_file: {TASKS}/count.py,"
        " parameters: ['1']}\n  - task_key: b\n    depends_on: [{task_key: a}]\n"
        "    condition_task: {op: EQUAL_TO, left: '{{tasks.a.values.nope}}', right: '1'}\n"
    )
    conf = load_config("test").updated({"storage.root": str(tmp_path / "lake")})
    run = runner.JobRunner(conf, load_job_spec(spec), echo=lambda line: None).run()
    assert (run.states["b"], run.state) == (RunState.FAILED, RunState.FAILED)


def test_spark_submit_and_wheel_tasks_are_spark_submit_command_lines(tmp_path):
    conf = load_config("test")
    spec = load_job_spec(TASKS / "every_type.yaml")
    big = next(t for t in spec.tasks if t.key == "big")
    cmd = runner.spark_submit_command(conf, big, ["--rows=5"])
    assert cmd[0].endswith("spark-submit") and cmd[-4:] == [
        str(runner.JOBS / "wheel_task.py"),
        "demo_wheel",
        "main",
        "--rows=5",
    ]
    submit = load_job_spec(
        _spec_of(tmp_path, "spark_submit_task: {parameters: [--class, A, a.jar]}")
    )
    cmd = runner.spark_submit_command(conf, submit.tasks[0], list(submit.tasks[0].parameters))
    assert cmd[-3:] == ["--class", "A", "a.jar"] and "--master" in cmd


def test_the_pipeline_drivers_get_the_pipelines_driver_memory(monkeypatch):
    """The pipeline job's driver holds a batch of every layer: 4g, where the layer jobs take
    spark.driver_memory (2g), both as `lakehouse run pipeline` and as the shipped spec's task."""
    conf = load_config("local")
    assert (conf.pipeline.driver_memory, conf.spark.driver_memory) == ("4g", "2g")
    spec = load_job_spec(Path("conf/jobs/orders_pipeline.yaml"))
    memory = {
        t.key: (cmd := runner.spark_submit_command(conf, t, []))[cmd.index("--driver-memory") + 1]
        for t in spec.tasks
    }
    assert memory == {"setup": "2g", "pipeline": "4g", "publish": "2g"}
    built = {}
    monkeypatch.setattr(layer_job, "check_reachable", lambda conf: None)
    monkeypatch.setattr(layer_job, "stop_with_runner", lambda: None)
    monkeypatch.setattr(
        layer_job,
        "build_spark",
        lambda conf, **_: built.setdefault("memory", conf.spark.driver_memory),
    )
    monkeypatch.setattr(layer_job, "serve_metrics", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(layer_job, "lineage_run", lambda *a: contextlib.nullcontext())
    monkeypatch.setattr(pipeline_job, "run_pipeline", lambda *a, **k: None)
    assert pipeline_job.main(["--env", "local", "--once"]) == 0
    assert built == {"memory": "4g"}


def _spec_of(folder: Path, task: str) -> Path:
    path = folder / "spec.yaml"
    path.write_text(f"name: s\ntasks:\n  - task_key: t\n    {task}\n")
    return path


@pytest.mark.parametrize(
    ("task", "problem"),
    [
        ("condition_task: {op: ABOUT, left: a, right: b}", "tasks[t].condition_task.op: 'ABOUT'"),
        (
            "python_wheel_task: {package_name: p}",
            "tasks[t].python_wheel_task.entry_point: required",
        ),
        ("notebook_task: {notebook_path: nowhere}", "tasks[t].notebook_task.notebook_path: "),
        ("run_job_task: {job_id: 1, python_params: [a]}", "give the job's parameters as job_param"),
        ("notebook_task: {notebook_path: x, warehouse_id: w}", "SQL warehouses are not run here"),
        ("spark_python_task: {python_file: x.py}\n    sql_task: {}", "sql_task is not run here"),
    ],
)
def test_a_task_type_is_checked_when_the_spec_loads(tmp_path, task, problem):
    spec = tmp_path / "spec.yaml"
    spec.write_text(f"name: s\ntasks:\n  - task_key: t\n    {task}\n")
    with pytest.raises(InvalidJobSpecError, match=None) as e:
        load_job_spec(spec)
    assert problem in str(e.value)
