"""A Hive metastore on this machine, from pyspark's own jars, for `catalog.metastore: hive`.

`lakehouse metastore start | stop | status`: Hive's thrift metastore service (the 2.3 that Spark
ships), its database in embedded Derby under `local_metastore.data_dir`. Derby admits one process,
the service; any number of Spark drivers share the service. A metastore of your own (or a
Hive-compatible one) is only a different `catalog.hive_metastore_uri`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

import pyspark

from pipelines.config import LakehouseConf
from pipelines.errors import JobFailedError
from pipelines.local.jars import java_executable
from pipelines.local.processes import pid_of, port_in_use, start_service, stop_service

MAIN = "org.apache.hadoop.hive.metastore.HiveMetaStore"


class MetastoreError(JobFailedError):
    """The metastore cannot start; the message says why, with its log's last lines."""


@dataclass(frozen=True)
class MetastoreStatus:
    running: bool
    pid: int | None
    uri: str
    detail: str


def uri(conf: LakehouseConf) -> str:
    m = conf.local_metastore
    return f"thrift://{m.host}:{m.port}"


def _paths(conf: LakehouseConf) -> dict[str, Path]:
    d = conf.metastore_data_dir
    return {
        "dir": d,
        "conf": d / "conf",
        "db": d / "metastore_db",
        "pid": d / "metastore.pid",
        "out": d / "metastore.out",
        "logs": d / "logs",
    }


def _hive_site(conf: LakehouseConf) -> str:
    p = _paths(conf)
    props = {
        "javax.jdo.option.ConnectionURL": f"jdbc:derby:;databaseName={p['db']};create=true",
        "javax.jdo.option.ConnectionDriverName": "org.apache.derby.jdbc.EmbeddedDriver",
        "datanucleus.schema.autoCreateAll": "true",
        "hive.metastore.schema.verification": "false",
        "hive.metastore.warehouse.dir": conf.warehouse_dir,
        # Hive logs asynchronously through a library pyspark does not ship (LMAX disruptor)
        "hive.async.log.enabled": "false",
    }
    lines = [
        f"  <property><name>{k}</name><value>{escape(v)}</value></property>"
        for k, v in props.items()
    ]
    return '<?xml version="1.0"?>\n<configuration>\n' + "\n".join(lines) + "\n</configuration>\n"


def _pid(conf: LakehouseConf) -> int | None:
    return pid_of(_paths(conf)["pid"], MAIN, str(_paths(conf)["conf"]))


def status(conf: LakehouseConf) -> MetastoreStatus:
    m, pid, where = conf.local_metastore, _pid(conf), uri(conf)
    answers = port_in_use(m.host, m.port)
    if pid is None:
        detail = f"port {m.port} is used by another process" if answers else "not running"
        return MetastoreStatus(False, None, where, detail)
    if not answers:
        return MetastoreStatus(False, pid, where, f"process {pid} is up but not listening yet")
    detail = f"running (pid {pid}) at {where}, database in {_paths(conf)['db']}"
    return MetastoreStatus(True, pid, where, detail)


def start(conf: LakehouseConf, *, quiet: bool = False) -> MetastoreStatus:
    """Start the metastore unless it runs; return once it accepts connections (it listens only
    once its database is ready)."""
    say = (lambda *_: None) if quiet else print
    m, p = conf.local_metastore, _paths(conf)
    current = status(conf)
    if current.running:
        say(f"metastore: already {current.detail}")
        return current
    if current.pid is None and port_in_use(m.host, m.port):
        raise MetastoreError(f"cannot start the metastore at {current.uri}: {current.detail}")
    for folder in ("conf", "logs"):
        p[folder].mkdir(parents=True, exist_ok=True)
    (p["conf"] / "hive-site.xml").write_text(_hive_site(conf))
    jars = Path(pyspark.__file__).parent / "jars"
    cmd = [java_executable(), f"-Xmx{m.heap}", f"-Dhive.log.dir={p['logs']}"]
    cmd += [f"-Dderby.stream.error.file={p['logs'] / 'derby.log'}"]
    cmd += ["-cp", f"{p['conf']}:{jars}/*", MAIN, "-p", str(m.port)]
    say(f"metastore: starting Hive's metastore at {current.uri}, database in {p['db']}")
    start_service(
        cmd,
        what=f"the metastore at {current.uri}",
        log=p["out"],
        pid_file=p["pid"],
        ready=lambda: port_in_use(m.host, m.port),
        timeout_s=m.start_timeout_s,
        error=MetastoreError,
    )
    st = status(conf)
    say(f"metastore: {st.detail}")
    return st


def stop(conf: LakehouseConf, *, quiet: bool = False) -> None:
    """Stop the metastore; its database stays."""
    done = stop_service("metastore", _pid(conf), _paths(conf)["pid"])
    if not quiet:
        print(done)
