"""`lakehouse`: the local broker and cluster, the reference stream, the layers, and jobs.

    lakehouse [--env NAME] [--log-level LEVEL] COMMAND [options]
    lakehouse COMMAND --help                  a command's options

--env and --log-level may also follow the command; --env defaults to $LAKEHOUSE_ENV, else `local`.
The exit code says what kind of failure it was: `pipelines.errors.ExitCode`, listed in
docs/operations.md, 'Exit codes'.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib
import json
import os
import sys
from dataclasses import replace
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path

from pipelines import logs
from pipelines.config import LakehouseConf, load_config
from pipelines.errors import ExitCode, exit_on_known_errors

LOG_LEVELS = ("ERROR", "WARN", "INFO", "DEBUG")
SERVICE_ACTIONS = ("start", "stop", "status")
SERVICES = {  # command: module, help
    "kafka": (
        "pipelines.local.broker",
        "the local KRaft broker (or cluster: local_broker.brokers)",
    ),
    "cluster": ("pipelines.local.cluster", "a Spark standalone cluster (master + workers) here"),
    "storage": ("pipelines.local.s3", "a local S3 endpoint (S3Proxy) for an s3a:// storage root"),
    "metastore": ("pipelines.local.metastore", "a Hive metastore for catalog.metastore: hive"),
    "history": ("pipelines.local.history", "Spark's History Server on the layer jobs' event logs"),
}
TWISTS = {  # --option: the StreamOptions rate it sets, help
    "redeliveries": ("redelivery_rate", "share of events re-sent"),
    "out_of_order": ("out_of_order_rate", "share of orders shuffled"),
    "late": ("late_rate", "share of events sent late"),
    "invalid": ("invalid_rate", "invalid records, share of events"),
    "null_keys": ("null_key_rate", "share of events with null key"),
    "extra_fields": ("extra_field_rate", "share with unknown fields"),
    "unknown_dimensions": ("unknown_dimension_rate", "share with an unknown product/customer"),
}


def service_command(conf: LakehouseConf, args: argparse.Namespace) -> int | None:
    """start | stop | status of the local broker (`kafka`), the standalone cluster (`cluster`)
    or the local S3 endpoint (`storage`)."""
    service = importlib.import_module(SERVICES[args.command][0])
    if args.action == "status":
        st = service.status(conf)
        if args.json:
            logs.print_json({"service": args.command, **dataclasses.asdict(st)})
        else:
            print(f"{args.command}: {st.detail}")
        return ExitCode.OK if st.running else ExitCode.UNREACHABLE
    if getattr(args, "node", None) is not None:  # one node of the local cluster
        if args.action != "stop":
            print("kafka: --node goes with `lakehouse kafka stop` only", file=sys.stderr)
            return ExitCode.USAGE
        service.stop(conf, node=args.node)
        return None
    getattr(service, args.action)(conf)
    return None


def jobs_runs(conf: LakehouseConf, args: argparse.Namespace) -> None:
    from pipelines.orchestration.runs import read_runs, runs_table

    rows = read_runs(conf, args.run_id, args.limit)
    if args.json:
        logs.print_json(rows)
        return
    if not rows:
        print(f"no recorded runs in {runs_table(conf)}")
        return
    job = max(len("job"), *(len(r["job"]) for r in rows))  # columns as wide as their values
    task = max(len("task"), *(len(r["task"]) for r in rows))
    print(
        f"{'run_id':<14} {'job':<{job}} {'task':<{task}} try {'state':<15} {'start (UTC)':<19} "
        "   secs  log / message"
    )
    for r in rows:
        print(
            f"{r['run_id']:<14} {r['job']:<{job}} {r['task']:<{task}} {r['attempt']:>3} "
            f"{r['state']:<15} {r['start_time']:%Y-%m-%d %H:%M:%S} {r['duration_s'] or 0:>7.1f}  "
            f"{r['message'] or r['log_path']}"
        )


def _load_spec(conf: LakehouseConf, args: argparse.Namespace):
    from pipelines.orchestration.bundle import BundleChoice
    from pipelines.orchestration.spec import InvalidJobSpecError, load_job_spec

    if bad := [v for v in args.var if "=" not in v]:
        raise InvalidJobSpecError(f"--var {bad[0]!r}: expected NAME=VALUE")
    variables = dict(v.split("=", 1) for v in args.var)
    choice = BundleChoice(args.job, args.target, variables)
    return load_job_spec(args.spec, clusters=conf.jobs.clusters, bundle=choice)


def jobs_validate(conf: LakehouseConf, args: argparse.Namespace) -> int | None:
    from pipelines.orchestration.spec import InvalidJobSpecError

    try:
        spec = _load_spec(conf, args)
    except InvalidJobSpecError as e:
        if not args.json:
            raise
        listed = [line.strip()[2:] for line in str(e).splitlines() if line.startswith("  - ")]
        logs.print_json({"spec": args.spec, "valid": False, "problems": listed or [str(e)]})
        return ExitCode.CONFIG
    if args.json:
        tasks = [
            {"key": t.key, "python_file": t.python_file, "parameters": t.parameters}
            | {"depends_on": t.depends_on, "run_if": t.run_if}
            for t in spec.tasks
        ]
        shown = {"spec": args.spec, "valid": True, "job": spec.name, "tasks": tasks}
        logs.print_json(shown | {"warnings": spec.warnings})
        return None
    for w in spec.warnings:
        print(f"warning: {w}", file=sys.stderr)
    print(f"job spec {args.spec} is valid: job {spec.name!r}, {len(spec.tasks)} tasks")
    for t in spec.tasks:
        after = f" after {', '.join(t.depends_on)} ({t.run_if})" if t.depends_on else ""
        print(f"  {t.key}: {t.python_file.name} {' '.join(t.parameters)}{after}")
    return None


def job_environment(
    conf: LakehouseConf, declared: dict[str, str], params: dict[str, str]
) -> tuple[LakehouseConf, dict[str, str]]:
    """The runner and a job's tasks share one environment: a declared `env` parameter left unset
    is the runner's (`--env`, else $LAKEHOUSE_ENV), and one that is set is the runner's too, so
    the run's records and logs sit beside the tables its tasks write."""
    if "env" not in declared:
        return conf, params
    if params.setdefault("env", conf.env) != conf.env:
        conf = load_config(params["env"])
    return conf, params


def _job(conf: LakehouseConf, args: argparse.Namespace):
    """The spec, the environment its tasks run in and the runner's options, from the arguments."""
    from pipelines.orchestration.spec import InvalidJobSpecError

    spec = _load_spec(conf, args)
    if bad := [p for p in args.param if "=" not in p]:
        raise InvalidJobSpecError(f"--param {bad[0]!r}: expected NAME=VALUE")
    conf, params = job_environment(conf, spec.parameters, dict(p.split("=", 1) for p in args.param))
    echo = functools.partial(print, file=sys.stderr, flush=True)
    for w in spec.warnings:
        echo(f"warning: {w}")
    options = {"grace_seconds": args.grace_seconds, "master": args.master, "echo": echo}
    return conf, spec, {"parameters": params, **options}


def jobs_run(conf: LakehouseConf, args: argparse.Namespace) -> int:
    from pipelines.orchestration.runner import JobRunner
    from pipelines.orchestration.runs import RunState

    conf, spec, options = _job(conf, args)
    run = JobRunner(conf, spec, **options).run()
    print(f"run {run.run_id} {run.state}")  # the run id, for `lakehouse jobs runs --run-id`
    exits = {RunState.SUCCESS: ExitCode.OK, RunState.CANCELED: ExitCode.INTERRUPTED}
    exits[RunState.SUCCESS_WITH_FAILURES] = ExitCode.OK  # its leaf tasks succeeded
    return exits.get(run.state, ExitCode.JOB_FAILED)


def jobs_schedule(conf: LakehouseConf, args: argparse.Namespace) -> int:
    from pipelines.orchestration.runner import run_on_schedule
    from pipelines.orchestration.runs import RunState
    from pipelines.orchestration.schedule import Schedule

    conf, spec, options = _job(conf, args)
    cron = Schedule(args.cron, args.timezone or "UTC") if args.cron else None
    runs = run_on_schedule(conf, spec, cron, runs=args.runs, **options)
    ok = (RunState.SUCCESS, RunState.SUCCESS_WITH_FAILURES, RunState.CANCELED)
    failed = [r for r in runs if r.state not in ok]
    return ExitCode.JOB_FAILED if failed else ExitCode.OK


def produce(conf: LakehouseConf, args: argparse.Namespace) -> None:
    from pipelines.reference import orders_stream
    from pipelines.reference.producer import produce_plan, write_manifest

    stream, p = conf.stream(conf.producer.stream), conf.producer
    rates = {rate: getattr(args, name) for name, (rate, _) in TWISTS.items()}
    if args.all_twists:
        rates = {rate: r or orders_stream.REALISTIC_TWISTS[rate] for rate, r in rates.items()}
    start = args.start_time or p.start_time
    options = orders_stream.StreamOptions(
        orders=p.orders if args.orders is None else args.orders,
        seed=p.seed if args.seed is None else args.seed,
        partitions=stream.partitions,
        start_time=datetime.now(UTC) if start == "now" else datetime.fromisoformat(start),
        events_per_second=args.events_per_second or p.events_per_second,
        **rates,
    )
    plan, topic = orders_stream.generate_orders_stream(options), args.topic or stream.topic
    if start == "now":  # the stream ends now: no event time ahead of the clock it is sent by
        span = orders_stream.event_time_span(plan)
        plan = orders_stream.generate_orders_stream(
            replace(options, start_time=options.start_time - span)
        )
    report = produce_plan(conf, plan, topic, track=args.manifest is not None, progress=True)
    summary = json.dumps(report.summary(), indent=2)
    print(summary)
    if args.report:
        args.report.write_text(summary + "\n")
    if args.manifest:
        write_manifest(report, args.manifest)


def run_layer(conf: LakehouseConf, args: argparse.Namespace) -> int:
    job = importlib.import_module(f"pipelines.jobs.{args.layer}_job")
    flags = ["--env", conf.env, "--stream", args.stream]
    return job.main(flags + ["--once"] * args.once + ["--quiet"] * args.quiet)


def seed(conf: LakehouseConf, args: argparse.Namespace) -> None:
    from pipelines.layers.gold import seed_dimensions
    from pipelines.session import build_spark

    counts = seed_dimensions(build_spark(conf, app_name="lakehouse-seed"), conf)
    print(", ".join(f"dimensions/{k}: {v:,} rows" for k, v in counts.items()))


def dq(conf: LakehouseConf, args: argparse.Namespace) -> int:
    from pipelines.jobs import quality_job

    return quality_job.main(["--env", conf.env, *["--json"] * args.json, *args.tables])


def maintain(conf: LakehouseConf, args: argparse.Namespace) -> int:
    from pipelines.jobs import maintenance_job

    return maintenance_job.main(["--env", conf.env, *args.tables])


def demo(conf: LakehouseConf, args: argparse.Namespace) -> None:
    from pipelines.reference.demo import run_demo

    run_demo(conf, orders=args.orders)


def setup(conf: LakehouseConf, args: argparse.Namespace) -> None:
    from pipelines.local import cds, jars

    jars.main()
    if archive := cds.create():
        print(f"spark driver: class-data archive {archive}")


def jars(conf: LakehouseConf, args: argparse.Namespace) -> None:
    from pipelines.local.jars import spark_jars

    print(",".join(str(j) for j in spark_jars(s3=conf.uses_s3)))


def sql(conf: LakehouseConf, args: argparse.Namespace) -> int:
    """Run one SQL statement on the lakehouse's tables (by name) and print its result."""
    from pyspark.errors import AnalysisException

    from pipelines.session import build_spark

    spark = build_spark(conf, app_name="lakehouse-sql")
    try:
        frame = spark.sql(args.statement)
        rows = frame.limit(args.limit + 1).collect() if frame.columns else []
    except AnalysisException as e:  # a wrong name or statement: Spark's message, no trace
        print(f"error: {e.getMessage() if hasattr(e, 'getMessage') else e}", file=sys.stderr)
        return ExitCode.USAGE
    more, rows = len(rows) > args.limit, rows[: args.limit]
    if args.json:
        print(json.dumps([r.asDict(recursive=True) for r in rows], default=str))
    else:
        print(format_table(frame.columns, [list(r) for r in rows]), end="")
    if more:
        print(f"(only the first {args.limit:,} rows: --limit)", file=sys.stderr)
    return ExitCode.OK


def format_table(columns: list[str], rows: list[list]) -> str:
    """`columns` and `rows` as a text table, as Spark's `show` draws one (values not cut)."""
    if not columns:
        return ""
    cells = [columns] + [[_cell(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(columns))]
    rule = "+" + "+".join("-" * w for w in widths) + "+"
    lines = [
        "|" + "|".join(v.rjust(w) for v, w in zip(row, widths, strict=True)) + "|" for row in cells
    ]
    return "\n".join([rule, lines[0], rule, *lines[1:], rule]) + "\n"


def _cell(value: object) -> str:
    """A value as Spark's `show` prints it."""
    if value is None:
        return "NULL"
    return str(value).lower() if isinstance(value, bool) else str(value)


def spark_sql(conf: LakehouseConf, args: argparse.Namespace) -> None:
    """Replace this process with Spark's own `spark-sql` shell, set up like every job's session."""
    from pipelines.local.cds import driver_java_options
    from pipelines.local.jars import spark_jars
    from pipelines.spark_conf import session_settings

    # the session's catalog settings also keep Spark's shell off its default Hive metastore in
    # ./metastore_db, which one JVM at a time may open
    settings = session_settings(conf)
    cmd = [str(Path(sys.executable).with_name("spark-sql")), "--master", conf.spark.master]
    cmd += ["--driver-memory", settings.pop("spark.driver.memory")]
    cmd += ["--jars", ",".join(str(j) for j in spark_jars(s3=conf.uses_s3))]
    cmd += ["--driver-java-options", driver_java_options(json_logs=conf.log.format == "json")]
    cmd += [arg for key, value in settings.items() for arg in ("--conf", f"{key}={value}")]
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.execv(cmd[0], [*cmd, *args.args])


def metrics_targets(conf: LakehouseConf, args: argparse.Namespace) -> None:
    """Write the jobs' metrics endpoints as a Prometheus file_sd file."""
    target = args.out or conf.targets_file
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.tmp")
    groups = conf.metric_targets()
    partial.write_text(json.dumps(groups, indent=2) + "\n")
    partial.replace(target)
    print(f"metrics: {len(groups)} targets in {target}")


def config(conf: LakehouseConf, args: argparse.Namespace) -> None:
    from pipelines.config import leaf_values

    values = conf.as_dict()
    if not args.show_origin:
        logs.print_json(values)
        return
    print(f"# environment {values.pop('env')}: {values.pop('source')}")
    for key, value in leaf_values(values):
        print(f"{key} = {json.dumps(value)}  ({conf.origin(key)})")


def _positive(text: str) -> int:
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return int(text)


def common_options(*, defaults: bool) -> argparse.ArgumentParser:
    """--env and --log-level: on the main parser, and on every command without defaults, so
    that given after the command they override and not given they leave the main parser's."""
    p = argparse.ArgumentParser(add_help=False)
    default = None if defaults else argparse.SUPPRESS
    p.add_argument("--env", default=default, help="configuration environment (conf/<env>.yaml)")
    levels = "log level of Python and Spark, also in the jobs this command starts"
    p.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=default, help=levels)
    return p


def spec_arguments(p: argparse.ArgumentParser) -> None:
    """A job spec, or a bundle and which of its jobs."""
    p.add_argument("spec", type=Path, help="a job spec, or a bundle's databricks.yml")
    p.add_argument("--job", help="the bundle's job (its key under resources.jobs)")
    p.add_argument("--target", help="the bundle's target (default: its default one)")
    p.add_argument("--var", action="append", default=[], metavar="NAME=VALUE", help="repeatable")


def job_arguments(p: argparse.ArgumentParser) -> None:
    """A job spec and how its tasks run."""
    spec_arguments(p)
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="repeatable")
    p.add_argument("--master", help="every task on this master, e.g. spark://127.0.0.1:7077")
    p.add_argument("--grace-seconds", type=float, default=120, help="time to stop before SIGKILL")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lakehouse",
        description=__doc__,
        parents=[common_options(defaults=True)],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {version('streaming-lakehouse')}"
    )
    common = [common_options(defaults=False)]
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, func, help: str, subs=sub) -> argparse.ArgumentParser:
        p = subs.add_parser(name, help=help, parents=common)
        p.set_defaults(func=func)
        return p

    command(
        "setup",
        setup,
        "fetch the JVM jars (Delta, Kafka source, S3A, Kafka, S3Proxy), archive Spark's classes",
    )
    for name, (_, help) in SERVICES.items():
        p = command(name, service_command, help)
        p.add_argument("action", choices=SERVICE_ACTIONS)
        p.add_argument("--json", action="store_true", help="status as a JSON object")
        if name == "kafka":
            p.add_argument("--node", type=int, help="stop only this node of the local cluster")
    p = command("produce", produce, "send the reference order stream, with its twists")
    p.add_argument("--orders", type=_positive, help="number of orders (each 1-3 events)")
    p.add_argument("--seed", type=int, help="random seed: same seed, same records")
    p.add_argument("--topic", help="topic (default: the stream's topic)")
    p.add_argument(
        "--start-time",
        help="event time of the first event, ISO-8601, or `now`: the stream's event times end now",
    )
    p.add_argument("--events-per-second", type=float, help="event-time pace of the stream")
    for name, (_, help) in TWISTS.items():
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=0.0, help=help)
    p.add_argument("--all-twists", action="store_true", help="every twist at a realistic rate")
    p.add_argument("--report", type=Path, help="write the counts per kind as JSON here")
    p.add_argument("--manifest", type=Path, help="write every record as JSON lines here")
    p = command(
        "run", run_layer, "a layer's job: Kafka -> bronze -> silver -> gold -> publish (to Kafka)"
    )
    p.add_argument("layer", choices=["bronze", "silver", "gold", "pipeline", "publish"])
    p.add_argument("--stream", default="orders")
    p.add_argument("--once", action="store_true", help="process what is available, then stop")
    p.add_argument("--quiet", action="store_true", help="only warnings and errors")
    p = command("demo", demo, "the whole pipeline on the embedded default, with a summary")
    p.add_argument("--orders", type=_positive)
    command("seed", seed, "dimensions/products and customers from conf/seeds")
    p = command("dq", dq, "data-quality suites; results to quality/results and Data Docs")
    p.add_argument("--json", action="store_true", help="the suites' outcomes as a JSON array")
    p.add_argument("tables", nargs="*", help="only these tables, e.g. silver/orders")
    p = command("maintain", maintain, "compact small files, remove old ones, checkpoint the logs")
    p.add_argument("tables", nargs="*", help="only these tables, e.g. silver/orders")
    jobs = sub.add_parser(
        "jobs", help="Databricks-style multi-task jobs on open-source Spark", parents=common
    ).add_subparsers(dest="action", required=True)
    p = command("run", jobs_run, "a job spec (conf/jobs/*.yaml), its tasks as spark-submit", jobs)
    job_arguments(p)
    p = command("schedule", jobs_schedule, "run a job spec at each time of its schedule", jobs)
    job_arguments(p)
    p.add_argument("--cron", help="a Quartz cron expression instead of the spec's schedule")
    p.add_argument("--timezone", help="the --cron expression's time zone (default UTC)")
    p.add_argument("--runs", type=int, help="stop after this many runs (default: run for ever)")
    p = command("validate", jobs_validate, "check a job spec without running it", jobs)
    spec_arguments(p)
    p.add_argument("--json", action="store_true", help="the spec's tasks as a JSON object")
    p = command("runs", jobs_runs, "the recorded runs, one line per task attempt", jobs)
    p.add_argument("--json", action="store_true", help="the attempts as a JSON array")
    p.add_argument("--run-id", type=int)
    p.add_argument("--limit", type=_positive, default=10, help="newest runs to show")
    p = command("sql", sql, "run a SQL statement on the tables by name, e.g. silver.orders")
    p.add_argument("statement", help='e.g. "SELECT status, count(*) FROM silver.orders GROUP BY 1"')
    p.add_argument("--json", action="store_true", help="print the rows as a JSON array")
    p.add_argument("--limit", type=_positive, default=1000, help="print at most this many rows")
    command(
        "spark-sql",
        spark_sql,
        "Spark's spark-sql shell with the tables by name; what follows is spark-sql's own "
        "(e.g. -e 'SHOW TABLES IN silver')",
    )
    metrics = sub.add_parser(
        "metrics", help="the layer jobs' Prometheus metrics", parents=common
    ).add_subparsers(dest="action", required=True)
    p = command("targets", metrics_targets, "write their endpoints as a file_sd file", metrics)
    p.add_argument("--out", type=Path, help="the file (default: metrics.targets_file)")
    command("jars", jars, "comma-separated jars for spark-submit --jars")
    p = command("config", config, "print the effective configuration (secrets hidden)")
    p.add_argument("--json", action="store_true", help="as JSON (the default)")
    p.add_argument("--show-origin", action="store_true", help="each value, and where it came from")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    passed = []  # spark-sql's own arguments, after the command
    if "spark-sql" in argv and "--help" not in argv[argv.index("spark-sql") + 1 :][:1]:
        at = argv.index("spark-sql") + 1
        argv, passed = argv[:at], argv[at:]
    args = build_parser().parse_args(argv)
    args.args = passed
    if args.log_level:  # through the configuration: also in the jobs this command starts
        os.environ["LAKEHOUSE__SPARK__LOG_LEVEL"] = args.log_level
        os.environ["LAKEHOUSE__LOG__LEVEL"] = args.log_level
    with exit_on_known_errors():
        conf = load_config(args.env)
        logs.configure(conf)
        return args.func(conf, args) or ExitCode.OK


if __name__ == "__main__":
    sys.exit(main())
