"""A single-node Apache Kafka broker in KRaft mode, run from Kafka's own Maven Central jars.

`lakehouse kafka start | stop | status`. Data, logs and the pid file live in
`local_broker.data_dir`; starting twice is fine; `start` returns only once the broker answers.
"""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from subprocess import DEVNULL, STDOUT, Popen

from pipelines.config import LakehouseConf
from pipelines.errors import JobFailedError
from pipelines.kafka import admin_client
from pipelines.local.jars import java_executable, kafka_jars
from pipelines.local.processes import pid_alive, tail, terminate

RESOURCES = Path(__file__).resolve().parent.parent / "resources"
LOG4J2 = RESOURCES / "kafka-log4j2.properties"
SERVER_PROPERTIES = RESOURCES / "kafka-server.properties"  # a str.format template


class LocalBrokerError(JobFailedError):
    """The local broker cannot start or stop; the message says why and what to do."""


@dataclass(frozen=True)
class BrokerStatus:
    running: bool
    pid: int | None
    address: str
    detail: str


def _paths(conf: LakehouseConf) -> dict[str, Path]:
    d = conf.broker_data_dir
    return {
        "props": d / "server.properties",
        "logs": d / "logs",
        "data": d / "kraft-logs",
        "pid": d / "broker.pid",
        "out": d / "logs" / "server.out",
    }


def _our_pid(conf: LakehouseConf) -> int | None:
    p = _paths(conf)
    try:
        pid = int(p["pid"].read_text().strip())
    except (OSError, ValueError):  # no pid file, or not a pid
        return None
    if not pid_alive(pid):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return pid
    return pid if "kafka.Kafka" in cmdline and str(p["props"]) in cmdline else None


def _port_in_use(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.settimeout(0.5)
        return s.connect_ex((host, port)) == 0


def _answers(conf: LakehouseConf, timeout: float = 3.0) -> bool:
    try:
        admin_client(conf, timeout_s=timeout).list_topics(timeout=timeout)
        return True
    except Exception:
        return False


def status(conf: LakehouseConf) -> BrokerStatus:
    """Whether our broker runs and answers at its address."""
    pid = _our_pid(conf)
    address = f"{conf.local_broker.host}:{conf.local_broker.port}"
    if pid is None:
        if _port_in_use(conf.local_broker.host, conf.local_broker.port):
            return BrokerStatus(False, None, address, f"port {address} is used by another process")
        return BrokerStatus(False, None, address, "not running")
    if _answers(conf):
        return BrokerStatus(True, pid, address, f"running (pid {pid}), answering at {address}")
    return BrokerStatus(False, pid, address, f"process {pid} is up but not answering at {address}")


def _format_storage(jvm: list[str], p: dict[str, Path]) -> None:
    """Give a new data folder its KRaft metadata: a random cluster id, this node as controller."""
    tool = [*jvm, "kafka.tools.StorageTool"]
    cluster_id = subprocess.run([*tool, "random-uuid"], capture_output=True, text=True, check=True)
    args = ["format", "-t", cluster_id.stdout.strip(), "-c", str(p["props"]), "--standalone"]
    fmt = subprocess.run([*tool, *args], capture_output=True, text=True)
    if fmt.returncode != 0:
        raise LocalBrokerError(
            f"formatting Kafka storage in {p['data']} failed: "
            f"{(fmt.stderr or fmt.stdout).strip()[-800:]}"
        )


def start(conf: LakehouseConf, *, quiet: bool = False) -> BrokerStatus:
    """Start the broker unless it already runs, and wait until it answers."""
    say = (lambda *_: None) if quiet else print
    b = conf.local_broker
    p = _paths(conf)
    current = status(conf)
    if current.running:
        say(f"kafka: already {current.detail}")
        return current
    java = java_executable()
    for port in (b.port, b.controller_port):
        if current.pid is None and _port_in_use(b.host, port):
            raise LocalBrokerError(
                f"cannot start Kafka: port {b.host}:{port} is already in use by another process; "
                f"stop it or choose another port (local_broker.port / local_broker.controller_port "
                f"in {conf.source})"
            )
    for d in (p["logs"], p["data"]):
        d.mkdir(parents=True, exist_ok=True)
    p["props"].write_text(SERVER_PROPERTIES.read_text().format(**b.model_dump(), data=p["data"]))
    jvm = [java, f"-Dlog4j2.configurationFile={LOG4J2}", f"-Dkafka.logs.dir={p['logs']}"]
    jvm += ["-cp", f"{kafka_jars(b.version)}/*"]
    pid = current.pid
    if pid is None:
        if not (p["data"] / "meta.properties").exists():
            _format_storage(jvm, p)
        say(
            f"kafka: starting Apache Kafka {b.version} (KRaft) at {current.address}, data in {conf.broker_data_dir}"
        )
        heap = [f"-Xmx{b.heap}", f"-Xms{b.heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true"]
        cmd = [*jvm, *heap, "kafka.Kafka", str(p["props"])]
        with open(p["out"], "ab") as out:
            pid = Popen(cmd, stdout=out, stderr=STDOUT, stdin=DEVNULL, start_new_session=True).pid
        p["pid"].write_text(str(pid))
    deadline = time.monotonic() + b.start_timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            raise LocalBrokerError(
                f"Kafka exited during start-up; last lines of {p['out']} and "
                f"{p['logs'] / 'server.log'}:\n{tail(p['out'])}\n{tail(p['logs'] / 'server.log')}"
            )
        if _answers(conf, timeout=2.0):
            st = status(conf)
            say(f"kafka: {st.detail}")
            return st
        time.sleep(0.5)
    raise LocalBrokerError(
        f"Kafka did not answer at {current.address} within {b.start_timeout_s}s; "
        f"see {p['logs'] / 'server.log'}"
    )


def stop(conf: LakehouseConf, *, quiet: bool = False, timeout_s: float = 30) -> None:
    """Stop the broker cleanly (SIGTERM), killing it only if it hangs."""
    say = (lambda *_: None) if quiet else print
    pid = _our_pid(conf)
    if pid is None:
        say("kafka: not running")
        return
    terminate(pid, group=False, grace_s=timeout_s)
    _paths(conf)["pid"].unlink(missing_ok=True)
    say(f"kafka: stopped (pid {pid})")
