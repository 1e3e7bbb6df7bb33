"""The shared main of the layer jobs: their options, the configuration, a session, the query."""

from __future__ import annotations

import argparse
import os
import signal
import threading
import time
from collections.abc import Callable

from pyspark.sql import SparkSession

from pipelines import logs
from pipelines.config import LakehouseConf, load_config
from pipelines.errors import exit_on_known_errors
from pipelines.jobs.services import lineage_run, serve_metrics
from pipelines.kafka import check_reachable
from pipelines.local.processes import process_start
from pipelines.session import build_spark


def parse_args(argv: list[str] | None, prog: str, description: str) -> argparse.Namespace:
    """The options every layer's job takes."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--env", default=None, help="configuration environment (conf/<env>.yaml)")
    parser.add_argument("--stream", default="orders", help="stream name from the configuration")
    parser.add_argument("--once", action="store_true", help="process what is available, then stop")
    parser.add_argument("--quiet", action="store_true", help="only warnings and errors")
    return parser.parse_args(argv)


def run_layer_job(
    argv: list[str] | None,
    layer: str,
    run: Callable,
    doc: str,
    *,
    needs_kafka: bool = False,
    driver_memory: Callable[[LakehouseConf], str] | None = None,
) -> int:
    """A layer job's main: its options, the configuration, a session (its driver's memory
    `driver_memory(conf)` if given, else spark.driver_memory), then the layer's query."""
    args = parse_args(argv, prog=layer, description=doc.splitlines()[0])
    stop_with_runner()
    with exit_on_known_errors():
        conf = load_config(args.env)
        if driver_memory is not None:
            conf = conf.updated({"spark.driver_memory": driver_memory(conf)})
        logs.configure(conf.updated({"log.level": "WARN"}) if args.quiet else conf)
        if needs_kafka:
            check_reachable(conf)  # fail fast, naming the broker, before a JVM starts
        job = f"{layer}-{args.stream}"
        spark = build_spark(conf, app_name=f"lakehouse-{job}", job=job)
        with serve_metrics(conf, layer, args.stream), lineage_run(conf, layer, args.stream):
            run(spark, conf, args.stream, once=args.once, progress=not args.quiet)
    return 0


def run_table_job(
    argv: list[str] | None,
    prog: str,
    doc: str,
    work: Callable[[SparkSession, LakehouseConf, list[str] | None], object],
) -> int:
    """The main of a job on the tables as they are (quality, maintenance): --env, the tables
    (default: all), a session named `lakehouse-<prog>`, then `work`."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    parser.add_argument("--env", default=None, help="configuration environment (conf/<env>.yaml)")
    parser.add_argument("tables", nargs="*", help="only these tables, e.g. silver/orders")
    parser.add_argument("--json", action="store_true", help="print the outcome as JSON")
    args = parser.parse_args(argv)
    stop_with_runner()
    with exit_on_known_errors():
        conf = load_config(args.env)
        logs.configure(conf)
        done = work(build_spark(conf, app_name=f"lakehouse-{prog}"), conf, args.tables or None)
        if args.json:
            logs.print_json(done)
    return 0


def stop_with_runner() -> None:
    """A task of a job runner (LAKEHOUSE_RUNNER="pid:start") stops when the runner is gone, however
    it died: SIGTERM to itself (the query stops after its batch), SIGKILL after the grace period."""
    if not (runner := os.environ.get("LAKEHOUSE_RUNNER")):
        return
    pid, started = runner.split(":", 1)
    if started == "None":  # no /proc here: nothing to watch with
        return
    grace_s = float(os.environ.get("LAKEHOUSE_RUNNER_GRACE_S", "120"))

    def watch() -> None:
        while process_start(int(pid)) == started:
            time.sleep(1)
        logs.get("job").warning("the job runner (pid %s) is gone: stopping", pid)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="runner-watch", daemon=True).start()
