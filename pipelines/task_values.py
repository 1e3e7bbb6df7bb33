"""Task values: what a task of a job run hands the tasks after it, as Databricks's
`dbutils.jobs.taskValues`. A task sets one; a later task reads it with `get` or through
`{{tasks.<task_key>.values.<key>}}` in its parameters (docs/operations.md, "Task types and task values").

    from pipelines import task_values
    task_values.set("rows", 1234)
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

DIR = "LAKEHOUSE_TASK_VALUES_DIR"  # set by the job runner: the run's folder
TASK = "LAKEHOUSE_TASK_KEY"


def values_file(folder: str | Path, task_key: str) -> Path:
    return Path(folder) / f"{task_key}.values.json"


def read(folder: str | Path, task_key: str) -> dict[str, Any]:
    """Every value the task `task_key` of the run set ({} if none)."""
    path = values_file(folder, task_key)
    return json.loads(path.read_text()) if path.is_file() else {}


def set(key: str, value: Any) -> None:  # noqa: A001 (Databricks's name)
    """Set a value of this task (JSON-serialisable) for the tasks after it; outside a job run,
    nothing to set it for: a no-op, as `dbutils` without a job."""
    if not (folder := os.environ.get(DIR)) or not (task := os.environ.get(TASK)):
        return
    values = read(folder, task) | {key: json.loads(json.dumps(value))}
    partial = values_file(folder, f".{task}")
    partial.write_text(json.dumps(values))
    partial.replace(values_file(folder, task))


def get(task_key: str, key: str, default: Any = None) -> Any:
    """The value `key` that task `task_key` of this run set, else `default`."""
    folder = os.environ.get(DIR)
    return read(folder, task_key).get(key, default) if folder else default
