"""The project's log lines: text or JSON, each with its job run, task, query and batch, and never
a secret of the environment."""

from __future__ import annotations

import json
import logging

import pytest

from pipelines import errors, logs
from pipelines.config import load_config


@pytest.fixture
def configured(monkeypatch, capsys):
    """Configure the logs as an entry point does; restore the root logger's handlers after."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    monkeypatch.setattr(errors, "report", errors.report)

    def configure(**values):
        logs.configure(load_config("local").updated(values))
        capsys.readouterr()  # what came before

    yield configure
    root.handlers[:] = handlers
    root.setLevel(level)
    logging.getLogger(logs.ROOT).setLevel(logging.NOTSET)


def test_json_lines_name_the_run_task_query_and_batch_and_mask_secrets(
    configured, monkeypatch, capsys
):
    monkeypatch.setenv("LAKEHOUSE_JOB_RUN_ID", "42")
    monkeypatch.setenv("LAKEHOUSE_TASK_KEY", "bronze")
    monkeypatch.setenv("LAKEHOUSE_KAFKA_SASL_PASSWORD", "s3cret-pass")
    configured(**{"log.format": "json", "log.level": "DEBUG"})
    log = logs.get("bronze")
    log.debug("planning")
    with logs.batch_context("q-1", 7):
        log.warning("connecting with %s", "sasl.jaas.config=... password='s3cret-pass';")
    lines = [json.loads(line) for line in capsys.readouterr().err.splitlines()]
    assert [{k: v for k, v in line.items() if k != "ts"} for line in lines] == [
        {"level": "DEBUG", "logger": "lakehouse.bronze", "msg": "planning", "run_id": "42",
         "task": "bronze"},
        {"level": "WARNING", "logger": "lakehouse.bronze",
         "msg": "connecting with sasl.jaas.config=... password='***';", "run_id": "42",
         "task": "bronze", "query_id": "q-1", "batch_id": 7},
    ]  # fmt: skip
    assert all(line["ts"].endswith("Z") for line in lines)


def test_text_lines_at_the_configured_level_and_the_last_error_in_the_same_form(configured, capsys):
    configured(**{"log.level": "WARN"})
    logs.get("silver").info("not shown")
    logs.get("silver").warning("shown")
    errors.report("error: the end")
    err = capsys.readouterr().err.splitlines()
    assert [line.split(" ", 1)[1] for line in err[:1]] == ["WARNING lakehouse.silver: shown"]
    assert err[1:] == ["error: the end"]
    configured(**{"log.format": "json"})
    configured(**{"log.format": "json"})  # again: still one handler
    errors.report("error: the end")
    [line] = capsys.readouterr().err.splitlines()
    assert (json.loads(line)["level"], json.loads(line)["msg"]) == ("ERROR", "error: the end")


def test_no_print_outside_the_command_lines_own_output():
    """Every message goes through logging; `print` is only a command's own output (the CLI, the
    services' start/stop lines, the demo's summary) and the last error line's fallback."""
    import ast

    from pipelines.config import REPO_ROOT

    allowed = {
        "pipelines/cli.py",
        "pipelines/reference/demo.py",
        "pipelines/local/cds.py",
        "pipelines/local/jars.py",
        "pipelines/local/cluster.py",
        "pipelines/local/broker.py",
        "pipelines/local/s3.py",
        "pipelines/local/history.py",
        "pipelines/local/metastore.py",
        "pipelines/errors.py",
        "pipelines/logs.py",
        "pipelines/jobs/notebook_task.py",  # its lines are the notebook task's log
    }
    printing = set()
    for package in ("pipelines", "bronze", "silver", "gold"):
        for file in (REPO_ROOT / package).rglob("*.py"):
            tree = ast.parse(file.read_text())
            names = [n for n in ast.walk(tree) if isinstance(n, ast.Name)]
            if any(n.id == "print" for n in names):  # called, or passed on as `say`
                printing.add(file.relative_to(REPO_ROOT).as_posix())
    assert printing <= allowed, sorted(printing - allowed)
