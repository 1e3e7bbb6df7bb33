"""A job of a Databricks Asset Bundle (`databricks.yml`), as `databricks bundle run` would see it:
its `include` files read, the target's overrides merged, `${...}` references filled, and each
relative path taken from the file that holds it (docs/operations.md, "A job from a bundle").
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

REFERENCE = re.compile(r"\$\{([\w.-]+)\}")
# task fields holding a path that a bundle takes from the file it is written in
PATHS = {"spark_python_task": "python_file", "notebook_task": "notebook_path"}
MERGED_BY = {"tasks": "task_key", "job_clusters": "job_cluster_key", "parameters": "name"}


@dataclass(frozen=True)
class BundleChoice:
    """Which job of a bundle, for which target, with which variables (`--var NAME=VALUE`)."""

    job: str | None = None
    target: str | None = None
    variables: Mapping[str, str] = field(default_factory=dict)


def is_bundle(data: Mapping[str, Any]) -> bool:
    return isinstance(data.get("bundle"), dict)


def _read(path: Path) -> dict:
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping at the top level")
    return data


def _jobs(data: Mapping[str, Any], folder: Path) -> dict[str, dict]:
    """The jobs of one file's `resources`, their tasks' relative paths made absolute from `folder`."""
    jobs = ((data.get("resources") or {}).get("jobs")) or {}
    for settings in jobs.values():
        for task in (settings or {}).get("tasks") or []:
            for kind, key in PATHS.items():
                spec = task.get(kind) if isinstance(task, dict) else None
                path = spec.get(key) if isinstance(spec, dict) else None
                if isinstance(spec, dict) and isinstance(path, str) and path[:2] not in ("${", "/"):
                    spec[key] = str(folder / path)
    return {str(k): v or {} for k, v in jobs.items()}


def merged(base: Any, over: Any, key: str | None = None) -> Any:
    """`over` on `base` as a target overrides a bundle: mappings key by key, the lists of tasks,
    job clusters and parameters item by item by their key, anything else replaced."""
    if isinstance(base, dict) and isinstance(over, dict):
        return {k: merged(base.get(k), v, k) for k, v in over.items()} | {
            k: v for k, v in base.items() if k not in over
        }
    by = MERGED_BY.get(key or "")
    if by and isinstance(base, list) and isinstance(over, list):
        if all(isinstance(i, dict) for i in base + over):  # a task's parameters are strings
            items = {i.get(by): i for i in base}
            items |= {i.get(by): merged(items.get(i.get(by)), i) for i in over}
            return list(items.values())
    return over


def _filled(value: Any, fill: Callable[[str], object]) -> Any:
    """`value` with its references filled; a string that is one reference takes its value's type."""
    if isinstance(value, str):
        if whole := REFERENCE.fullmatch(value):
            return fill(whole.group(1))
        return REFERENCE.sub(lambda m: str(fill(m.group(1))), value)
    if isinstance(value, list):
        return [_filled(v, fill) for v in value]
    if isinstance(value, dict):
        return {k: _filled(v, fill) for k, v in value.items()}
    return value


def bundle_job(
    source: Path, data: dict, choice: BundleChoice, problems: list[str], warnings: list[str]
) -> dict:
    """The settings of the chosen job of the bundle `source` (its data: `data`), as a Jobs API
    create payload; what stops it is added to `problems`, what has no effect to `warnings`."""
    root = source.resolve().parent
    jobs = _jobs(data, root)
    for pattern in data.get("include") or []:
        for path in sorted(root.glob(str(pattern))):
            try:
                included = _read(path)
            except (ValueError, yaml.YAMLError) as e:
                problems.append(f"include {path}: {e}")
                continue
            for key, settings in _jobs(included, path.parent).items():
                if key in jobs:
                    problems.append(f"job {key!r} defined twice ({path})")
                jobs[key] = settings
    targets = data.get("targets") or {}
    name = choice.target or next((n for n, t in targets.items() if (t or {}).get("default")), None)
    if name is not None and name not in targets:
        problems.append(f"no target {name!r} (targets: {', '.join(targets)})")
    target = targets.get(name) or {}
    for key, settings in _jobs(target, root).items():
        jobs[key] = merged(jobs.get(key, {}), settings)
    chosen = choice.job or (next(iter(jobs)) if len(jobs) == 1 else None)
    if chosen not in jobs:
        listed = ", ".join(jobs) or "none"
        problems.append(f"name one of its jobs with --job (jobs: {listed})")
        return {}
    declared = {k: (v or {}).get("default") for k, v in (data.get("variables") or {}).items()}
    values = {**declared, **(target.get("variables") or {})}
    values |= {
        k: os.environ[f"BUNDLE_VAR_{k}"] for k in declared if f"BUNDLE_VAR_{k}" in os.environ
    }
    values |= dict(choice.variables)
    known = {"bundle.name": str(data["bundle"].get("name", "")), "bundle.target": str(name or "")}
    known |= {"workspace.file_path": str(root), "workspace.root_path": str(root)}

    def fill(ref: str) -> object:
        name = ref.removeprefix("var.")
        if name != ref and values.get(name) is not None:
            return values[name]
        if ref in known:
            return known[ref]
        problems.append(
            f"variable {name!r} has no value: give it a default, --var "
            f"{name}=VALUE or BUNDLE_VAR_{name}"
            if name != ref
            else f"${{{ref}}} is not filled here"
        )
        return ""

    settings = _filled(jobs[chosen], fill)
    if settings.pop("permissions", None) is not None:
        warnings.append(f"resources.jobs.{chosen}.permissions: a bundle field with no effect here")
    return settings
