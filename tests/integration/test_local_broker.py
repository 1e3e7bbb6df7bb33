"""`lakehouse kafka start | stop | status` with a real broker, and clear errors when it can't."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from pipelines.kafka import KafkaUnreachableError, check_reachable
from pipelines.local import broker
from pipelines.local.jars import JarResolutionError

pytestmark = pytest.mark.integration


def test_start_twice_is_fine_and_status_tells_it_answers(kafka):
    again = broker.start(kafka, quiet=True)
    assert again.running
    st = broker.status(kafka)
    assert st.running and st.pid == again.pid
    assert st.address == f"127.0.0.1:{kafka.local_broker.port}"
    # the JVM options of `local_broker.jvm_options` (test.yaml's), before the main class
    args = Path(f"/proc/{st.pid}/cmdline").read_bytes().decode().split("\0")
    [option] = kafka.local_broker.jvm_options
    assert args.index(option) < args.index("kafka.Kafka")


def test_port_taken_by_another_process_is_named(kafka, tmp_path):
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        other = kafka.updated({"local_broker.port": port, "local_broker.data_dir": str(tmp_path)})
        with pytest.raises(
            broker.LocalBrokerError, match=f"port 127.0.0.1:{port} is already in use"
        ):
            broker.start(other, quiet=True)


def test_missing_java_is_explained(kafka, tmp_path, monkeypatch):
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "no-jdk"))
    monkeypatch.setenv("PATH", str(tmp_path))
    other = kafka.updated(
        {
            "local_broker.data_dir": str(tmp_path),
            "local_broker.port": 1,
            "local_broker.controller_port": 2,
        }
    )
    with pytest.raises(JarResolutionError, match="Java was not found: install Java 17"):
        broker.start(other, quiet=True)


def test_unreachable_broker_names_the_address(kafka):
    nowhere = kafka.updated({"kafka.bootstrap_servers": "127.0.0.1:9"})
    with pytest.raises(KafkaUnreachableError, match="no Kafka broker answered at 127.0.0.1:9"):
        check_reachable(nowhere, timeout_s=2)
