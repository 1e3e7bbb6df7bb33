"""Databricks-style multi-task jobs: specs, and a runner of spark-submit tasks; starts no JVM."""
