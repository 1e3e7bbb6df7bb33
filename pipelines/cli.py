"""`lakehouse`: set up, run the local broker, produce the reference stream, run the layers.

    lakehouse setup                       fetch the JVM jars (Delta, Kafka source, Kafka broker)
    lakehouse kafka start|stop|status     the local single-node KRaft broker
    lakehouse produce [options]           send the reference order stream (see --help)
    lakehouse run bronze [--once]         Kafka -> bronze/orders_raw, exactly once
    lakehouse run silver [--once]         bronze -> silver/order_events, orders, orders_quarantine
    lakehouse seed                        dimensions/products and customers from conf/seeds
    lakehouse run gold [--once]           silver -> gold windows and gold/late_events
    lakehouse dq [TABLE ...]              data-quality suites; results to quality/results and Data Docs
    lakehouse cluster start|stop|status   a Spark standalone cluster (master + workers) on this machine
    lakehouse jobs run SPEC [--param k=v]  a Databricks-style job spec, tasks as spark-submit
    lakehouse jobs validate SPEC          check a spec without running it
    lakehouse jobs runs [--run-id N]      the recorded runs, one line per task attempt
    lakehouse demo                        all of the above on the embedded default, with a summary
    lakehouse jars                        the jars for `spark-submit --jars`
    lakehouse config                      the effective configuration (secrets hidden)

Every command takes --env (default: $LAKEHOUSE_ENV or `local`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

from pipelines.config import LakehouseConf, load_config
from pipelines.errors import exit_on_known_errors

TWIST_DEFAULTS = {
    "redeliveries": 0.05,
    "out_of_order": 0.10,
    "late": 0.01,
    "invalid": 0.02,
    "null_keys": 0.03,
    "extra_fields": 0.05,
    "unknown_dimensions": 0.01,
}


def service_command(conf: LakehouseConf, name: str, action: str) -> int:
    """start | stop | status of the local broker (`kafka`) or the standalone cluster (`cluster`)."""
    import importlib

    service = importlib.import_module(
        "pipelines.local.broker" if name == "kafka" else "pipelines.local.cluster"
    )
    if action == "status":
        st = service.status(conf)
        print(f"{name}: {st.detail}")
        return 0 if st.running else 1
    getattr(service, action)(conf)
    return 0


def jobs_command(conf: LakehouseConf, args: argparse.Namespace) -> int:
    from pipelines.orchestration.runner import JobRunner, read_runs
    from pipelines.orchestration.spec import InvalidJobSpecError, load_job_spec

    if args.action == "runs":
        rows = read_runs(conf, args.run_id, args.limit)
        if not rows:
            print(f"no recorded runs in {conf.table_path('_jobs/runs')}")
            return 0
        print(f"{'run_id':<14} {'job':<20} {'task':<12} {'try':>3} {'state':<15} {'start (UTC)':<19} "
              f"{'secs':>7}  log / message")  # fmt: skip
        for r in rows:
            print(f"{r['run_id']:<14} {r['job']:<20} {r['task']:<12} {r['attempt']:>3} {r['state']:<15} "
                  f"{r['start_time']:%Y-%m-%d %H:%M:%S} {r['duration_s']:>7.1f}  "
                  f"{r['message'] or r['log_path']}")  # fmt: skip
        return 0
    spec = load_job_spec(args.spec)
    if args.action == "validate":
        print(f"job spec {args.spec} is valid: job {spec.name!r}, {len(spec.tasks)} tasks")
        for t in spec.tasks:
            after = f" after {', '.join(t.depends_on)} ({t.run_if})" if t.depends_on else ""
            print(f"  {t.key}: {t.python_file.name} {' '.join(t.parameters)}{after}")
        return 0
    params = {}
    for p in args.param:
        if "=" not in p:
            raise InvalidJobSpecError(f"--param {p!r}: expected NAME=VALUE")
        k, v = p.split("=", 1)
        params[k] = v
    run = JobRunner(conf, spec, parameters=params, grace_seconds=args.grace_seconds, master=args.master,
                    echo=lambda m: print(m, file=sys.stderr, flush=True)).run()  # fmt: skip
    return {"SUCCESS": 0, "CANCELED": 130}.get(run.state, 1)


def _add_produce_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--orders", type=int, help="number of orders (each 1-3 events)")
    p.add_argument("--seed", type=int, help="random seed: same seed, same records")
    p.add_argument("--topic", help="topic (default: the stream's topic)")
    p.add_argument("--start-time", help="event time of the first event, ISO-8601, or `now`")
    p.add_argument("--events-per-second", type=float, help="event-time pace of the stream")
    p.add_argument("--redeliveries", type=float, default=0.0, help="share of events re-sent")
    p.add_argument("--out-of-order", type=float, default=0.0, help="share of orders shuffled")
    p.add_argument("--late", type=float, default=0.0, help="share of events sent late")
    p.add_argument("--invalid", type=float, default=0.0, help="invalid records, share of events")
    p.add_argument("--null-keys", type=float, default=0.0, help="share of events with null key")
    p.add_argument("--extra-fields", type=float, default=0.0, help="share with unknown fields")
    p.add_argument(
        "--unknown-dimensions",
        type=float,
        default=0.0,
        help="share of events whose product/customer is not in the dimensions",
    )
    p.add_argument(
        "--all-twists",
        action="store_true",
        help="every twist at a realistic rate: "
        + ", ".join(f"{k.replace('_', '-')} {v}" for k, v in TWIST_DEFAULTS.items()),
    )
    p.add_argument("--report", type=Path, help="write the counts per kind as JSON here")
    p.add_argument("--manifest", type=Path, help="write every record (partition, offset, kind, "
                   "value) as JSON lines here")  # fmt: skip


def produce_command(conf: LakehouseConf, args: argparse.Namespace) -> dict:
    from pipelines.reference.orders_stream import StreamOptions, generate_orders_stream
    from pipelines.reference.producer import produce_plan, write_manifest

    stream = conf.stream(conf.producer.stream)
    rates = {k: getattr(args, k) for k in TWIST_DEFAULTS}
    if args.all_twists:
        rates = {k: (v or TWIST_DEFAULTS[k]) for k, v in rates.items()}
    start = args.start_time or conf.producer.start_time
    start_time = (
        datetime.now(UTC)
        if start == "now"
        else datetime.fromisoformat(start.replace("Z", "+00:00"))
    )
    options = StreamOptions(
        orders=args.orders if args.orders is not None else conf.producer.orders,
        seed=args.seed if args.seed is not None else conf.producer.seed,
        partitions=stream.partitions,
        start_time=start_time,
        events_per_second=args.events_per_second or conf.producer.events_per_second,
        redelivery_rate=rates["redeliveries"],
        out_of_order_rate=rates["out_of_order"],
        late_rate=rates["late"],
        invalid_rate=rates["invalid"],
        null_key_rate=rates["null_keys"],
        extra_field_rate=rates["extra_fields"],
        unknown_dimension_rate=rates["unknown_dimensions"],
    )
    plan = generate_orders_stream(options)
    track = args.manifest is not None
    report = produce_plan(conf, plan, args.topic or stream.topic, track=track, progress=True)
    summary = report.summary()
    print(json.dumps(summary, indent=2))
    if args.report:
        args.report.write_text(json.dumps(summary, indent=2) + "\n")
    if args.manifest:
        write_manifest(report, args.manifest)
    return summary


def _effective(conf: LakehouseConf) -> dict:
    return dataclasses.asdict(conf)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="lakehouse", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--env", default=None, help="configuration environment (conf/<env>.yaml)")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("setup", help="fetch the JVM jars once")
    kafka = sub.add_parser("kafka", help="the local Kafka broker")
    kafka.add_argument("action", choices=["start", "stop", "status"])
    produce = sub.add_parser("produce", help="send the reference order stream")
    _add_produce_args(produce)
    run = sub.add_parser("run", help="run a layer's job")
    run.add_argument("layer", choices=["bronze", "silver", "gold"])
    run.add_argument("--stream", default="orders")
    run.add_argument("--once", action="store_true", help="process what is available, then stop")
    run.add_argument("--quiet", action="store_true")
    demo = sub.add_parser("demo", help="the main job on the embedded default")
    demo.add_argument("--orders", type=int, default=None)
    sub.add_parser("seed", help="load the dimension tables from the seed files")
    dq = sub.add_parser("dq", help="run the data-quality suites (Great Expectations)")
    dq.add_argument("tables", nargs="*", help="only these tables, e.g. silver/orders")
    cluster = sub.add_parser("cluster", help="a Spark standalone cluster on this machine")
    cluster.add_argument("action", choices=["start", "stop", "status"])
    jobs = sub.add_parser("jobs", help="Databricks-style multi-task jobs on open-source Spark")
    jobs_sub = jobs.add_subparsers(dest="action", required=True)
    jobs_run = jobs_sub.add_parser("run", help="run a job spec (conf/jobs/*.yaml)")
    jobs_run.add_argument("spec", type=Path)
    jobs_run.add_argument(
        "--param",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a job parameter (repeatable)",
    )
    jobs_run.add_argument(
        "--master",
        help="run every task on this Spark master, e.g. spark://127.0.0.1:7077 "
        "(default: the spec's cluster settings)",
    )
    jobs_run.add_argument(
        "--grace-seconds",
        type=float,
        default=120,
        help="how long a stopped task may take to stop before SIGKILL",
    )
    jobs_validate = jobs_sub.add_parser("validate", help="check a job spec")
    jobs_validate.add_argument("spec", type=Path)
    jobs_runs = jobs_sub.add_parser("runs", help="list recorded runs")
    jobs_runs.add_argument("--run-id", type=int)
    jobs_runs.add_argument("--limit", type=int, default=10, help="newest runs to show")
    sub.add_parser("jars", help="comma-separated jars for spark-submit --jars")
    sub.add_parser("config", help="print the effective configuration")
    args = parser.parse_args(argv)

    with exit_on_known_errors():
        conf = load_config(args.env)
        if args.command == "setup":
            from pipelines.local import jars

            jars.main()
        elif args.command in ("kafka", "cluster"):
            return service_command(conf, args.command, args.action)
        elif args.command == "produce":
            produce_command(conf, args)
        elif args.command == "run":
            import importlib

            job = importlib.import_module(f"pipelines.jobs.{args.layer}_job")
            flags = ["--stream", args.stream] + (["--once"] if args.once else [])
            flags += ["--quiet"] if args.quiet else []
            return job.main((["--env", conf.env] if args.env else []) + flags)
        elif args.command == "demo":
            from pipelines.reference.demo import run_demo

            run_demo(conf, orders=args.orders)
        elif args.command == "seed":
            from pipelines.layers.gold import seed_dimensions
            from pipelines.streaming.spark import build_spark

            counts = seed_dimensions(build_spark(conf, app_name="lakehouse-seed"), conf)
            print(", ".join(f"dimensions/{k}: {v:,} rows" for k, v in counts.items()))
        elif args.command == "dq":
            from pipelines.jobs import quality_job

            return quality_job.main((["--env", conf.env] if args.env else []) + list(args.tables))
        elif args.command == "jobs":
            return jobs_command(conf, args)
        elif args.command == "jars":
            from pipelines.local.jars import spark_jars

            print(",".join(str(j) for j in spark_jars()))
        elif args.command == "config":
            print(json.dumps(_effective(conf), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
