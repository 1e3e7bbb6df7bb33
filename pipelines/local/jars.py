"""JVM jars from Maven Central, resolved once with the Apache Ivy that pyspark ships, then cached.

Two sets:
- Spark's extras (Delta Lake, Spark's Kafka source and their dependencies), minus every jar that
  pyspark already ships, so no second copy of a library lands on the classpath;
- the Apache Kafka broker and its tools, run by `lakehouse kafka start`.

`LAKEHOUSE_MAVEN_REPO` points the resolver at another Maven repository (a mirror or a proxy).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pyspark

from pipelines.config import REPO_ROOT
from pipelines.errors import UnreachableError

DELTA_VERSION = "4.4.0"
SPARK_VERSION = pyspark.__version__
SCALA = "2.13"
SPARK_PACKAGES = (
    f"io.delta:delta-spark_{'.'.join(SPARK_VERSION.split('.')[:2])}_{SCALA}:{DELTA_VERSION}",
    f"org.apache.spark:spark-sql-kafka-0-10_{SCALA}:{SPARK_VERSION}",
)
DEFAULT_REPO = "https://repo1.maven.org/maven2/"


class JarResolutionError(UnreachableError):
    """Ivy could not fetch a jar; the message names the artifact and the repository."""


def home() -> Path:
    return Path(os.environ.get("LAKEHOUSE_HOME", REPO_ROOT / ".lakehouse"))


def java_executable() -> str:
    """The `java` to run: $JAVA_HOME/bin/java, else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if not java:
        raise JarResolutionError(
            "Java was not found: install Java 17 (e.g. `apt-get install openjdk-17-jre-headless`) "
            "or set JAVA_HOME"
        )
    return java


def _pyspark_jars() -> Path:
    return Path(pyspark.__file__).parent / "jars"


def _ivy_jar() -> Path:
    found = sorted(_pyspark_jars().glob("ivy-*.jar"))
    if not found:
        raise JarResolutionError(f"pyspark ships no Apache Ivy jar in {_pyspark_jars()}")
    return found[-1]


def _artifact_name(jar: str) -> str:
    """`jackson-core-2.13.5.jar` -> `jackson-core`; `org.x__name-1.2.jar` -> `name`."""
    name = jar.split("__", 1)[-1]
    return re.sub(r"-\d[\w.\-]*\.jar$", "", name)


def _resolve(
    module: str, dependencies: list[tuple[str, str, str]], target: Path, excludes: list[str]
) -> list[Path]:
    marker = target.parent / f".{target.name}.resolved"
    wanted = "\n".join(":".join(d) for d in dependencies)
    if marker.exists() and marker.read_text() == wanted:
        return sorted(target.glob("*.jar"))
    target.mkdir(parents=True, exist_ok=True)
    repo = os.environ.get("LAKEHOUSE_MAVEN_REPO", DEFAULT_REPO)
    work = target.parent / f".{target.name}.ivy"
    work.mkdir(exist_ok=True)
    deps = "\n".join(
        f'    <dependency org="{o}" name="{n}" rev="{r}" conf="default->default"/>'
        for o, n, r in dependencies
    )
    (work / "ivy.xml").write_text(
        f"""<ivy-module version="2.0">
  <info organisation="lakehouse" module="{module}"/>
  <dependencies>
{deps}
{chr(10).join(excludes)}
  </dependencies>
</ivy-module>
"""
    )
    (work / "ivysettings.xml").write_text(
        f"""<ivysettings>
  <settings defaultResolver="central"/>
  <resolvers>
    <ibiblio name="central" m2compatible="true" root="{repo}"/>
  </resolvers>
</ivysettings>
"""
    )
    cache = Path(os.environ.get("LAKEHOUSE_IVY_CACHE", Path.home() / ".cache/lakehouse/ivy"))
    for old in target.glob("*.jar"):
        old.unlink()
    cmd = [
        java_executable(), "-jar", str(_ivy_jar()),
        "-settings", str(work / "ivysettings.xml"),
        "-cache", str(cache),
        "-ivy", str(work / "ivy.xml"),
        "-confs", "default",
        "-retrieve", str(target / "[organisation]__[artifact]-[revision](-[classifier]).[ext]"),
        "-sync",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    (work / "resolve.log").write_text(log)
    unresolved = re.findall(r"::\s+(\S+#\S+;\S+): (not found|.*)", log)
    if proc.returncode != 0 or unresolved:
        what = ", ".join(u[0] for u in unresolved) or "see the log"
        raise JarResolutionError(
            f"could not fetch {what} from {repo} (log: {work / 'resolve.log'}); "
            "set LAKEHOUSE_MAVEN_REPO to a reachable Maven repository"
        )
    marker.write_text(wanted)
    return sorted(target.glob("*.jar"))


def spark_jars() -> list[Path]:
    """Delta and the Kafka source with their dependencies, minus what pyspark already has."""
    target = home() / "jars" / f"spark-{SPARK_VERSION}-delta-{DELTA_VERSION}"
    deps = [tuple(p.split(":")) for p in SPARK_PACKAGES]
    excludes = [
        '    <exclude org="org.apache.spark" module="spark-core_2.13"/>',
        '    <exclude org="org.apache.spark" module="spark-sql_2.13"/>',
        '    <exclude org="org.apache.spark" module="spark-catalyst_2.13"/>',
        '    <exclude org="org.scala-lang"/>',
        '    <exclude org="org.slf4j"/>',
        '    <exclude org="org.apache.hadoop"/>',
    ]
    jars = _resolve("spark-extras", deps, target, excludes)  # type: ignore[arg-type]
    shipped = {_artifact_name(j.name) for j in _pyspark_jars().glob("*.jar")}
    return [j for j in jars if _artifact_name(j.name) not in shipped]


def kafka_jars(version: str) -> Path:
    """A folder with the Kafka broker and its tools (ConsumerPerformance among them)."""
    target = home() / "jars" / f"kafka-{version}"
    deps = [
        ("org.apache.kafka", "kafka_2.13", version),
        ("org.apache.kafka", "kafka-tools", version),
        ("org.apache.logging.log4j", "log4j-slf4j-impl", "2.25.4"),
    ]
    _resolve(f"kafka-{version}", deps, target, [])
    return target


def main() -> None:
    """Fetch everything up front (used by the set-up script)."""
    jars = spark_jars()
    print(f"spark extras: {len(jars)} jars in {jars[0].parent}")
    from pipelines.config import LocalBrokerConf

    folder = kafka_jars(LocalBrokerConf().version)
    print(f"kafka broker: {len(list(folder.glob('*.jar')))} jars in {folder}")


if __name__ == "__main__":
    main()
