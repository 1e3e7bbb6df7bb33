"""A driver starts from the class-data archive that `lakehouse setup` dumped."""

from __future__ import annotations

import subprocess

import pytest

from pipelines.local import cds
from pipelines.local.jars import SPARK_FOLDER, home, java_executable
from tests import helpers
from tests.conftest import subprocess_env

pytestmark = pytest.mark.integration
SUBMIT = "org.apache.spark.deploy.SparkSubmit"


def _source_of_submit(classpath: str, *options: str) -> str:
    """Where a JVM with the driver's classpath (and `options`) loads Spark's SparkSubmit from."""
    cmd = [java_executable(), *options, "-Xlog:class+load=info", "-cp", classpath, SUBMIT]
    out = subprocess.run([*cmd, "--version"], capture_output=True, text=True, check=True).stdout
    return next(line for line in out.splitlines() if f"] {SUBMIT} source:" in line).split(
        "source: "
    )[1]


def test_the_driver_runs_with_the_archive_and_its_classes_come_from_it(spark):
    jvm = spark.sparkContext._jvm
    arguments = list(
        jvm.java.lang.management.ManagementFactory.getRuntimeMXBean().getInputArguments()
    )
    archive = cds.archive()
    assert f"-XX:SharedArchiveFile={archive}" in arguments
    classpath = jvm.java.lang.System.getProperty("java.class.path")
    # the same JVM options, the same classpath: Spark's classes are mapped in from the archive
    assert _source_of_submit(classpath, f"-XX:SharedArchiveFile={archive}", cds.QUIET) == (
        "shared objects file (top)"
    )
    assert _source_of_submit(classpath).startswith("file:")  # without it: read from the jar


def test_the_driver_collects_with_the_parallel_collector(spark):
    jvm = spark.sparkContext._jvm
    beans = jvm.java.lang.management.ManagementFactory.getGarbageCollectorMXBeans()
    assert sorted(b.getName() for b in beans) == ["PS MarkSweep", "PS Scavenge"]


def test_no_driver_start_rewrites_the_jars(spark, lake):
    """A driver start reads the jar set; resolving it again would delete the jars under the
    drivers running beside it (as one build of the archive's key once did, in every driver)."""
    jars = sorted((home() / "jars" / SPARK_FOLDER).glob("*.jar"))
    before = {j: j.stat().st_mtime_ns for j in jars}
    started = helpers.run_module("pipelines.jobs.setup_job", subprocess_env(lake), "--env", "test")
    assert started.returncode == 0, started.stderr[-3000:]
    assert {j: j.stat().st_mtime_ns for j in jars if j.exists()} == before
