"""A wheel's entry point (a module on the task's path stands for the installed wheel)."""

import sys

from pipelines import task_values


def main() -> None:
    task_values.set("argv", sys.argv[1:])
