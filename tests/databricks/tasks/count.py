"""A task that counts and hands the count to the tasks after it."""

import sys

from pipelines import task_values

task_values.set("rows", int(sys.argv[1]))
task_values.set("label", "big batch")
