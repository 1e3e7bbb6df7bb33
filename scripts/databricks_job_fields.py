"""Write pipelines/resources/databricks_job_fields.json: the fields of the Jobs API objects a job
spec holds, from the Databricks SDK's models (`uv pip install databricks-sdk==0.162.0`), so that a real
field is never taken for a typo. Run it after upgrading the SDK; tests/unit/test_jobs_spec.py
checks that every field the spec reader names is one of them.

Usage: .venv/bin/python scripts/databricks_job_fields.py
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

OUT = Path(__file__).resolve().parent.parent / "pipelines/resources/databricks_job_fields.json"


def fields() -> dict:
    from databricks.sdk.service import compute, jobs
    from databricks.sdk.version import __version__

    objects = {
        "Job": jobs.Job,
        "JobSettings": jobs.JobSettings,
        "Task": jobs.Task,
        "TaskDependency": jobs.TaskDependency,
        "SparkPythonTask": jobs.SparkPythonTask,
        "SparkSubmitTask": jobs.SparkSubmitTask,
        "PythonWheelTask": jobs.PythonWheelTask,
        "NotebookTask": jobs.NotebookTask,
        "ConditionTask": jobs.ConditionTask,
        "RunJobTask": jobs.RunJobTask,
        "JobCluster": jobs.JobCluster,
        "ClusterSpec": compute.ClusterSpec,
        "CronSchedule": jobs.CronSchedule,
        "JobParameterDefinition": jobs.JobParameterDefinition,
    }
    named = {name: sorted(f.name for f in dataclasses.fields(c)) for name, c in objects.items()}
    return {"databricks-sdk": __version__, "objects": named}


if __name__ == "__main__":
    OUT.write_text(json.dumps(fields(), indent=1) + "\n")
    print(f"wrote {OUT}")
