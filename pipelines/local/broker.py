"""The local Apache Kafka in KRaft mode, run from Kafka's own Maven Central jars: one node, or a
cluster of `local_broker.brokers` nodes on loopback ports, each a broker and a controller.

`lakehouse kafka start | stop | status`. Data, logs and the pid file of each node live in
`local_broker.data_dir` (a cluster's node i in `node-<i>` under it); starting twice is fine, and
starting a cluster with a node down starts that node; `start` returns only once every broker is
registered and answers.
"""

from __future__ import annotations

import os
import signal
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
    pid: int | None  # the first node's
    address: str  # every node's, comma-separated
    detail: str
    pids: tuple[int | None, ...] = ()  # per node, None where it is down


@dataclass(frozen=True)
class Node:
    """One node of the local cluster: a broker and a controller."""

    id: int  # KRaft node.id, from 1
    host: str
    port: int
    controller_port: int
    dir: Path

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def paths(self) -> dict[str, Path]:
        return {
            "props": self.dir / "server.properties",
            "logs": self.dir / "logs",
            "data": self.dir / "kraft-logs",
            "pid": self.dir / "broker.pid",
            "out": self.dir / "logs" / "server.out",
        }


def nodes(conf: LakehouseConf) -> list[Node]:
    """The nodes `local_broker` describes (a single node keeps its files in `data_dir` itself)."""
    b, root = conf.local_broker, conf.broker_data_dir
    if b.brokers == 1:
        return [Node(1, b.host, b.port, b.controller_port, root)]
    return [
        Node(i, b.host, b.port + i - 1, b.controller_port + i - 1, root / f"node-{i}")
        for i in range(1, b.brokers + 1)
    ]


def addresses(conf: LakehouseConf) -> str:
    """The bootstrap servers of the local cluster: every node's address."""
    return ",".join(n.address for n in nodes(conf))


def _node_pid(node: Node) -> int | None:
    """The pid of the node's Kafka process, if it runs (and is ours: its command names our file)."""
    p = node.paths
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
    """Whether every node listens, and the cluster answers with all of them registered."""
    members = nodes(conf)
    if not all(_port_in_use(n.host, n.port) for n in members):
        return False
    local = conf.updated({"kafka.bootstrap_servers": addresses(conf)})
    try:
        meta = admin_client(local, timeout_s=timeout).list_topics(timeout=timeout)
    except Exception:
        return False
    return set(meta.brokers) == {n.id for n in members}


def status(conf: LakehouseConf) -> BrokerStatus:
    """Whether our broker (every node of the cluster) runs and answers at its address."""
    members = nodes(conf)
    pids = tuple(_node_pid(n) for n in members)
    address = addresses(conf)
    down = [n for n, pid in zip(members, pids, strict=True) if pid is None]
    if len(down) == len(members):
        taken = [n.address for n in members if _port_in_use(n.host, n.port)]
        if taken:
            detail = f"port {', '.join(taken)} is used by another process"
            return BrokerStatus(False, None, address, detail, pids)
        return BrokerStatus(False, None, address, "not running", pids)
    shown = ", ".join(str(p) for p in pids if p is not None)
    if down:
        names = ", ".join(f"node {n.id} ({n.address})" for n in down)
        return BrokerStatus(False, pids[0], address, f"{names} not running (pid {shown} up)", pids)
    if _answers(conf):
        detail = f"running (pid {shown}), answering at {address}"
        return BrokerStatus(True, pids[0], address, detail, pids)
    detail = f"process {shown} is up but not answering at {address}"
    return BrokerStatus(False, pids[0], address, detail, pids)


def _cluster_id(jvm: list[str], members: list[Node]) -> str:
    """The cluster id in a formatted node's metadata, else a new random one."""
    for n in members:
        meta = n.paths["data"] / "meta.properties"
        if meta.exists():
            for line in meta.read_text().splitlines():
                if line.startswith("cluster.id="):
                    return line.split("=", 1)[1].strip()
    tool = [*jvm, "kafka.tools.StorageTool", "random-uuid"]
    return subprocess.run(tool, capture_output=True, text=True, check=True).stdout.strip()


def _format_storage(jvm: list[str], p: dict[str, Path], cluster_id: str, single: bool) -> None:
    """Give a new data folder its KRaft metadata: the cluster's id and, for a single node, this
    node as the only controller (a cluster's controllers are its static voters)."""
    tool = [*jvm, "kafka.tools.StorageTool"]
    args = ["format", "-t", cluster_id, "-c", str(p["props"])]
    args += ["--standalone"] if single else []
    fmt = subprocess.run([*tool, *args], capture_output=True, text=True)
    if fmt.returncode != 0:
        raise LocalBrokerError(
            f"formatting Kafka storage in {p['data']} failed: "
            f"{(fmt.stderr or fmt.stdout).strip()[-800:]}"
        )


def _properties(conf: LakehouseConf, node: Node, members: list[Node]) -> str:
    """The node's server.properties: the template with its ports, quorum and replication."""
    b = conf.local_broker
    if len(members) == 1:  # a dynamic quorum of one, as formatted with --standalone
        quorum = f"controller.quorum.bootstrap.servers={node.host}:{node.controller_port}"
    else:
        voters = ",".join(f"{n.id}@{n.host}:{n.controller_port}" for n in members)
        quorum = f"controller.quorum.voters={voters}"
    replication = min(3, len(members))  # Kafka's internal topics: 3 copies where there are 3
    return SERVER_PROPERTIES.read_text().format(
        **b.model_dump(exclude={"port", "controller_port"}),
        node_id=node.id,
        port=node.port,
        controller_port=node.controller_port,
        quorum=quorum,
        replication=replication,
        min_isr=min(2, replication),
        data=node.paths["data"],
    )


def _check_ports(conf: LakehouseConf, members: list[Node], pids: list[int | None]) -> None:
    """Refuse overlapping port ranges, and ports another process holds, naming them."""
    b = conf.local_broker
    ports = [n.port for n in members] + [n.controller_port for n in members]
    if len(set(ports)) != len(ports) or max(ports) > 65535:
        raise LocalBrokerError(
            f"local_broker.port ({b.port}) and local_broker.controller_port ({b.controller_port}) "
            f"in {conf.source} give {len(members)} brokers overlapping or invalid ports "
            f"{b.port}..{b.port + len(members) - 1} and {b.controller_port}.."
            f"{b.controller_port + len(members) - 1}: move one of them"
        )
    for n, pid in zip(members, pids, strict=True):
        for port in (n.port, n.controller_port):
            if pid is None and _port_in_use(n.host, port):
                raise LocalBrokerError(
                    f"cannot start Kafka: port {n.host}:{port} is already in use by another "
                    f"process; stop it or choose another port (local_broker.port / "
                    f"local_broker.controller_port in {conf.source})"
                )


def start(conf: LakehouseConf, *, quiet: bool = False) -> BrokerStatus:
    """Start every node that is not running, and wait until all of them answer."""
    say = (lambda *_: None) if quiet else print
    b = conf.local_broker
    current = status(conf)
    if current.running:
        say(f"kafka: already {current.detail}")
        return current
    members = nodes(conf)
    pids = list(current.pids)  # as status() just found them
    java = java_executable()
    _check_ports(conf, members, pids)
    jvm = [java, f"-Dlog4j2.configurationFile={LOG4J2}"]
    classpath = ["-cp", f"{kafka_jars(b.version)}/*"]
    cluster_id = None
    launched: dict[int, Popen] = {}
    for n, pid in zip(members, pids, strict=True):
        p = n.paths
        for d in (p["logs"], p["data"]):
            d.mkdir(parents=True, exist_ok=True)
        p["props"].write_text(_properties(conf, n, members))
        if pid is not None:
            continue
        node_jvm = [*jvm, f"-Dkafka.logs.dir={p['logs']}", *classpath]
        if not (p["data"] / "meta.properties").exists():
            cluster_id = cluster_id or _cluster_id(node_jvm, members)
            _format_storage(node_jvm, p, cluster_id, single=len(members) == 1)
        what = "Apache Kafka" if len(members) == 1 else f"Apache Kafka node {n.id}"
        say(f"kafka: starting {what} {b.version} (KRaft) at {n.address}, data in {n.dir}")
        heap = [f"-Xmx{b.heap}", f"-Xms{b.heap}", "-XX:+UseG1GC", "-Djava.awt.headless=true"]
        cmd = [*node_jvm, *heap, "kafka.Kafka", str(p["props"])]
        with open(p["out"], "ab") as out:
            launched[n.id] = Popen(
                cmd, stdout=out, stderr=STDOUT, stdin=DEVNULL, start_new_session=True
            )
        p["pid"].write_text(str(launched[n.id].pid))
    deadline = time.monotonic() + b.start_timeout_s
    while time.monotonic() < deadline:
        for n, pid in zip(members, pids, strict=True):
            # a process just started: its exit code (its /proc entry is briefly empty at exec)
            gone = launched[n.id].poll() is not None if n.id in launched else not pid_alive(pid)
            if gone:
                p = n.paths
                raise LocalBrokerError(
                    f"Kafka at {n.address} exited during start-up; last lines of {p['out']} and "
                    f"{p['logs'] / 'server.log'}:\n{tail(p['out'])}\n{tail(p['logs'] / 'server.log')}"
                )
        if _answers(conf, timeout=2.0):
            st = status(conf)
            say(f"kafka: {st.detail}")
            return st
        time.sleep(0.5)
    raise LocalBrokerError(
        f"Kafka did not answer at {current.address} within {b.start_timeout_s}s (with "
        f"{b.brokers} broker(s) registered); see "
        + ", ".join(str(n.paths["logs"] / "server.log") for n in members)
    )


def stop(
    conf: LakehouseConf, *, quiet: bool = False, timeout_s: float = 30, node: int | None = None
) -> None:
    """Stop the broker (every node, or node `node` of a cluster) cleanly (SIGTERM), killing it
    only if it hangs."""
    say = (lambda *_: None) if quiet else print
    members = [n for n in nodes(conf) if node is None or n.id == node]
    if not members:
        raise LocalBrokerError(f"the local cluster has no node {node} (local_broker.brokers)")
    running = [(n, pid) for n in members if (pid := _node_pid(n)) is not None]
    if not running:
        say("kafka: not running")
        return
    for _, pid in running:  # all at once: a cluster's last nodes need not wait for a quorum
        os.kill(pid, signal.SIGTERM)
    for n, pid in running:
        terminate(pid, group=False, grace_s=timeout_s)
        n.paths["pid"].unlink(missing_ok=True)
        say(f"kafka: stopped {'' if len(running) == 1 else f'node {n.id} '}(pid {pid})")


def kill(conf: LakehouseConf, node: int) -> int:
    """SIGKILL node `node` of the local cluster, as a crash would; returns its pid."""
    target = next((n for n in nodes(conf) if n.id == node), None)
    pid = None if target is None else _node_pid(target)
    if pid is None:
        raise LocalBrokerError(f"node {node} of the local cluster is not running")
    os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10  # gone once its threads are, and its ports with them
    while time.monotonic() < deadline and (
        pid_alive(pid)
        or any(_port_in_use(target.host, p) for p in (target.port, target.controller_port))
    ):
        time.sleep(0.05)
    target.paths["pid"].unlink(missing_ok=True)
    return pid
