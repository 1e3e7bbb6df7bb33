"""JVM jars from Maven Central, resolved once with the Apache Ivy that pyspark ships, then cached.

Every retrieved jar must have the SHA-256 recorded in `pipelines/resources/jars.sha256`, whatever
repository it came from. After a deliberate version change, re-record them (and review the diff):

    python -m pipelines.local.jars --record

`LAKEHOUSE_MAVEN_REPO` points the resolver at another Maven repository (a mirror or a proxy).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyspark

from pipelines.config import REPO_ROOT, LocalBrokerConf, LocalStorageConf
from pipelines.errors import UnreachableError, exit_on_known_errors

DELTA_VERSION = "4.4.0"
SPARK_VERSION = pyspark.__version__
SCALA = "2.13"
PYSPARK_JARS = Path(pyspark.__file__).parent / "jars"
# S3A must be the Hadoop that pyspark ships (its hadoop-client-api jar), with the AWS SDK v2 that
# this Hadoop release was built and tested with (hadoop-project's aws-java-sdk-v2.version). The
# SDK comes as the few modules S3A uses (19 MB), not as the shaded `bundle` (686 MB).
AWS_SDK_VERSION = "2.35.4"


def hadoop_version() -> str:
    """The Hadoop of pyspark's own jars (called only where pyspark is installed, not zipped)."""
    api = sorted(PYSPARK_JARS.glob("hadoop-client-api-*.jar"))
    if not api:
        raise JarResolutionError(f"no hadoop-client-api jar in {PYSPARK_JARS}")
    return api[-1].name.removeprefix("hadoop-client-api-").removesuffix(".jar")


SPARK_PACKAGES = [
    ("io.delta", f"delta-spark_{'.'.join(SPARK_VERSION.split('.')[:2])}_{SCALA}", DELTA_VERSION),
    ("org.apache.spark", f"spark-sql-kafka-0-10_{SCALA}", SPARK_VERSION),
]


def s3a_packages() -> list[tuple[str, str, str]]:
    """S3A with the AWS SDK modules it uses."""
    sdk = ("s3", "sts", "s3-transfer-manager", "apache-client")
    return [
        ("org.apache.hadoop", "hadoop-aws", hadoop_version()),
        *[("software.amazon.awssdk", module, AWS_SDK_VERSION) for module in sdk],
    ]


SPARK_FOLDER = f"spark-{SPARK_VERSION}-delta-{DELTA_VERSION}"
DEFAULT_REPO = "https://repo1.maven.org/maven2/"
RESOURCES = Path(__file__).resolve().parent.parent / "resources"
CHECKSUMS = RESOURCES / "jars.sha256"
RECORD_COMMAND = "python -m pipelines.local.jars --record"
# The project's own JVM classes: the Delta log store, the session catalog and the one-pass JSON
# reader.
JAVA_SOURCES = sorted((RESOURCES / "java").rglob("*.java"))


class JarResolutionError(UnreachableError):
    """Ivy could not fetch a jar, or a jar is not the one recorded; the message names it."""


def home() -> Path:
    return Path(os.environ.get("LAKEHOUSE_HOME", REPO_ROOT / ".lakehouse"))


def java_executable() -> str:
    """The `java` to run: $JAVA_HOME/bin/java, else the one on PATH."""
    java_home = os.environ.get("JAVA_HOME")
    in_java_home = java_home and shutil.which("java", path=Path(java_home) / "bin")
    if not (java := in_java_home or shutil.which("java")):
        raise JarResolutionError(
            "Java was not found: install Java 17 (e.g. `apt-get install openjdk-17-jre-headless`) "
            "or set JAVA_HOME"
        )
    return java


def _ivy_jar() -> Path:
    if not (newest := max(PYSPARK_JARS.glob("ivy-*.jar"), default=None)):
        raise JarResolutionError(f"pyspark ships no Apache Ivy jar in {PYSPARK_JARS}")
    return newest


def _artifact_name(jar: str) -> str:
    """`jackson-core-2.13.5.jar` -> `jackson-core`; `org.x__name-1.2.jar` -> `name`."""
    return re.sub(r"-\d[\w.\-]*\.jar$", "", jar.split("__", 1)[-1])


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _recorded(folder: str) -> dict[str, str]:
    """`folder/name.jar` -> SHA-256 for one folder's jars, as committed in jars.sha256."""
    lines = CHECKSUMS.read_text().splitlines() if CHECKSUMS.exists() else []
    pairs = (line.split() for line in lines if line.strip() and not line.startswith("#"))
    return {name: digest for digest, name in pairs if name.split("/")[0] == folder}


def _verify(target: Path, expected: dict[str, str]) -> None:
    """Every jar in `target` has its recorded SHA-256; none is missing, none is unexpected."""
    actual = {f"{target.name}/{j.name}": _sha256(j) for j in target.glob("*.jar")}
    wrong = [
        f"  {name}: expected {expected.get(name, 'no jar (not recorded)')}, "
        f"got {actual.get(name, 'no jar (missing)')}"
        for name in sorted(expected.keys() | actual.keys())
        if expected.get(name) != actual.get(name)
    ]
    if wrong:
        raise JarResolutionError(
            f"{len(wrong)} jar(s) do not match the checksums recorded in {CHECKSUMS}:\n"
            + "\n".join(wrong)
            + f"\nif the versions changed on purpose, re-record them with `{RECORD_COMMAND}`"
        )


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on `folder` (fcntl.flock, released if the process dies)."""
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / ".lakehouse.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _resolve(
    dependencies: list[tuple[str, str, str]], target: Path, excludes: list[str], verify: bool
) -> list[Path]:
    """Retrieve the jars into `target` and verify them, unless its marker says they passed."""
    expected = _recorded(target.name)
    if verify and not expected:
        raise JarResolutionError(
            f"no checksums recorded for {target.name} in {CHECKSUMS}: after a deliberate "
            f"version change, re-record them with `{RECORD_COMMAND}` and review the diff"
        )
    marker = target.parent / f".{target.name}.resolved"
    wanted = "\n".join(
        [":".join(d) for d in dependencies] + [f"{h}  {n}" for n, h in sorted(expected.items())]
    )
    # One resolution at a time: Ivy's `-sync` deletes what it did not fetch itself, so a second
    # process resolving at once (a set-up next to a test run) would lose its jars.
    with _locked(target.parent):
        if not (verify and marker.exists() and marker.read_text() == wanted):
            marker.unlink(missing_ok=True)
            _retrieve(dependencies, target, excludes)
            if verify:
                _verify(target, expected)
                marker.write_text(wanted)
        return sorted(target.glob("*.jar"))


def _retrieve(dependencies: list[tuple[str, str, str]], target: Path, excludes: list[str]) -> None:
    """Have Ivy fetch `dependencies` without `excludes` (`<exclude>` attributes) into `target`."""
    shutil.rmtree(target, ignore_errors=True)
    target.mkdir(parents=True)
    repo = os.environ.get("LAKEHOUSE_MAVEN_REPO", DEFAULT_REPO)
    work = target.parent / f".{target.name}.ivy"
    work.mkdir(exist_ok=True)
    lines = [
        f'    <dependency org="{o}" name="{n}" rev="{r}" conf="default->default"/>'
        for o, n, r in dependencies
    ]
    lines += [f"    <exclude {attributes}/>" for attributes in excludes]
    (work / "ivy.xml").write_text(
        f'<ivy-module version="2.0"><info organisation="lakehouse" module="{target.name}"/>\n'
        f"  <dependencies>\n{chr(10).join(lines)}\n  </dependencies>\n</ivy-module>\n"
    )
    (work / "ivysettings.xml").write_text(
        '<ivysettings><settings defaultResolver="central"/><resolvers>\n'
        f'  <ibiblio name="central" m2compatible="true" root="{repo}"/>\n</resolvers></ivysettings>\n'
    )
    cache = Path(os.environ.get("LAKEHOUSE_IVY_CACHE", Path.home() / ".cache/lakehouse/ivy"))
    cmd = [java_executable(), "-jar", str(_ivy_jar()), "-settings", str(work / "ivysettings.xml")]
    cmd += ["-cache", str(cache), "-ivy", str(work / "ivy.xml"), "-confs", "default", "-sync"]
    cmd += ["-retrieve", str(target / "[organisation]__[artifact]-[revision](-[classifier]).[ext]")]
    # Other checkouts share the Ivy cache, and Ivy keeps its resolution report there.
    with _locked(cache):
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


def spark_jars(*, s3: bool = True, verify: bool = True) -> list[Path]:
    """Delta and the Kafka source (and S3A, with `s3`) with their dependencies, minus the
    libraries pyspark ships, and the project's JVM classes. Without S3A a Spark process starts
    sooner, with 38 jars fewer to load (bench/RESULTS.md, "Figures behind code choices")."""
    excludes = [
        f'org="org.apache.spark" module="spark-{m}_{SCALA}"' for m in ("core", "sql", "catalyst")
    ]
    excludes += [f'org="{org}"' for org in ("org.scala-lang", "org.slf4j", "org.apache.hadoop")]
    core = _resolve(SPARK_PACKAGES, home() / "jars" / SPARK_FOLDER, excludes, verify)
    jars = core + (s3a_jars(verify=verify) if s3 else [])
    shipped = {_artifact_name(j.name) for j in PYSPARK_JARS.glob("*.jar")}
    return [j for j in jars if _artifact_name(j.name) not in shipped] + [lakehouse_jar(core)]


def s3a_jars(*, verify: bool = True) -> list[Path]:
    """S3A (`hadoop-aws`) of pyspark's Hadoop and its AWS SDK modules, with their dependencies."""
    target = home() / "jars" / f"s3a-{hadoop_version()}-awssdk-{AWS_SDK_VERSION}"
    excludes = ['org="org.slf4j"', 'org="software.amazon.awssdk" module="bundle"']
    # pyspark ships Hadoop as hadoop-client-api/-runtime: of Hadoop's own jars, only S3A
    excludes.append('org="org.apache.hadoop" module="hadoop-(?!aws$).*" matcher="regexp"')
    return _resolve(s3a_packages(), target, excludes, verify)


def java_sources_digest() -> str:
    """SHA-256 of the project's Java sources (their paths and contents)."""
    text = "".join(f"{p.relative_to(RESOURCES)}\n{p.read_text()}" for p in JAVA_SOURCES)
    return hashlib.sha256(text.encode()).hexdigest()


def lakehouse_jar(spark_jars: list[Path]) -> Path:
    """The project's JVM classes (`pipelines/resources/java`: the Delta log store, the session
    catalog and the one-pass JSON reader), compiled once against the Spark, Delta and Hadoop in
    use, cached by their sources."""
    name = f"lakehouse-{DELTA_VERSION}-{hadoop_version()}-{java_sources_digest()[:16]}.jar"
    jar = home() / "jars" / name
    with _locked(jar.parent):
        if jar.exists():
            return jar
        javac = shutil.which("javac", path=str(Path(java_executable()).parent)) or shutil.which(
            "javac"
        )
        if not javac:
            raise JarResolutionError(
                "javac was not found next to java or on PATH: the project compiles its JVM classes "
                "(the Delta log store, the session catalog, the one-pass JSON reader) once; "
                "install a JDK 17 (e.g. `apt-get install openjdk-17-jdk-headless`)"
            )
        classpath = [str(j) for j in spark_jars if "__delta-" in j.name]
        classpath.append(str(PYSPARK_JARS / "*"))
        work = jar.parent / f".{jar.stem}.classes"
        shutil.rmtree(work, ignore_errors=True)
        cmd = [javac, "--release", "17", "-nowarn", "-d", str(work), "-cp", ":".join(classpath)]
        proc = subprocess.run([*cmd, *map(str, JAVA_SOURCES)], capture_output=True, text=True)
        if proc.returncode != 0:
            raise JarResolutionError(f"could not compile {RESOURCES / 'java'}:\n{proc.stderr}")
        partial = jar.with_suffix(".tmp")
        with zipfile.ZipFile(partial, "w") as archive:
            for cls in sorted(work.rglob("*.class")):
                archive.write(cls, cls.relative_to(work).as_posix())
        partial.rename(jar)
        shutil.rmtree(work, ignore_errors=True)
        return jar


def kafka_jars(version: str, *, verify: bool = True) -> Path:
    """A folder with the Kafka broker and its tools (ConsumerPerformance among them)."""
    target = home() / "jars" / f"kafka-{version}"
    deps = [("org.apache.kafka", name, version) for name in ("kafka_2.13", "kafka-tools")]
    deps.append(("org.apache.logging.log4j", "log4j-slf4j-impl", "2.25.4"))
    _resolve(deps, target, [], verify)
    return target


def s3proxy_jars(version: str, *, verify: bool = True) -> Path:
    """A folder with S3Proxy, the S3 server of `lakehouse storage start`, and its libraries."""
    target = home() / "jars" / f"s3proxy-{version}"
    _resolve([("org.gaul", "s3proxy", version)], target, [], verify)
    return target


def record() -> None:
    """Resolve every set unchecked and write every jar's SHA-256 to jars.sha256."""
    spark_jars(verify=False)
    folders = [home() / "jars" / SPARK_FOLDER, s3a_jars(verify=False)[0].parent]
    folders.append(kafka_jars(LocalBrokerConf().version, verify=False))
    folders.append(s3proxy_jars(LocalStorageConf().version, verify=False))
    lines = [
        f"{_sha256(jar)}  {folder.name}/{jar.name}"
        for folder in folders
        for jar in sorted(folder.glob("*.jar"))
    ]
    header = f"# SHA-256 of every jar Ivy retrieves; re-record with `{RECORD_COMMAND}`.\n"
    CHECKSUMS.write_text(header + "\n".join(lines) + "\n")
    print(f"recorded {len(lines)} jars in {CHECKSUMS}; review the diff before committing it")


def main() -> None:
    """Fetch and verify everything up front (used by the set-up script)."""
    jars = spark_jars()
    print(f"spark extras: {len(jars) - 1} jars (Delta, Kafka source, S3A), and {jars[-1]}")
    folder = kafka_jars(LocalBrokerConf().version)
    print(f"kafka broker: {len(list(folder.glob('*.jar')))} jars in {folder}")
    folder = s3proxy_jars(LocalStorageConf().version)
    print(f"s3 server: {len(list(folder.glob('*.jar')))} jars in {folder}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Fetch and verify the JVM jars.")
    parser.add_argument("--record", action="store_true", help="write jars.sha256 from the jars")
    with exit_on_known_errors():
        (record if parser.parse_args().record else main)()
