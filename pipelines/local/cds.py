"""A class-data-sharing (CDS) archive of a Spark driver's classes, so that drivers start sooner.

`lakehouse setup` dumps the classes a driver loads once per JDK, pyspark and jar set (a warm-up
driver, `pipelines/jobs/warm_up.py`, run with `-XX:ArchiveClassesAtExit`); a driver maps them in
when the archive exists, and a JVM that cannot use it starts as without it. Why:
docs/development.md, "The set-up"; the time saved: bench/RESULTS.md, "Figures behind code choices".
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
from pathlib import Path

from pipelines.local.jars import (
    CHECKSUMS,
    PYSPARK_JARS,
    home,
    java_executable,
    java_sources_digest,
    spark_jars,
)
from pipelines.spark_conf import LOG4J2, LOG4J2_JSON

WARM_UP = Path(__file__).resolve().parent.parent / "jobs" / "warm_up.py"
# The JVM's messages about the archive (one it cannot use, classes it cannot archive) are noise:
# the archive is only ever a speed-up.
QUIET = "-Xlog:cds*=off"


def archive() -> Path:
    """Where the archive of this JDK, pyspark and jar set is (or would be)."""
    java = Path(java_executable()).resolve()
    release = java.parent.parent / "release"
    key = [str(java), release.read_text() if release.is_file() else "", str(PYSPARK_JARS)]
    key += [str(PYSPARK_JARS.stat().st_mtime_ns), WARM_UP.read_text()]
    # the jar set, as recorded (never by listing or resolving the jars: a driver starts here)
    key += [CHECKSUMS.read_text(), java_sources_digest()]
    digest = hashlib.sha256("\n".join(key).encode()).hexdigest()[:16]
    return home() / "cds" / f"spark-driver-{digest}.jsa"


def archive_java_options() -> str:
    """The JVM options that start a JVM with Spark's classpath from the archive ("" if there is
    none, or LAKEHOUSE_CDS=0)."""
    if os.environ.get("LAKEHOUSE_CDS", "1") != "0" and (jsa := archive()).is_file():
        return f"-XX:SharedArchiveFile={jsa} {QUIET}"
    return ""


# A driver's work is throughput: batches of plans and tasks, none waiting on a pause of a few
# milliseconds. The parallel collector spends no thread on concurrent marking, which G1 (the JVM's
# default) does on the same cores: half the collector CPU of G1 on a pipeline drain
# (bench/RESULTS.md, "Figures behind code choices").
GC = "-XX:+UseParallelGC"


def collector() -> str:
    """The driver's collector option: the parallel one, unless JDK_JAVA_OPTIONS or
    JAVA_TOOL_OPTIONS choose one (the JVM refuses to start with two)."""
    chosen = " ".join(os.environ.get(v, "") for v in ("JDK_JAVA_OPTIONS", "JAVA_TOOL_OPTIONS"))
    return "" if re.search(r"-XX:\+Use\w+GC\b", chosen) else GC


def driver_java_options(*, json_logs: bool = False) -> str:
    """The driver JVM's options: its collector, the log4j2 configuration (in JSON with
    `json_logs`), and the archive if it exists."""
    options = f"{collector()} -Dlog4j2.configurationFile=file:{LOG4J2}".strip()
    if json_logs:
        options += f" -Dlakehouse.log.appender=json -Dlakehouse.log.template=file:{LOG4J2_JSON}"
    return f"{options} {archive_java_options()}".strip()


def create(*, quiet: bool = False) -> Path | None:
    """Dump the archive by running the warm-up driver once, unless it exists. Returns it, or
    None when the dump failed (the drivers then start without one: slower, not broken)."""
    target = archive()
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    log = target.with_suffix(".log")
    submit = str(Path(sys.executable).with_name("spark-submit"))
    # C1 alone: the archive holds classes, not compiled code (a third less CPU to dump it)
    options = f"-XX:ArchiveClassesAtExit={partial} -XX:TieredStopAtLevel=1 {QUIET}"
    options += f" -Dlog4j2.configurationFile=file:{LOG4J2}"
    cmd = [submit, "--master", "local[2]", "--driver-java-options", options]
    cmd += ["--jars", ",".join(str(j) for j in spark_jars()), str(WARM_UP)]
    if not quiet:
        print(f"setup: dumping the Spark driver's classes into {target} (once, about a minute)")
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    env.pop("JAVA_TOOL_OPTIONS", None)
    with log.open("w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env).returncode
    if code != 0 or not partial.is_file():
        partial.unlink(missing_ok=True)
        print(f"setup: no class-data archive (exit code {code}; log: {log})", file=sys.stderr)
        return None
    partial.replace(target)
    for stale in target.parent.glob("spark-driver-*"):
        if stale.stem != target.stem:
            stale.unlink(missing_ok=True)
    return target
