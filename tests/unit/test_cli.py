"""The `lakehouse` command line: options anywhere, one readable error line, an exit code per kind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from pipelines import cli
from pipelines.errors import ExitCode
from pipelines.orchestration import runner

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def conf_dir(tmp_path: Path) -> Path:
    """A configuration folder with a good environment (`mine`) and one with a typo (`bad`)."""
    (tmp_path / "mine.yaml").write_text(f"storage:\n  root: {tmp_path / 'lake'}\n")
    (tmp_path / "bad.yaml").write_text("kafka:\n  bootstrap_server: 127.0.0.1:9092\n")
    return tmp_path


def lakehouse(*args: str, **env: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LAKEHOUSE")}
    return subprocess.run(
        [sys.executable, "-m", "pipelines.cli", *args],
        capture_output=True,
        text=True,
        env={**clean, **env},
        cwd=ROOT,
        timeout=60,
    )


@pytest.mark.parametrize(
    "args",
    [
        ["--env", "mine", "config"],
        ["config", "--env", "mine"],
        ["--env", "local", "config", "--env", "mine"],  # after the command wins
    ],
)
def test_env_is_taken_before_or_after_the_command(conf_dir, args):
    result = lakehouse(*args, LAKEHOUSE_CONF_DIR=str(conf_dir))
    assert result.returncode == ExitCode.OK, result.stderr
    conf = json.loads(result.stdout)
    assert (conf["env"], conf["storage"]["root"]) == ("mine", str(conf_dir / "lake"))


def test_log_level_sets_spark_log_level_for_the_command(conf_dir):
    result = lakehouse(
        "--env", "mine", "config", "--log-level", "debug", LAKEHOUSE_CONF_DIR=str(conf_dir)
    )
    assert json.loads(result.stdout)["spark"]["log_level"] == "DEBUG", result.stderr


def test_show_origin_names_the_file_the_variable_or_the_default_of_each_value(conf_dir):
    result = lakehouse(
        "--env",
        "mine",
        "config",
        "--show-origin",
        LAKEHOUSE_CONF_DIR=str(conf_dir),
        LAKEHOUSE__SPARK__UI="true",
    )
    assert result.returncode == ExitCode.OK, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == f"# environment mine: {conf_dir / 'mine.yaml'}"
    assert f'storage.root = "{conf_dir / "lake"}"  ({conf_dir / "mine.yaml"})' in lines
    assert "spark.ui = true  (environment variable LAKEHOUSE__SPARK__UI)" in lines
    assert "kafka.request_timeout_s = 15  (default)" in lines


def test_json_output_of_validate_status_runs_and_config(conf_dir, tmp_path):
    env = {"LAKEHOUSE_CONF_DIR": str(conf_dir)}
    spec = ROOT / "conf" / "jobs" / "orders_batch.yaml"
    shown = lakehouse("--env", "mine", "jobs", "validate", str(spec), "--json", **env)
    assert shown.returncode == ExitCode.OK, shown.stderr
    valid = json.loads(shown.stdout)
    assert (valid["valid"], valid["job"]) == (True, "orders-batch")
    assert [t["key"] for t in valid["tasks"]][:3] == ["setup", "bronze", "silver"]
    assert valid["tasks"][1]["depends_on"] == ["setup"]
    (tmp_path / "bad.yaml").write_text("name: x\n")
    bad = lakehouse(
        "--env", "mine", "jobs", "validate", str(tmp_path / "bad.yaml"), "--json", **env
    )
    assert bad.returncode == ExitCode.CONFIG
    assert json.loads(bad.stdout)["problems"] == ["job.tasks: required, a non-empty list"]
    (conf_dir / "mine.yaml").write_text(
        f"storage:\n  root: {tmp_path / 'lake'}\nlocal_broker:\n  port: 1\n"
        "kafka:\n  bootstrap_servers: 127.0.0.1:1\n"
    )
    status = lakehouse("--env", "mine", "kafka", "status", "--json", **env)
    assert status.returncode == ExitCode.UNREACHABLE
    assert json.loads(status.stdout) == {
        "service": "kafka",
        "running": False,
        "pid": None,
        "address": "127.0.0.1:1",
        "detail": "not running",
        "pids": [None],
    }
    runs = lakehouse("--env", "mine", "jobs", "runs", "--json", **env)
    assert (runs.returncode, json.loads(runs.stdout)) == (ExitCode.OK, []), runs.stderr
    config = lakehouse("--env", "mine", "config", "--json", **env)
    assert json.loads(config.stdout)["storage"]["root"] == str(tmp_path / "lake")


def test_version_prints_the_package_version():
    result = lakehouse("--version")
    assert result.returncode == ExitCode.OK
    assert result.stdout == f"lakehouse {version('streaming-lakehouse')}\n"


def test_a_bad_configuration_key_exits_3_with_one_line_naming_key_and_file(conf_dir):
    result = lakehouse("config", "--env", "bad", LAKEHOUSE_CONF_DIR=str(conf_dir))
    assert result.returncode == ExitCode.CONFIG
    [line] = result.stderr.splitlines()
    assert line.startswith("error: ") and "kafka.bootstrap_server" in line
    assert str(conf_dir / "bad.yaml") in line
    assert "Traceback" not in result.stderr and result.stdout == ""


def test_an_invalid_job_spec_exits_3_after_the_command_options(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: x\ntasks: []\n")
    result = lakehouse("jobs", "validate", str(spec), "--env", "test")
    assert result.returncode == ExitCode.CONFIG
    assert (
        result.stderr
        == f"error: job spec {spec} is invalid (1 problem):\n  - job.tasks: required, a non-empty list\n"
    )


def test_a_valid_job_spec_is_listed_with_options_anywhere():
    result = lakehouse(
        "jobs", "--log-level", "warn", "validate", "conf/jobs/orders_batch.yaml", "--env", "test"
    )
    assert result.returncode == ExitCode.OK, result.stderr
    assert "job 'orders-batch'" in result.stdout and "after bronze (ALL_SUCCESS)" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        [],
        ["nosuchcommand"],
        ["jobs", "validate"],
        ["config", "--log-level", "LOUD"],
        ["run", "platinum"],
        ["jobs", "runs", "--limit", "-1"],
        ["produce", "--orders", "0"],
    ],
)
def test_a_usage_error_exits_2(args):
    result = lakehouse(*args)
    assert result.returncode == ExitCode.USAGE
    assert "usage: lakehouse" in result.stderr and "Traceback" not in result.stderr


def test_an_unreachable_broker_exits_4_quickly_with_one_line():
    env = {"LAKEHOUSE__KAFKA__BOOTSTRAP_SERVERS": "127.0.0.1:9"}
    env["LAKEHOUSE__KAFKA__REQUEST_TIMEOUT_S"] = "2"
    result = lakehouse("produce", "--orders", "1", "--env", "test", **env)
    assert result.returncode == ExitCode.UNREACHABLE, result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("error: no Kafka broker answered at 127.0.0.1:9 within 2s")


def test_jobs_run_exits_0_when_every_task_succeeds_and_6_when_one_fails(tmp_path, monkeypatch):
    # each task as a plain Python process instead of spark-submit: no JVM in a unit test
    monkeypatch.setattr(
        runner,
        "spark_submit_command",
        lambda conf, task, params, master=None: [sys.executable, str(task.python_file), *params],
    )
    monkeypatch.setenv("LAKEHOUSE__STORAGE__ROOT", str(tmp_path / "lake"))
    script = tmp_path / "task.py"
    script.write_text("import sys\nsys.exit(int(sys.argv[1]))\n")
    for code, expected in (("0", ExitCode.OK), ("3", ExitCode.JOB_FAILED)):
        spec = tmp_path / f"spec{code}.yaml"
        spec.write_text(
            f"name: j\ntasks:\n  - task_key: t\n    spark_python_task:\n"
            f"      python_file: {script}\n      parameters: ['{code}']\n"
        )
        assert cli.main(["jobs", "run", str(spec), "--env", "test"]) == expected


def test_a_job_and_its_runner_share_one_environment():
    """The `env` a job's tasks run in is the runner's: unset, it is the runner's own; set, the
    runner takes that environment's configuration (its storage root: where it records runs)."""
    from pipelines.config import load_config

    conf = load_config("test")
    assert cli.job_environment(conf, {"env": "local"}, {}) == (conf, {"env": "test"})
    secured, params = cli.job_environment(conf, {"env": "local"}, {"env": "local-secured"})
    assert (secured.env, secured.storage.root, params) == (
        "local-secured",
        "data/local-secured",
        {"env": "local-secured"},
    )
    assert cli.job_environment(conf, {"day": "x"}, {"day": "y"}) == (conf, {"day": "y"})


def test_sql_results_print_as_spark_prints_a_table():
    text = cli.format_table(["status", "n", "ok"], [["paid", 12, True], [None, 3, False]])
    assert text.splitlines() == [
        "+------+--+-----+",
        "|status| n|   ok|",
        "+------+--+-----+",
        "|  paid|12| true|",
        "|  NULL| 3|false|",
        "+------+--+-----+",
    ]


def test_what_follows_spark_sql_is_spark_sqls_own(monkeypatch):
    seen = {}
    monkeypatch.setattr(cli, "spark_sql", lambda conf, args: seen.update(vars(args)))
    assert cli.main(["--env", "local", "spark-sql", "-e", "SHOW TABLES", "--help"]) == 0
    assert (seen["env"], seen["args"]) == ("local", ["-e", "SHOW TABLES", "--help"])


def _timed_runs(tmp_path, monkeypatch, settings: str, cron: str, seconds: float, runs: int):
    """`runs` runs of a one-task job on schedule `cron`, its task sleeping `seconds`: each run's
    (start, end) in the task's own clock, in start order, and what the scheduler said."""
    from pipelines.config import load_config
    from pipelines.orchestration.schedule import Schedule
    from pipelines.orchestration.spec import load_job_spec

    monkeypatch.setattr(
        runner,
        "spark_submit_command",
        lambda conf, task, params, master=None: [sys.executable, str(task.python_file), *params],
    )
    times = tmp_path / "times"
    script = tmp_path / "task.py"
    script.write_text(
        "import sys, time\nstart = time.time()\ntime.sleep(float(sys.argv[1]))\n"
        f"open({str(times)!r}, 'a').write(f'{{start}} {{time.time()}}\\n')\n"
    )
    spec = tmp_path / "spec.yaml"
    spec.write_text(
        f"name: j\n{settings}\ntasks:\n  - task_key: t\n    spark_python_task:\n"
        f"      python_file: {script}\n      parameters: ['{seconds}']\n"
    )
    conf = load_config("test").updated({"storage.root": str(tmp_path / "lake")})
    said: list[str] = []
    done = runner.run_on_schedule(
        conf, load_job_spec(spec), Schedule(cron), runs=runs, echo=said.append
    )
    assert [r.state for r in done] == ["SUCCESS"] * runs
    spans = sorted(tuple(map(float, line.split())) for line in times.read_text().splitlines())
    return spans, said


def test_a_schedule_runs_up_to_max_concurrent_runs_at_once_and_skips_past_them(
    tmp_path, monkeypatch
):
    """Runs of 2.5 s fired every second, two at once at most: the second starts while the first
    runs, the third fire time finds two going and is skipped, the fourth starts the third run."""
    spans, said = _timed_runs(
        tmp_path, monkeypatch, "max_concurrent_runs: 2", "* * * * * ?", 2.5, 3
    )
    (a_start, a_end), (b_start, b_end), (c_start, _) = spans
    assert b_start < a_end and c_start > a_end  # two at once, never three
    assert any("fire time skipped: 2 run(s) going (max_concurrent_runs)" in s for s in said), said


def test_a_fire_time_past_max_concurrent_runs_is_queued_and_starts_when_a_run_ends(
    tmp_path, monkeypatch
):
    """One run at a time with the queue on: a run of 4 s fired every 3 s; the second fire time
    queues a run, which starts as the first ends (~4 s), not at the next fire time (6 s)."""
    spans, said = _timed_runs(
        tmp_path, monkeypatch, "queue: {enabled: true}", "*/3 * * * * ?", 4.0, 2
    )
    (_, a_end), (b_start, _) = spans
    next_fire = (a_end // 3 + 1) * 3  # the second run starts before it, not at it
    assert a_end < b_start < next_fire, spans
    assert any("run queued: 1 run(s) going" in s for s in said), said
    assert any("a queued run starts" in s for s in said), said
