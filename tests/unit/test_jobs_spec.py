"""Job specs are checked before anything runs; every problem is named with its key."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pipelines.orchestration.spec import InvalidJobSpecError, find_cycle, load_job_spec, resolve

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, spec: dict, name: str = "spec.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(spec))
    return path


def _task(key: str, *deps: str, **extra) -> dict:
    return {
        "task_key": key,
        "depends_on": [{"task_key": d} for d in deps],
        "spark_python_task": {
            "python_file": str(ROOT / "pipelines/jobs/bronze_job.py"),
            "parameters": ["--once"],
        },
        **extra,
    }


def test_the_shipped_specs_are_valid():
    for spec in sorted((ROOT / "conf" / "jobs").glob("*.yaml")):
        job = load_job_spec(spec)  # its files: from the spec's folder
        assert job.tasks and job.name
        assert all(t.python_file.resolve().is_relative_to(ROOT / "pipelines") for t in job.tasks)


def test_a_shipped_spec_runs_on_the_environments_master_unless_one_is_named():
    from pipelines.config import load_config
    from pipelines.orchestration.runner import spark_submit_command

    conf = load_config("test").updated({"spark.master": "spark://cluster:7077"})
    for spec in sorted((ROOT / "conf" / "jobs").glob("*.yaml")):
        for task in load_job_spec(spec).tasks:
            cmd = spark_submit_command(conf, task, [])
            assert cmd[cmd.index("--master") + 1] == "spark://cluster:7077", (spec, task.key)
    cmd = spark_submit_command(conf, task, [], master="local[1]")  # --master on the command line
    assert cmd[cmd.index("--master") + 1] == "local[1]"


def test_a_valid_spec_is_read_with_its_settings(tmp_path):
    spec = {
        "name": "j",
        "parameters": [{"name": "env", "default": "local"}],
        "job_clusters": [
            {
                "job_cluster_key": "c",
                "new_cluster": {
                    "spark_conf": {
                        "spark.master": "spark://127.0.0.1:7077",
                        "spark.executor.memory": "1g",
                    },
                    "spark_env_vars": {"X": "1"},
                },
            }
        ],
        "tasks": [
            _task(
                "a",
                job_cluster_key="c",
                max_retries=2,
                min_retry_interval_millis=500,
                timeout_seconds=60,
                retry_on_timeout=True,
            ),
            _task("b", "a", run_if="ALL_DONE", existing_cluster_id="spark://h:7077"),
        ],
    }
    job = load_job_spec(_write(tmp_path, spec), ROOT)
    a, b = job.tasks
    assert (a.max_retries, a.min_retry_interval_ms, a.timeout_seconds, a.retry_on_timeout) == (
        2,
        500,
        60,
        True,
    )
    assert a.cluster.master == "spark://127.0.0.1:7077"
    assert a.cluster.spark_conf == {"spark.executor.memory": "1g"} and a.cluster.env == {"X": "1"}
    assert (b.depends_on, b.run_if, b.cluster.master) == (("a",), "ALL_DONE", "spark://h:7077")
    assert job.parameters == {"env": "local"}
    assert a.python_file == ROOT / "pipelines/jobs/bronze_job.py"


def test_every_problem_is_named_at_once(tmp_path):
    spec = {
        "name": "broken",
        "colour": "red",
        "max_concurrent_runs": 0,
        "queue": {"enabled": "yes", "size": 3},
        "tasks": [
            _task("a", "c"),
            _task("b", "a"),
            _task("c", "b"),
            _task("d", "nope", run_if="SOMETIMES"),
            {
                "task_key": "e",
                "spark_python_task": {
                    "python_file": "jobs/missing.py",
                    "parameters": ["{{job.parameters.env}}"],
                },
            },
            _task("a"),
            _task("f", max_retries="3"),
            _task("g") | {"spark_python_task": {"python_file": "x.py", "source": "GIT"}},
        ],
    }
    path = _write(tmp_path, spec)
    (tmp_path / "x.py").touch()
    with pytest.raises(InvalidJobSpecError) as e:
        load_job_spec(path, ROOT)
    message = str(e.value)
    assert message.startswith(f"job spec {path} is invalid (13 problems):")
    for expected in (
        "job.colour: not a field of the Jobs API's JobSettings",
        "tasks[d].depends_on: unknown task_key 'nope'",
        "tasks[d].run_if: 'SOMETIMES' is not one of ALL_SUCCESS",
        f"tasks[e].spark_python_task.python_file: {ROOT / 'jobs/missing.py'} does not exist",
        "tasks[e].spark_python_task.parameters: unknown reference {{job.parameters.env}}",
        "tasks[a]: task_key used 2 times",
        "tasks[f].max_retries: expected an integer >= -1, got '3'",
        "tasks: dependency cycle a -> c -> b -> a",
        "tasks[g].spark_python_task.source: 'GIT': only WORKSPACE here",
        f"tasks[g].spark_python_task.python_file: {ROOT / 'x.py'} does not exist",
        "job.max_concurrent_runs: expected an integer >= 1, got 0",
        "job.queue.enabled: expected true or false, got 'yes'",
        "job.queue.size: not a field of QueueSettings",
    ):
        assert expected in message, message


def test_find_cycle_and_resolve():
    assert find_cycle({"a": (), "b": ("a",), "c": ("a", "b")}) is None
    assert find_cycle({"a": ("a",)}) == ["a", "a"]
    assert (
        resolve(
            "--env={{ job.parameters.env }}/{{task.name}}",
            {"job.parameters.env": "test", "task.name": "t"},
        )
        == "--env=test/t"
    )


def test_the_cli_refuses_an_invalid_spec_before_anything_starts(tmp_path):
    path = _write(tmp_path, {"name": "x", "tasks": [_task("a", "a")]})
    env = {"LAKEHOUSE__STORAGE__ROOT": str(tmp_path / "lake"), "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "pipelines.cli", "--env", "test", "jobs", "run", str(path)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert result.returncode == 3, result.stderr  # ExitCode.CONFIG
    assert result.stderr.strip() == (
        f"error: job spec {path} is invalid (1 problem):\n  - tasks: dependency cycle a -> a"
    )
    assert not (tmp_path / "lake").exists()


def test_a_cluster_setting_given_as_a_list_is_a_named_problem(tmp_path):
    cluster = {"spark_conf": ["spark.executor.memory=1g"], "spark_env_vars": ["X=1"]}
    spec = {
        "name": "j",
        "job_clusters": [{"job_cluster_key": "c", "new_cluster": cluster}],
        "tasks": [_task("a", job_cluster_key="c"), _task("b", new_cluster=cluster)],
    }
    with pytest.raises(InvalidJobSpecError) as e:
        load_job_spec(_write(tmp_path, spec), ROOT)
    message = str(e.value)
    for where in ("job_clusters[c].new_cluster", "tasks[b].new_cluster"):
        assert (
            f"{where}.spark_conf: expected a mapping, got ['spark.executor.memory=1g']" in message
        )
        assert f"{where}.spark_env_vars: expected a mapping, got ['X=1']" in message


def test_depends_on_given_as_a_string_is_a_named_problem(tmp_path):
    spec = {"name": "j", "tasks": [_task("a"), {**_task("b"), "depends_on": "a"}]}
    path = _write(tmp_path, spec)
    with pytest.raises(InvalidJobSpecError) as e:
        load_job_spec(path, ROOT)
    assert str(e.value) == (
        f"job spec {path} is invalid (1 problem):\n"
        "  - tasks[b].depends_on: expected a list of {task_key}, got 'a'"
    )


@pytest.mark.parametrize(
    ("run_if", "states", "expected"),
    [
        ("ALL_SUCCESS", ["SUCCESS", "EXCLUDED"], "RUNNING"),  # excluded counts as a success
        ("ALL_SUCCESS", ["SUCCESS", "FAILED"], "UPSTREAM_FAILED"),
        ("AT_LEAST_ONE_SUCCESS", ["FAILED", "UPSTREAM_FAILED"], "UPSTREAM_FAILED"),
        ("NONE_FAILED", ["SUCCESS", "EXCLUDED"], "RUNNING"),
        ("NONE_FAILED", ["TIMEDOUT", "SUCCESS"], "UPSTREAM_FAILED"),
        ("ALL_DONE", ["FAILED", "TIMEDOUT"], "RUNNING"),
        ("AT_LEAST_ONE_FAILED", ["SUCCESS", "SUCCESS"], "EXCLUDED"),
        ("AT_LEAST_ONE_FAILED", ["SUCCESS", "TIMEDOUT"], "RUNNING"),
        ("ALL_FAILED", ["FAILED", "SUCCESS"], "EXCLUDED"),
        ("ALL_DONE", ["EXCLUDED", "EXCLUDED"], "EXCLUDED"),  # all its dependencies excluded
    ],
)
def test_run_if_outcomes_are_databricks(run_if, states, expected):
    from pipelines.orchestration.runner import run_if_outcome
    from pipelines.orchestration.runs import RunState
    from pipelines.orchestration.spec import RunIf

    assert run_if_outcome(RunIf(run_if), [RunState(s) for s in states]) == expected


def test_a_job_runs_result_is_its_leaf_tasks(tmp_path):
    from pipelines.orchestration.runs import JobRun

    spec = load_job_spec(
        _write(tmp_path, {"name": "j", "tasks": [_task("a"), _task("b", "a", run_if="ALL_DONE")]}),
        ROOT,
    )
    run = JobRun(1, spec, {"a": "FAILED", "b": "SUCCESS"})
    assert run.state == "SUCCESS_WITH_FAILURES"  # the failure was handled: b is the leaf
    assert JobRun(1, spec, {"a": "SUCCESS", "b": "SUCCESS"}).state == "SUCCESS"
    assert JobRun(1, spec, {"a": "SUCCESS", "b": "TIMEDOUT"}).state == "FAILED"
    assert JobRun(1, spec, {"a": "FAILED", "b": "CANCELED"}).state == "CANCELED"


EXPORT = ROOT / "tests" / "databricks" / "job_get.json"


def test_a_job_exported_from_a_workspace_is_read_and_what_does_nothing_here_is_said_once():
    """`databricks jobs get` output (a realistic export, every common field): the tasks, clusters
    and parameters are read; each field with no effect here is one warning line."""
    import json

    job = load_job_spec(EXPORT, ROOT)
    assert (job.max_concurrent_runs, job.queue) == (1, True)
    assert (job.name, job.job_id, [t.key for t in job.tasks]) == (
        "orders-batch",
        "911284736120345",
        ["bronze", "silver", "gold"],
    )
    assert job.tasks[0].cluster.spark_conf == {"spark.locality.wait": "0s"}
    assert (job.tasks[0].max_retries, job.tasks[1].depends_on) == (2, ("bronze",))
    warned = sorted(w.split(": ")[1] for w in job.warnings)
    cluster = "job_clusters[orders].new_cluster"
    assert warned == sorted(
        [
            *(f"job.{k}" for k in ("creator_user_name", "run_as_user_name")),
            "job.created_time",
            *(f"job.{k}" for k in ("description", "email_notifications", "edit_mode", "format")),
            *(f"job.{k}" for k in ("health", "notification_settings", "run_as", "tags")),
            "job.webhook_notifications",
            *(f"{cluster}.{k}" for k in ("aws_attributes", "autoscale", "cluster_name")),
            *(f"{cluster}.{k}" for k in ("custom_tags", "data_security_mode")),
            *(f"{cluster}.{k}" for k in ("driver_node_type_id", "enable_elastic_disk")),
            *(f"{cluster}.{k}" for k in ("node_type_id", "runtime_engine", "spark_version")),
            "tasks[bronze].description",
            "tasks[bronze].email_notifications",
            "tasks[silver].health",
            "tasks[silver].notification_settings",
            "tasks[silver].webhook_notifications",
            "tasks[gold].disable_auto_optimization",
        ]
    )
    # the Jobs API's create payload (the settings alone) reads the same, less the wrapper's fields
    create = EXPORT.with_name("create.json")
    create.write_text(json.dumps(json.loads(EXPORT.read_text())["settings"]))
    try:
        created = load_job_spec(create, ROOT)
    finally:
        create.unlink()
    assert created.tasks == job.tasks and created.job_id == "orders-batch"
    assert len(created.warnings) == len(job.warnings) - 3


def test_a_field_that_changes_behaviour_is_refused_and_a_typo_is_not_taken_for_a_field(tmp_path):
    import json

    settings = json.loads(EXPORT.read_text())["settings"]
    settings["libraries"] = [{"pypi": {"package": "requests"}}]
    settings["tasks"][0]["libraries"] = [{"pypi": {"package": "requests"}}]
    settings["tasks"][1]["existing_cluster_id"] = "0923-164208-meows279"
    settings["tasks"][2] = {"task_key": "report", "sql_task": {"warehouse_id": "w"}}
    settings["tasks"][0]["max_retry"] = 3
    settings["continuous"] = {"pause_status": "UNPAUSED"}
    with pytest.raises(InvalidJobSpecError) as e:
        load_job_spec(_write(tmp_path, settings, "create.yaml"), ROOT)
    problems = str(e.value).splitlines()[1:]
    assert problems == [
        "  - job.continuous: give the tasks continuous queries instead "
        "(conf/jobs/orders_continuous.yaml)",
        "  - job.libraries: not a field of the Jobs API's JobSettings",
        "  - tasks[bronze].libraries: a job installs no libraries here: add them to the project's "
        "environment",
        "  - tasks[bronze].max_retry: not a field of the Jobs API's Task; did you mean "
        "'max_retries'?",
        "  - tasks[silver].existing_cluster_id: '0923-164208-meows279' is neither a cluster of "
        "the configuration's jobs.clusters nor a Spark master URL (spark://host:7077, local[N], "
        "yarn, k8s://...)",
        "  - tasks[report].sql_task: sql_task is not run here (docs/operations.md lists the task "
        "types that are)",
    ]


def test_dynamic_references_are_filled_as_databricks_fills_them():
    from datetime import UTC, datetime

    from pipelines.config import load_config
    from pipelines.orchestration.runner import JobRunner

    job = load_job_spec(EXPORT, ROOT)
    runner = JobRunner(load_config("test"), job, parameters={"env": "test"})
    cmd, _ = runner._command(job.tasks[2], attempt=1)
    run, day = runner.run_id, datetime.fromtimestamp(runner.run_id / 1000, UTC).date()
    assert cmd[-7:] == [
        "--env",
        "test",
        "--once",
        "--tag",
        f"911284736120345/{run}/{run * 1000 + 2}/2",
        "--day",
        day.isoformat(),
    ]


def test_a_cluster_id_or_key_runs_on_the_master_and_settings_the_configuration_gives_it(tmp_path):
    """jobs.clusters maps an existing_cluster_id or a job_cluster_key to a master and Spark
    settings; the spec's own spark_conf wins over them, --master over every master."""
    import json

    from pipelines.config import load_config
    from pipelines.orchestration.runner import spark_submit_command

    settings = json.loads(EXPORT.read_text())["settings"]
    settings["tasks"][1]["existing_cluster_id"] = "0923-164208-meows279"
    path = _write(tmp_path, settings, "create.yaml")
    conf = load_config("test").updated(
        {
            "jobs.clusters": {
                "0923-164208-meows279": {
                    "master": "spark://prod:7077",
                    "spark_conf": {"spark.executor.memory": "8g"},
                },
                settings["tasks"][0]["job_cluster_key"]: {"spark_conf": {"spark.x.Y": "1"}},
            }
        }
    )
    job = load_job_spec(path, ROOT, clusters=conf.jobs.clusters)
    by_key = {t.key: t for t in job.tasks}

    def submitted(key: str, master: str | None = None) -> tuple[str, set[str]]:
        cmd = spark_submit_command(conf, by_key[key], [], master)
        return cmd[cmd.index("--master") + 1], {
            cmd[i + 1] for i, a in enumerate(cmd) if a == "--conf"
        }

    master, confs = submitted("silver")
    assert master == "spark://prod:7077" and "spark.executor.memory=8g" in confs
    assert submitted("silver", "local[1]")[0] == "local[1]"
    master, confs = submitted("bronze")  # its job cluster: the mapped settings, the env's master
    assert master == conf.spark.master and "spark.x.Y=1" in confs
    assert not any(c.startswith("spark.executor.memory=") for c in confs)


BUNDLE = ROOT / "tests" / "databricks" / "bundle" / "databricks.yml"


def test_a_bundles_job_is_read_with_its_includes_target_and_variables(monkeypatch):
    """A job of a bundle: from an included file, its paths from the file holding them (or the
    bundle root), variables from defaults, the target, BUNDLE_VAR_ and --var; the production
    target's task merged into the job's by task_key; the bundle's permissions warned about."""
    from pipelines.orchestration.bundle import BundleChoice

    monkeypatch.delenv("BUNDLE_VAR_env", raising=False)
    dev = load_job_spec(BUNDLE, bundle=BundleChoice(job="orders_ingest"))
    assert dev.name == "orders-ingest-dev"
    assert [(t.key, t.python_file, t.parameters, t.max_retries) for t in dev.tasks] == [
        ("bronze", ROOT / "pipelines/jobs/bronze_job.py", ("--env", "local", "--once"), 0),
        ("silver", ROOT / "pipelines/jobs/silver_job.py", ("--env", "local", "--once"), 0),
    ]
    assert any("permissions: a bundle field with no effect here" in w for w in dev.warnings)
    prod = load_job_spec(BUNDLE, bundle=BundleChoice(job="orders_ingest", target="prod"))
    silver = prod.tasks[1]
    assert (silver.parameters, silver.max_retries, silver.depends_on) == (
        ("--env", "test", "--once", "--quiet"),
        3,
        ("bronze",),
    )
    monkeypatch.setenv("BUNDLE_VAR_env", "from-env")
    assert load_job_spec(BUNDLE, bundle=BundleChoice("orders_ingest")).tasks[0].parameters[1] == (
        "from-env"
    )
    chosen = BundleChoice("orders_ingest", variables={"env": "from-var"})
    assert load_job_spec(BUNDLE, bundle=chosen).tasks[0].parameters[1] == "from-var"


def test_a_bundle_says_which_job_target_or_variable_is_missing():
    from pipelines.orchestration.bundle import BundleChoice

    with pytest.raises(InvalidJobSpecError) as e:
        load_job_spec(BUNDLE)
    assert str(e.value).splitlines()[1:] == [
        "  - name one of its jobs with --job (jobs: orders_ingest, report)"
    ]
    with pytest.raises(InvalidJobSpecError) as e:
        load_job_spec(BUNDLE, bundle=BundleChoice("report", target="staging"))
    assert str(e.value).splitlines()[1:] == [
        "  - no target 'staging' (targets: dev, prod)",
        "  - variable 'warehouse_id' has no value: give it a default, --var warehouse_id=VALUE "
        "or BUNDLE_VAR_warehouse_id",
    ]
