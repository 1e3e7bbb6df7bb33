"""A Spark standalone cluster on this machine: a master and workers from pyspark's own jars.

`lakehouse cluster start | stop | status`. pip's pyspark ships no start scripts, so the deploy
classes (`org.apache.spark.deploy.master.Master`, `...worker.Worker`) run directly on its jars.
The same layer jobs then run on it with `spark-submit --master spark://127.0.0.1:7077`: the step
from one machine to a distributed engine. Logs, pids and work dirs live in `cluster.dir`.
"""

from __future__ import annotations

import json
import os
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from subprocess import STDOUT, Popen

import pyspark

from pipelines.config import LakehouseConf
from pipelines.errors import JobFailedError
from pipelines.local.jars import java_executable
from pipelines.local.processes import pid_alive, tail, terminate

MASTER = "org.apache.spark.deploy.master.Master"
WORKER = "org.apache.spark.deploy.worker.Worker"


class ClusterError(JobFailedError):
    """The standalone cluster cannot start or answer; the message says which part and why."""


@dataclass(frozen=True)
class ClusterStatus:
    running: bool
    alive_workers: int
    cores: int
    detail: str


def _pids(conf: LakehouseConf) -> dict[str, int]:
    pids = {}
    for f in sorted(conf.cluster_dir.glob("*.pid")):
        try:
            pid = int(f.read_text().strip())
        except ValueError:
            continue
        if pid_alive(pid):
            pids[f.stem] = pid
        else:
            f.unlink(missing_ok=True)
    return pids


def status(conf: LakehouseConf) -> ClusterStatus:
    """Whether the master answers, with its alive workers and their cores."""
    c = conf.cluster
    ui = f"http://{c.host}:{c.master_webui_port}"
    try:
        with urllib.request.urlopen(f"{ui}/json/", timeout=2) as r:
            state = json.loads(r.read())
    except (OSError, ValueError):
        up = f" (processes are up: starting, or stuck; see logs in {conf.cluster_dir})"
        detail = f"master {c.master_url} does not answer on {ui}" + (up if _pids(conf) else "")
        return ClusterStatus(False, 0, 0, detail)
    alive = [w for w in state.get("workers", []) if w.get("state") == "ALIVE"]
    cores = sum(int(w.get("cores", 0)) for w in alive)
    workers = f"{len(alive)} worker(s) alive, {cores} core(s)"
    detail = f"master {c.master_url} ({state.get('status')}), {workers}, UI {ui}"
    return ClusterStatus(True, len(alive), cores, detail)


def _launch(
    conf: LakehouseConf,
    name: str,
    main_class: str,
    *args: str,
    jvm: tuple[str, ...] = (),
    **options: object,
) -> None:
    """Start a deploy class with JVM options `jvm` and `--option value` flags; its pid goes to
    `<name>.pid`."""
    d, spark_home = conf.cluster_dir, Path(pyspark.__file__).parent
    env = {**os.environ, "SPARK_HOME": str(spark_home), "PYSPARK_PYTHON": sys.executable}
    env |= {"SPARK_LOCAL_IP": conf.cluster.host, "SPARK_LOG_DIR": str(d)}
    # the launcher that builds executor command lines wants it (spark-class sets it)
    env["SPARK_SCALA_VERSION"] = "2.13"
    flags = [s for k, v in options.items() for s in (f"--{k.replace('_', '-')}", str(v))]
    cmd = [java_executable(), "-Xmx512m", *jvm, "-cp", f"{spark_home}/jars/*", main_class]
    cmd += [*flags, *args]
    with open(d / f"{name}.out", "ab") as log:
        pid = Popen(cmd, stdout=log, stderr=STDOUT, env=env, cwd=d, start_new_session=True).pid
    (d / f"{name}.pid").write_text(str(pid))


def start(conf: LakehouseConf, quiet: bool = False) -> ClusterStatus:
    """Start the master and the workers (idempotent); return once every worker is registered."""
    say = (lambda *_: None) if quiet else print
    c = conf.cluster
    current = status(conf)
    if current.running and current.alive_workers >= c.workers:
        say(f"cluster: already running: {current.detail}")
        return current
    d = conf.cluster_dir
    d.mkdir(parents=True, exist_ok=True)
    pids = _pids(conf)
    workers = [f"worker-{i}" for i in range(1, c.workers + 1)]
    if "master" not in pids:
        ports = {"port": c.master_port, "webui_port": c.master_webui_port}
        cores = f"-Dspark.deploy.defaultCores={c.app_cores}"  # a job's tasks side by side
        _launch(conf, "master", MASTER, host=c.host, jvm=(cores,), **ports)
    for name in [w for w in workers if w not in pids]:
        (d / name).mkdir(exist_ok=True)
        _launch(
            conf,
            name,
            WORKER,
            c.master_url,
            host=c.host,
            cores=c.worker_cores,
            memory=c.worker_memory,
            work_dir=d / name,
            webui_port=0,
        )
    deadline = time.monotonic() + c.start_timeout_s
    while True:
        st = status(conf)
        if st.running and st.alive_workers >= c.workers:
            say(f"cluster: {st.detail}")
            return st
        alive = _pids(conf)
        dead = [n for n in ("master", *workers) if n not in alive]
        if dead or time.monotonic() > deadline:
            out = d / f"{dead[0] if dead else 'master'}.out"
            why = f"{', '.join(dead)} exited" if dead else f"not ready after {c.start_timeout_s}s"
            stop(conf, quiet=True)
            raise ClusterError(
                f"standalone cluster {c.master_url}: {why} ({st.detail}); "
                f"last lines of {out}:\n{tail(out, 5)}"
            )
        time.sleep(0.5)


def stop(conf: LakehouseConf, quiet: bool = False) -> None:
    """Stop the workers, then the master (idempotent)."""
    pids = _pids(conf)
    for name in sorted(pids, key=lambda n: n == "master"):
        terminate(pids[name], group=True, grace_s=30)
    for f in conf.cluster_dir.glob("*.pid"):
        f.unlink(missing_ok=True)
    if not quiet:
        print(f"cluster: stopped ({', '.join(sorted(pids)) or 'nothing was running'})")
