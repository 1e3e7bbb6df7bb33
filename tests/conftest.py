"""Shared fixtures: one Spark session, one real Kafka broker for the whole run, tables in tmp."""

from __future__ import annotations

import itertools
import os
import random
import secrets
import socket
import sys
import time
import uuid
from pathlib import Path

import pytest

from pipelines.config import LakehouseConf, load_config

# A pytest-xdist worker runs under `python -c`: its __main__ has no file, which pyspark takes for
# its own doctests (importing pyspark.sql.connect, as Great Expectations does, exits the worker).
# An empty file of the project's is its main instead.
if not hasattr(sys.modules["__main__"], "__file__"):
    sys.modules["__main__"].__file__ = str(Path(__file__).with_name("__init__.py"))
# The suite sets the project's variables itself: one left in the shell that runs it (an
# exported LAKEHOUSE__STORAGE__ROOT, LAKEHOUSE_ENV) would change what every test loads.
for _name in [n for n in os.environ if n.startswith("LAKEHOUSE_") and n != "LAKEHOUSE_TEST_SEED"]:
    del os.environ[_name]
# Spark hands timestamps to Python in the process's local zone: make it UTC, like the tables.
os.environ["TZ"] = "UTC"
time.tzset()
# The local S3 endpoint's keys, in the environment before any JVM starts, as S3A, delta-rs and
# the server itself read them: a fresh secret per run, which no file or table may hold.
os.environ["AWS_ACCESS_KEY_ID"] = "lakehouse-tests"
os.environ["AWS_SECRET_ACCESS_KEY"] = S3_SECRET = secrets.token_hex(20)


# Ports a test hands a server it starts: a range below the kernel's ephemeral ports (32768-60999),
# so a client connection's local port cannot take one between the test choosing it and the
# server binding it. Each pytest-xdist worker takes its own slice, so two cannot pick one port.
_WORKER = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw"))
_PORTS = range(20000 + 1500 * _WORKER, 21500 + 1500 * _WORKER)
_next_port = itertools.count(random.randrange(len(_PORTS)))


_UNGROUPED = pytest.StashKey[bool]()


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under `--dist loadgroup` a grouped test carries its group in its id: that is how xdist
    keeps a group (a module's broker cluster) on one worker. A test that lost it fails."""
    if config.getoption("loadgroup", False):
        for item in items:
            if item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
                item.stash[_UNGROUPED] = True


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.stash.get(_UNGROUPED, False):
        pytest.fail(
            "pytest-xdist's loadgroup no longer groups: this pytest and pytest-xdist do not fit "
            "(pytest-dev/pytest-xdist#1386)",
            pytrace=False,
        )


def _free_port() -> int:
    for _ in range(len(_PORTS)):
        port = _PORTS[next(_next_port) % len(_PORTS)]
        if _can_bind(port):
            return port
    raise RuntimeError(f"no free port in {_PORTS.start}-{_PORTS.stop - 1}")


@pytest.fixture(scope="session")
def base_conf(tmp_path_factory: pytest.TempPathFactory) -> LakehouseConf:
    """The `test` environment with its broker data in a temporary folder."""
    conf = load_config("test")
    broker_dir = tmp_path_factory.mktemp("kafka")
    port, controller_port, s3_port = _free_port(), _free_port(), _free_port()
    return conf.updated(
        {
            "local_broker.data_dir": str(broker_dir),
            "local_broker.port": port,
            "local_broker.controller_port": controller_port,
            "kafka.bootstrap_servers": f"127.0.0.1:{port}",
            "storage.root": str(tmp_path_factory.mktemp("lake")),
            # the `s3` fixture's endpoint, known to every session and child from the start
            "local_storage.port": s3_port,
            "local_storage.data_dir": str(tmp_path_factory.mktemp("s3")),
            "storage.s3.endpoint": f"http://127.0.0.1:{s3_port}",
            "storage.s3.path_style_access": True,
        }
    )


@pytest.fixture(scope="session")
def spark(base_conf: LakehouseConf):
    from pipelines.session import build_spark

    # all of the JIT's tiers, unlike the short jobs the tests start (`subprocess_env`): this
    # session runs for the whole suite, and its compiled code pays back the compiling
    # (bench/RESULTS.md, "Figures behind code choices")
    session = build_spark(base_conf, app_name="lakehouse-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def kafka(base_conf: LakehouseConf):
    """A real single-node Kafka broker, started once for the session."""
    from pipelines.local import broker

    broker.start(base_conf, quiet=True)
    yield base_conf
    broker.stop(base_conf, quiet=True)


def _free_ports(count: int) -> int:
    """The first of `count` consecutive free ports."""
    for _ in range(100):
        first = _free_port()
        if first + count <= _PORTS.stop and all(_can_bind(first + i) for i in range(count)):
            for _ in range(count - 1):  # the next ones are taken too
                next(_next_port)
            return first
    raise RuntimeError(f"no {count} consecutive free ports")


def _can_bind(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def cluster_ports(count: int) -> tuple[int, int]:
    """The first broker and controller ports of `count` nodes: two ranges that do not overlap."""
    port = _free_ports(count)
    while abs((controller_port := _free_ports(count)) - port) < count:
        pass
    return port, controller_port


@pytest.fixture(scope="module")
def kafka_cluster(base_conf: LakehouseConf, tmp_path_factory: pytest.TempPathFactory):
    """A real three-broker KRaft cluster on loopback, started once for a module's tests (kept
    for the session, its idle nodes cost ~275 core-s over the rest of the run); topics of the
    orders stream get 3 replicas and min.insync.replicas 2."""
    from pipelines.local import broker

    port, controller_port = cluster_ports(3)
    conf = base_conf.updated(
        {
            "local_broker.brokers": 3,
            "local_broker.data_dir": str(tmp_path_factory.mktemp("kafka-cluster")),
            "local_broker.port": port,
            "local_broker.controller_port": controller_port,
            "kafka.bootstrap_servers": ",".join(f"127.0.0.1:{port + i}" for i in range(3)),
            "streams.orders.replication_factor": 3,
            "streams.orders.min_insync_replicas": 2,
        }
    )
    broker.start(conf, quiet=True)
    yield conf
    broker.stop(conf, quiet=True)


@pytest.fixture(scope="session")
def s3(base_conf: LakehouseConf):
    """A real S3 endpoint (S3Proxy, filesystem backend) with the bucket `lake`, started once."""
    from pipelines.local import s3 as storage

    conf = base_conf.updated({"storage.root": "s3a://lake/session"})
    storage.start(conf, quiet=True)
    yield conf
    storage.stop(conf, quiet=True)


@pytest.fixture
def s3_lake(s3: LakehouseConf, kafka: LakehouseConf, tmp_path: Path) -> LakehouseConf:
    """Like `lake`, with its root under its own prefix of the S3 bucket, and logs in tmp."""
    topic = f"orders.test.{uuid.uuid4().hex[:10]}"
    return kafka.updated(
        {
            "storage.root": f"s3a://lake/{topic}",
            "storage.log_dir": str(tmp_path / "logs"),
            "streams.orders.topic": topic,
        }
    )


@pytest.fixture
def lake(kafka: LakehouseConf, tmp_path: Path) -> LakehouseConf:
    """Configuration with its own storage root and its own fresh topic."""
    topic = f"orders.test.{uuid.uuid4().hex[:10]}"
    return kafka.updated({"storage.root": str(tmp_path / "lake"), "streams.orders.topic": topic})


_C1 = "-XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=240m"


def subprocess_env(conf: LakehouseConf, **extra: str) -> dict[str, str]:
    """Environment that makes a child `lakehouse` process use `conf`'s root, topic and broker."""
    stream = conf.streams["orders"]
    env = {
        **os.environ,
        "LAKEHOUSE_ENV": "test",
        "LAKEHOUSE__STORAGE__ROOT": conf.storage.root,
        "LAKEHOUSE__STREAMS__ORDERS__TOPIC": stream.topic,
        "LAKEHOUSE__KAFKA__BOOTSTRAP_SERVERS": conf.kafka.bootstrap_servers,
        # the S3 endpoint for a root on it only: other jobs start without S3A's jars
        "LAKEHOUSE__STORAGE__S3__ENDPOINT": (conf.remote and conf.storage.s3.endpoint) or "",
        "LAKEHOUSE__STORAGE__S3__PATH_STYLE_ACCESS": str(conf.storage.s3.path_style_access),
        "LAKEHOUSE__STORAGE__LOG_DIR": conf.storage.log_dir or "",
        # the jobs a test starts run a few batches: C1 alone starts them ~25% faster on 2 cores
        # and, for a silver job of 4 batches, takes 99 CPU-s where the full tiers take 175 (94 of
        # them compiling) in the same wall time: the core it frees runs what a test runs beside.
        # C1 alone gets a 48 MB code cache, which a job with S3A fills (then HotSpot stops
        # compiling and fails in method handles): the tiered size
        "JAVA_TOOL_OPTIONS": _C1,
    }
    env.update(extra)
    return env
