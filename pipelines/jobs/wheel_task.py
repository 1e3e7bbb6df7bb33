"""A python_wheel_task: the entry point `ENTRY_POINT` of the installed package `PACKAGE` (one of
its metadata's entry points, else the function ENTRY_POINT of the module PACKAGE), called with the task's
parameters as its command line, as Databricks runs one.

Usage: spark-submit ... pipelines/jobs/wheel_task.py PACKAGE ENTRY_POINT [ARG ...]
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from importlib import import_module
from importlib.metadata import PackageNotFoundError, distribution


def entry_point(package: str, name: str) -> Callable[[], object]:
    try:
        for ep in distribution(package).entry_points:
            if ep.name == name:
                return ep.load()
    except PackageNotFoundError:
        pass  # not a distribution: a module of that name, as Databricks falls back to
    try:
        function = getattr(import_module(package.replace("-", "_")), name, None)
    except ImportError:
        raise SystemExit(f"error: package {package!r} is not installed") from None
    if not callable(function):
        raise SystemExit(f"error: package {package!r} has no entry point {name!r}")
    return function


def main() -> int:
    package, name, *args = sys.argv[1:]
    function = entry_point(package, name)
    sys.argv = [name, *args]
    result = function()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
