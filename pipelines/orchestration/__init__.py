"""Databricks-style multi-task jobs: specs and the runner that starts each task as spark-submit.
Never starts a JVM of its own."""
