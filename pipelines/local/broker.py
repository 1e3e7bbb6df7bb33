"""The local Apache Kafka in KRaft mode, run from Kafka's own Maven Central jars: one node, or a
cluster of `local_broker.brokers` nodes on loopback ports, each a broker and a controller.

`lakehouse kafka start | stop | status`; starting twice is fine, and `start` returns only once
every broker is registered and answers (with SASL_SSL, once each takes the current password).
What they do: docs/kafka.md, "The local broker", and docs/kafka.md, "A secured broker".
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from subprocess import DEVNULL, STDOUT, Popen

from confluent_kafka.admin import (
    AdminClient,
    ClusterMetadata,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)

from pipelines.config import LakehouseConf
from pipelines.errors import JobFailedError
from pipelines.kafka import sasl_password
from pipelines.local.jars import java_executable, kafka_jars
from pipelines.local.processes import pid_alive, pid_of, port_in_use, tail, terminate
from pipelines.local.tls import (
    BrokerTls,
    ensure_broker_tls,
    host_names,
    new_password_file,
    write_private,
)

RESOURCES = Path(__file__).resolve().parent.parent / "resources"
LOG4J2 = RESOURCES / "kafka-log4j2.properties"
SERVER_PROPERTIES = RESOURCES / "kafka-server.properties"  # a str.format template
BROKER_USER = "lakehouse-broker"  # the brokers' own SCRAM user: replication and health checks
SCRAM_ITERATIONS = 8192


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


@dataclass(frozen=True)
class Security:
    """A SASL_SSL broker's secrets: its TLS files, SCRAM mechanism and its own user's password."""

    tls: BrokerTls
    mechanism: str  # SCRAM-SHA-256 or SCRAM-SHA-512
    broker_password: str


def _security_dir(conf: LakehouseConf) -> Path:
    return conf.broker_data_dir / "security"


def _security(conf: LakehouseConf, java: str | None = None) -> Security | None:
    """The SASL_SSL broker's secrets (made on its first start, when `java` is given), or None for a
    plaintext one; a setting it cannot serve is refused, naming the key."""
    if conf.local_broker.security_protocol != "SASL_SSL":
        return None
    k, where = conf.kafka, conf.source
    if k.sasl_mechanism not in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        raise LocalBrokerError(
            f"kafka.sasl_mechanism in {where} is {k.sasl_mechanism}, but the local broker "
            "(local_broker.security_protocol: SASL_SSL) serves SCRAM: set it to SCRAM-SHA-512 or "
            "SCRAM-SHA-256"
        )
    user = k.sasl_username or ""
    if not re.fullmatch(r"[\w.@-]+", user, re.ASCII) or user == BROKER_USER:
        raise LocalBrokerError(
            f"kafka.sasl_username in {where} must be a user name of letters, digits and . _ @ - "
            f"other than {BROKER_USER!r} (the brokers' own user), got {user!r}"
        )
    folder = _security_dir(conf)
    secret = folder / "broker.pass"
    if java is not None:
        ensure_broker_tls(java, folder / "tls", host_names(conf.local_broker.host))
        if not secret.exists():
            new_password_file(secret)
    try:
        password = secret.read_text().strip()
    except OSError:
        raise LocalBrokerError(
            f"the secured broker's files in {folder} are missing: a broker started before "
            "local_broker.security_protocol was SASL_SSL keeps its plaintext listener; "
            "`lakehouse kafka stop`, then `lakehouse kafka start` makes them"
        ) from None
    return Security(BrokerTls(folder / "tls"), k.sasl_mechanism, password)


def _scram_credential(mechanism: str, user: str, password: str) -> str:
    """A `kafka-storage format --add-scram` argument holding the salted password (SCRAM's Hi()):
    it logs in as well as the password, so it is kept off command lines too."""
    salt = secrets.token_bytes(32)
    digest = mechanism.removeprefix("SCRAM-").replace("-", "").lower()  # sha256, sha512
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), salt, SCRAM_ITERATIONS)
    b64 = base64.b64encode
    return (
        f"{mechanism}=[name={user},iterations={SCRAM_ITERATIONS},"
        f'salt="{b64(salt).decode()}",saltedpassword="{b64(salted).decode()}"]'
    )


def _admin_settings(conf: LakehouseConf) -> dict[str, str]:
    """librdkafka settings to reach the local cluster as its operator: for a secured one, as the
    brokers' own user, trusting its own CA (whatever the clients' settings say)."""
    settings = {"bootstrap.servers": addresses(conf), "log_level": "0"}
    if (sec := _security(conf)) is not None:
        settings |= {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": sec.mechanism,
            "sasl.username": BROKER_USER,
            "sasl.password": sec.broker_password,
            "ssl.ca.location": str(sec.tls.ca_pem),
        }
    return settings


def _metadata(settings: dict[str, str], timeout: float) -> ClusterMetadata | None:
    """The cluster's metadata for a client with these librdkafka settings, or None when it gets
    none in time (no broker answered, or one refused it)."""
    try:
        return AdminClient(settings).list_topics(timeout=timeout)
    except Exception:
        return None


def _reset_client_user(conf: LakehouseConf, sec: Security | None) -> None:
    """Set the client user's SCRAM credential to the current password (created if missing), on a
    secured cluster when the password is set: a new LAKEHOUSE_KAFKA_SASL_PASSWORD and `kafka
    start` rotate it, running or not."""
    if sec is None or conf.kafka.sasl_password is None:
        return
    mechanism = getattr(ScramMechanism, sec.mechanism.replace("-", "_"))
    upsert = UserScramCredentialUpsertion(
        conf.kafka.sasl_username,
        ScramCredentialInfo(mechanism, SCRAM_ITERATIONS),
        (password := sasl_password(conf)).encode(),
    )
    timeout = conf.kafka.request_timeout_s
    admin = AdminClient(_admin_settings(conf))
    try:
        for future in admin.alter_user_scram_credentials([upsert]).values():
            future.result(timeout=timeout)
    except Exception as e:
        raise LocalBrokerError(
            f"setting the SCRAM password of user {conf.kafka.sasl_username!r} on Kafka at "
            f"{addresses(conf)} failed: {e}"
        ) from None
    # the controllers committed it; each broker applies it from the metadata log in its own time
    login = {
        **_admin_settings(conf),
        "sasl.username": conf.kafka.sasl_username,
        "sasl.password": password,
    }
    deadline = time.monotonic() + timeout
    for n in nodes(conf):
        while _metadata({**login, "bootstrap.servers": n.address}, timeout=1.0) is None:
            if time.monotonic() > deadline:
                raise LocalBrokerError(
                    f"Kafka at {n.address} still refuses the new SCRAM password of user "
                    f"{conf.kafka.sasl_username!r} after {timeout}s; see "
                    f"{n.paths['logs'] / 'server.log'}"
                )


def _node_pid(node: Node) -> int | None:
    """The pid of the node's Kafka process, if it runs (and is ours: its command names our file)."""
    return pid_of(node.paths["pid"], "kafka.Kafka", str(node.paths["props"]))


def _answers(conf: LakehouseConf, timeout: float = 3.0) -> bool:
    """Whether every node listens, and the cluster answers with all of them registered."""
    members = nodes(conf)
    if not all(port_in_use(n.host, n.port) for n in members):
        return False
    settings = {**_admin_settings(conf), "socket.timeout.ms": str(int(timeout * 1000))}
    meta = _metadata(settings, timeout)
    return meta is not None and set(meta.brokers) == {n.id for n in members}


def status(conf: LakehouseConf) -> BrokerStatus:
    """Whether our broker (every node of the cluster) runs and answers at its address."""
    members = nodes(conf)
    pids = tuple(_node_pid(n) for n in members)
    address = addresses(conf)
    down = [n for n, pid in zip(members, pids, strict=True) if pid is None]
    if len(down) == len(members):
        taken = [n.address for n in members if port_in_use(n.host, n.port)]
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


def _format_storage(
    jvm: list[str], p: dict[str, Path], cluster_id: str, single: bool, scram: list[str]
) -> None:
    """Give a new data folder its KRaft metadata: the cluster's id, its SCRAM users and, for a
    single node, this node as the only controller (a cluster's controllers are its static voters)."""
    args = ["kafka.tools.StorageTool", "format", "-t", cluster_id, "-c", str(p["props"])]
    args += ["--standalone"] if single else []
    args += [arg for credential in scram for arg in ("--add-scram", credential)]
    # A salted SCRAM password logs in as well as the password: it reaches the tool in a file only
    # its owner reads (the JVM's @argfile, main class included: later @files are not expanded),
    # never on a command line that `ps` shows.
    argfile = p["data"].parent / "format.args"
    write_private(argfile, "\n".join(f"'{a}'" for a in args) + "\n")
    try:
        fmt = subprocess.run([*jvm, f"@{argfile}"], capture_output=True, text=True)
    finally:
        argfile.unlink(missing_ok=True)
    if fmt.returncode != 0:
        raise LocalBrokerError(
            f"formatting Kafka storage in {p['data']} failed: "
            f"{(fmt.stderr or fmt.stdout).strip()[-800:]}"
        )


def _security_properties(sec: Security | None) -> dict[str, str]:
    """The template's listener and security settings, plaintext or SASL_SSL."""
    if sec is None:
        return {"listener": "PLAINTEXT", "controller_protocol": "PLAINTEXT", "security": ""}
    mechanism, tls = sec.mechanism, sec.tls
    login = "org.apache.kafka.common.security.scram.ScramLoginModule required"
    lines = {
        "sasl.enabled.mechanisms": mechanism,
        "sasl.mechanism.inter.broker.protocol": mechanism,
        f"listener.name.sasl_ssl.{mechanism.lower()}.sasl.jaas.config": (
            f'{login} username="{BROKER_USER}" password="{sec.broker_password}";'
        ),
        "ssl.keystore.type": "PKCS12",
        "ssl.keystore.location": str(tls.keystore),
        "ssl.keystore.password": tls.store_password(),
        "ssl.key.password": tls.store_password(),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(tls.ca_pem),
        "listener.name.controller.ssl.client.auth": "required",  # controllers: mutual TLS
    }
    security = "\n".join(f"{key}={value}" for key, value in lines.items())
    return {"listener": "SASL_SSL", "controller_protocol": "SSL", "security": security}


def _properties(
    conf: LakehouseConf, node: Node, members: list[Node], sec: Security | None = None
) -> str:
    """The node's server.properties: the template with its ports, quorum, replication and
    security."""
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
        **_security_properties(sec),
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
            if pid is None and port_in_use(n.host, port):
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
        _reset_client_user(conf, _security(conf))
        return current
    members = nodes(conf)
    pids = list(current.pids)  # as status() just found them
    java = java_executable()
    _check_ports(conf, members, pids)
    jvm = [java, f"-Dlog4j2.configurationFile={LOG4J2}", *b.jvm_options]  # its tools' too
    classpath = ["-cp", f"{kafka_jars(b.version)}/*"]
    sec = _security(conf, java)
    cluster_id, scram = None, None
    launched: dict[int, Popen] = {}
    for n, pid in zip(members, pids, strict=True):
        p = n.paths
        for d in (p["logs"], p["data"]):
            d.mkdir(parents=True, exist_ok=True)
        write_private(p["props"], _properties(conf, n, members, sec))
        if pid is not None:
            continue
        node_jvm = [*jvm, f"-Dkafka.logs.dir={p['logs']}", *classpath]
        if not (p["data"] / "meta.properties").exists():
            cluster_id = cluster_id or _cluster_id(node_jvm, members)
            if scram is None:  # the same user, salt included, on every node; the client user
                scram = [] if sec is None else [  # is set once the cluster answers
                    _scram_credential(sec.mechanism, BROKER_USER, sec.broker_password)
                ]  # fmt: skip
            _format_storage(node_jvm, p, cluster_id, len(members) == 1, scram)
        what = "Apache Kafka" if len(members) == 1 else f"Apache Kafka node {n.id}"
        protocol = "" if sec is None else f", SASL_SSL with {sec.mechanism}"
        say(f"kafka: starting {what} {b.version} (KRaft{protocol}) at {n.address}, data in {n.dir}")
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
            _reset_client_user(conf, sec)  # the password may have changed since the format
            st = status(conf)
            say(f"kafka: {st.detail}")
            if sec is not None:
                say(f"kafka: clients trust {sec.tls.ca_pem} (kafka.ssl_ca_location)")
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
        or any(port_in_use(target.host, p) for p in (target.port, target.controller_port))
    ):
        time.sleep(0.05)
    target.paths["pid"].unlink(missing_ok=True)
    return pid
