"""Spark's History Server on the layer jobs' event logs, from pyspark's own jars.

`lakehouse history start | stop | status`: Spark's own UI for every layer job, finished or
running (`event_log` in the configuration), at http://127.0.0.1:18080 by default, with its REST
API under /api/v1. It compacts a job's older rolled log files and deletes the logs of jobs older
than `event_log.max_age_hours`. pip's pyspark ships no start script: the class runs directly.
"""

from __future__ import annotations

import json
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pyspark

from pipelines.config import LakehouseConf
from pipelines.errors import JobFailedError
from pipelines.local.jars import java_executable, s3a_jars
from pipelines.local.processes import pid_of, port_in_use, start_service, stop_service
from pipelines.local.s3 import ensure_folder
from pipelines.local.tls import write_private
from pipelines.spark_conf import LOG4J2, history_server_settings

MAIN = "org.apache.spark.deploy.history.HistoryServer"
START_TIMEOUT_S = 60
LISTING_WAIT_S = 60


class HistoryServerError(JobFailedError):
    """The History Server cannot start; the message says why, with its log's last lines."""


@dataclass(frozen=True)
class HistoryStatus:
    running: bool
    pid: int | None
    url: str
    detail: str


def url(conf: LakehouseConf) -> str:
    return f"http://127.0.0.1:{conf.event_log.history_port}"


def _paths(conf: LakehouseConf) -> dict[str, Path]:
    d = conf.history_dir / conf.env
    return {"dir": d, "pid": d / "history.pid", "props": d / "history.conf", "out": d / "out.log"}


def listed_all(conf: LakehouseConf) -> bool:
    """Whether the server has scanned the log folder once and parsed every log it found: its
    page shows "Last updated" after a scan, and counts the logs still being parsed."""
    try:
        with urllib.request.urlopen(url(conf), timeout=5) as r:
            page = r.read().decode("utf-8", "replace")
    except OSError:
        return False
    return 'id="last-updated"' in page and "additional applications getting listed" not in page


def applications(conf: LakehouseConf) -> list[dict] | None:
    """The applications the server lists (REST API), newest first; None if it does not answer."""
    try:
        with urllib.request.urlopen(f"{url(conf)}/api/v1/applications", timeout=5) as r:
            return json.loads(r.read())
    except (OSError, ValueError):
        return None


def status(conf: LakehouseConf) -> HistoryStatus:
    p = _paths(conf)
    pid, where = pid_of(p["pid"], MAIN, str(p["props"])), url(conf)
    if pid is None:
        port = conf.event_log.history_port
        busy = port_in_use("127.0.0.1", port)
        return HistoryStatus(False, None, where, f"port {port} is used" if busy else "not running")
    if (apps := applications(conf)) is None:
        return HistoryStatus(False, pid, where, f"process {pid} is up but not answering at {where}")
    detail = f"running (pid {pid}) at {where}, {len(apps)} application(s) in {conf.event_log_dir}"
    return HistoryStatus(True, pid, where, detail)


def start(conf: LakehouseConf, *, quiet: bool = False) -> HistoryStatus:
    """Start the server unless it runs, and wait until it lists every application."""
    say = (lambda *_: None) if quiet else print
    p = _paths(conf)
    p["dir"].mkdir(parents=True, exist_ok=True)
    settings = history_server_settings(conf)
    write_private(p["props"], "".join(f"{k}={v}\n" for k, v in settings.items()))
    current = status(conf)
    if current.running:
        say(f"history: already {current.detail}")
        return current
    if current.pid is None and port_in_use("127.0.0.1", conf.event_log.history_port):
        raise HistoryServerError(f"cannot start the History Server at {current.url}: port in use")
    ensure_folder(conf, conf.event_log_dir)  # Spark's server refuses a folder that is missing
    classpath = [f"{Path(pyspark.__file__).parent}/jars/*"]
    if conf.event_log_dir.startswith("s3a://"):
        classpath += [str(j) for j in s3a_jars()]
    cmd = [java_executable(), "-Xmx512m", f"-Dlog4j2.configurationFile=file:{LOG4J2}"]
    cmd += ["-cp", ":".join(classpath), MAIN, "--properties-file", str(p["props"])]
    say(f"history: starting Spark's History Server at {current.url} on {conf.event_log_dir}")
    start_service(
        cmd,
        what=f"the History Server at {current.url}",
        log=p["out"],
        pid_file=p["pid"],
        ready=lambda: applications(conf) is not None,
        timeout_s=START_TIMEOUT_S,
        error=HistoryServerError,
    )
    # then until what it lists is every application in the folder (a folder of many logs may take
    # longer: the server is up, and says so, while it parses the rest)
    deadline = time.monotonic() + LISTING_WAIT_S
    while not (done := listed_all(conf)) and time.monotonic() < deadline:
        time.sleep(0.2)
    st = status(conf)
    say(f"history: {st.detail}" + ("" if done else "; still reading some event logs"))
    return st


def stop(conf: LakehouseConf, *, quiet: bool = False) -> None:
    p = _paths(conf)
    done = stop_service("history", pid_of(p["pid"], MAIN, str(p["props"])), p["pid"])
    if not quiet:
        print(done)
