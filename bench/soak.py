"""Soak: the three layer jobs for hours at a steady rate, maintenance on its schedule, every
resource sampled each minute; what grows, and by how much per hour.

Usage:
    .venv/bin/python -m bench.soak [--minutes 60] [--rate 1000] [--maintain-every 10]
    .venv/bin/python -m bench.soak --report bench/results/soak-<time>.json   # its report again

Runs the shipped specs as users do: `lakehouse jobs run conf/jobs/orders_continuous.yaml` (setup,
then bronze, silver and gold as continuous jobs) and `lakehouse jobs schedule
conf/jobs/maintenance.yaml` (at every `--maintain-every` minutes here; hourly as shipped), on a
fresh root and topic, while a paced producer sends the reference stream with every twist. Every
`--sample-seconds` it samples, without a Spark job of its own:

- each layer job's JVM: heap after a full GC (`jcmd GC.run`, then `jstat`), metaspace, and the
  RSS, open files and threads of the job's processes (the JVM and its Python driver);
- each table: files and bytes on storage (data, and its `_delta_log`), the files of its current
  version; each checkpoint, the event logs and the tasks' own logs: files and bytes;
- the Kafka lag (produced offsets less the offsets bronze's checkpoint committed), and how far
  silver and gold are behind their source table (versions, and the age of the oldest commit they
  have not read);
- batch durations per query over the interval (the progress table), and freshness: bronze's
  newest Kafka timestamp against now, then silver's and gold's time behind their source added.

After `--warmup-minutes` the growth per hour of each figure is a least-squares slope. Figures
allowed to grow (the data, the Delta logs within their retention, the rows of the progress, runs
and quality tables, the rolled event logs within their bound) are marked so; every other figure
should be flat, and the report names each one that is not. Figures go to bench/RESULTS.md and
bench/results/soak-<time>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable as DeltaLake

from bench.backlog import RESULTS, commit, fresh, generate, record
from bench.pipeline_job import REPO, job_env, produced
from pipelines.config import LakehouseConf, load_config
from pipelines.local import broker, history
from pipelines.local.processes import die_with_parent
from pipelines.reference.orders_stream import StreamPlan, with_every_twist
from pipelines.reference.producer import produce_plan
from pipelines.streaming.checkpoints import source_offsets
from pipelines.streaming.delta import commit_time_ms

LAYERS = ("bronze", "silver", "gold")
# a JVM's figures in the summary (the samples hold Native Memory Tracking's categories too)
JVM_FIGURES = (
    "heap_after_gc_mb",
    "heap_committed_mb",
    "metaspace_mb",
    "jvm_rss_mb",
    "untracked_native_mb",
    "rss_mb",
    "jvm_threads",
    "open_files",
)
# figures that may grow, and why; every other one should be flat after the warm-up
ALLOWED = {
    "data": "the data itself (and files a version within the VACUUM retention still needs)",
    "log": "Delta log JSON within its retention (30 days), checkpointed by maintenance",
    "rows": "rows of the progress, runs and quality tables",
    "events": "Spark event logs: rolled; the History Server compacts each job's beyond "
    "event_log.max_files_to_retain",
    "task logs": "the tasks' own output: rotated at log.task_max_mb, log.task_backups copies kept",
}


def _proc(pid: int, name: str) -> str:
    try:
        return Path(f"/proc/{pid}/{name}").read_text()
    except OSError:
        return ""


def _status(pid: int, key: str) -> int:
    m = re.search(rf"^{key}:\s+(\d+)", _proc(pid, "status"), re.M)
    return int(m.group(1)) if m else 0


def descendants(pid: int) -> list[int]:
    """`pid` and every process under it (the children of each of its threads: the JVM starts
    the Python driver from a thread of its own)."""
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        found.append(p)
        threads = Path(f"/proc/{p}/task")
        for tid in threads.iterdir() if threads.exists() else ():
            todo += [int(c) for c in _proc(p, f"task/{tid.name}/children").split()]
    return found


def job_jvms(root: str) -> dict[str, int]:
    """The driver JVM of each layer job on this root: SparkSubmit with `--name <task>`."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        args = _proc(int(entry.name), "cmdline").split("\0")
        if "org.apache.spark.deploy.SparkSubmit" not in args or root not in " ".join(args):
            continue
        if "--name" in args:
            found[args[args.index("--name") + 1]] = int(entry.name)
    return found


def jvm_figures(pid: int) -> dict[str, float]:
    """Heap after a full GC, the heap the JVM has committed and metaspace (MB); the RSS (MB) of
    the JVM and of its descendants (the Python driver), their open files and threads; with
    Native Memory Tracking on, what the JVM committed by category and the RSS it does not track
    (native libraries' own allocations)."""
    subprocess.run(["jcmd", str(pid), "GC.run"], capture_output=True, timeout=60)
    out = subprocess.run(["jstat", "-gc", str(pid)], capture_output=True, text=True, timeout=60)
    lines = out.stdout.split("\n")
    stats = dict(zip(lines[0].split(), map(float, lines[1].split()), strict=False))
    heap = sum(stats.get(k, 0.0) for k in ("S0U", "S1U", "EU", "OU")) / 1024
    committed = sum(stats.get(k, 0.0) for k in ("S0C", "S1C", "EC", "OC")) / 1024
    procs = descendants(pid)
    fds = sum(len(os.listdir(f"/proc/{p}/fd")) for p in procs if Path(f"/proc/{p}/fd").exists())
    jvm_rss = _status(pid, "VmRSS") / 1024
    figures = {
        "heap_after_gc_mb": round(heap, 1),
        "heap_committed_mb": round(committed, 1),
        "metaspace_mb": round(stats.get("MU", 0.0) / 1024, 1),
        "rss_mb": round(sum(_status(p, "VmRSS") for p in procs) / 1024, 1),
        "jvm_rss_mb": round(jvm_rss, 1),
        "open_files": fds,
        "threads": sum(_status(p, "Threads") for p in procs),
        "jvm_threads": _status(pid, "Threads"),
    }
    nmt = native_memory(pid)
    if nmt:
        figures |= {f"nmt_{k}_mb": v for k, v in nmt.items()}
        figures["untracked_native_mb"] = round(jvm_rss - nmt["total"], 1)
    return figures


def native_memory(pid: int) -> dict[str, float]:
    """What the JVM committed (MB) by Native Memory Tracking's category; {} when it is off."""
    out = subprocess.run(
        ["jcmd", str(pid), "VM.native_memory", "summary", "scale=KB"],
        capture_output=True,
        text=True,
        timeout=60,
    ).stdout
    total = re.search(r"^Total: reserved=\d+KB, committed=(\d+)KB", out, re.M)
    found = {"total": round(int(total[1]) / 1024, 1)} if total else {}
    for m in re.finditer(r"^(?:-\s+)?([\w ]+?)\s*\(reserved=\d+KB, committed=(\d+)KB", out, re.M):
        found[m[1].strip().lower().replace(" ", "_")] = round(int(m[2]) / 1024, 1)
    return found


def folder_figures(path: Path) -> tuple[int, int]:
    """Files and bytes under `path`; a file deleted meanwhile (VACUUM, Spark's checkpoint
    clean-up) is not counted."""
    count = size = 0
    for f in path.rglob("*") if path.exists() else ():
        try:
            if f.is_file():
                size += f.stat().st_size
                count += 1
        except FileNotFoundError:
            continue
    return count, size


def task_logs(log_dir: Path) -> tuple[int, int]:
    """Files and bytes of the runners' and tasks' own output: `<log dir>/<run id>/` folders and
    the runners' files (the storage root may be the same folder: its tables are not counted)."""
    folders = [d for d in log_dir.iterdir() if d.is_dir() and d.name.isdigit()]
    runners = list(log_dir.glob("soak-*.log"))
    found = [folder_figures(d) for d in folders] + [(1, f.stat().st_size) for f in runners]
    return sum(c for c, _ in found), sum(b for _, b in found)


def table_figures(path: Path) -> dict[str, int]:
    log = path / "_delta_log"
    log_files, log_bytes = folder_figures(log)
    all_files, all_bytes = folder_figures(path)
    figures = {
        "data_files": all_files - log_files,
        "data_mb": round((all_bytes - log_bytes) / 1e6, 2),
        "log_files": log_files,
        "log_mb": round(log_bytes / 1e6, 2),
    }
    try:
        sizes = pa.table(DeltaLake(str(path)).get_add_actions()).column("size_bytes")
        figures["live_files"] = len(sizes)
        # the current version's data: the rest of data_mb is what VACUUM's retention keeps
        figures["live_mb"] = round(sum(sizes.to_pylist()) / 1e6, 2)
    except Exception:  # not created yet
        figures["live_files"], figures["live_mb"] = 0, 0.0
    return figures


def commit_ms(table: Path, version: int) -> int | None:
    try:
        return commit_time_ms((table / "_delta_log" / f"{version:020d}.json").read_text())
    except OSError:
        return None


def table_version(table: Path) -> int:
    names = [n.name for n in (table / "_delta_log").glob("*.json")]
    return max((int(n.removesuffix(".json")) for n in names), default=-1)


def committed_offsets(checkpoint: Path) -> list[dict]:
    """The source offsets of the checkpoint's newest committed batch."""
    commits = [int(f.name) for f in (checkpoint / "commits").glob("[0-9]*")]
    if not commits:
        return []
    return source_offsets((checkpoint / "offsets" / str(max(commits))).read_text())


def behind(checkpoint: Path, source: Path, now_ms: int) -> tuple[int, float]:
    """How many versions of `source` the reader has not read in full, and the age (s) of the
    oldest of them (0, 0: caught up)."""
    version = next(
        (o["reservoirVersion"] for o in committed_offsets(checkpoint) if "reservoirVersion" in o),
        0,
    )
    newest = table_version(source)
    if version > newest:
        return 0, 0.0
    ms = commit_ms(source, version)
    return newest - version + 1, (now_ms - ms) / 1000 if ms else 0.0


def progress_figures(conf: LakehouseConf, since_ms: int) -> dict[str, dict[str, float]]:
    """Per query: batches, mean and max batch duration (s) since `since_ms` (progress table)."""
    try:
        dt = DeltaLake(conf.table_path(conf.progress_table.table))
    except Exception:
        return {}
    rows = dt.to_pyarrow_table(columns=["event_time", "query_name", "batch_duration_ms"])
    found: dict[str, list[float]] = {}
    for r in rows.to_pylist():
        if r["event_time"].timestamp() * 1000 >= since_ms:
            found.setdefault(r["query_name"], []).append(r["batch_duration_ms"] / 1000)
    figures = {
        q: {"batches": len(d), "mean_s": round(sum(d) / len(d), 2), "max_s": round(max(d), 2)}
        for q, d in sorted(found.items())
    }
    figures["progress_rows"] = {"rows": rows.num_rows}
    return figures


def bronze_freshness_s(conf: LakehouseConf, now_ms: int) -> float | None:
    """Now less the newest Kafka timestamp bronze holds (the log's column statistics)."""
    try:
        actions = DeltaLake(conf.table_path("bronze/orders_raw")).get_add_actions(flatten=True)
    except Exception:
        return None
    times = [t for t in actions.column("max.kafka_timestamp").to_pylist() if t is not None]
    return (now_ms - max(times).timestamp() * 1000) / 1000 if times else None


def sample(conf: LakehouseConf, started: float, since_ms: int) -> dict:
    now_ms = int(time.time() * 1000)
    root = Path(conf.root)
    stream = conf.stream("orders")
    s: dict = {"minute": round((time.time() - started) / 60, 2), "jobs": {}, "tables": {}}
    jvms = job_jvms(conf.root)
    if (server := history.status(conf).pid) is not None:
        jvms["history"] = server  # the History Server an operator runs beside the jobs
    for task, pid in sorted(jvms.items()):
        try:
            s["jobs"][task] = jvm_figures(pid)
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            pass  # it ended meanwhile (a maintenance run)
    for name, path in sorted(conf.table_names().items()):
        s["tables"][name] = table_figures(Path(path))
    s["checkpoints"] = {
        str(c.relative_to(root / "_checkpoints")): dict(
            zip(("files", "bytes"), folder_figures(c), strict=True)
        )
        for c in sorted((root / "_checkpoints").glob("*/*"))
        if c.is_dir()
    }
    s["event_logs"] = dict(
        zip(("files", "bytes"), folder_figures(Path(conf.event_log_dir)), strict=True)
    )
    # the runners' and tasks' own output (the layer jobs' progress lines, each maintenance run)
    s["task_logs"] = dict(zip(("files", "bytes"), task_logs(Path(conf.log_dir)), strict=True))
    bronze_ck = root / "_checkpoints" / stream.bronze_table
    consumed = sum(
        sum(int(v) for v in o.get(stream.topic, {}).values()) for o in committed_offsets(bronze_ck)
    )
    s["kafka_lag"] = produced(conf) - consumed
    bronze, events = (
        Path(conf.table_path(stream.bronze_table)),
        Path(conf.table_path(stream.events_table)),
    )
    silver_versions, silver_s = behind(root / "_checkpoints" / stream.events_table, bronze, now_ms)
    gold_versions, gold_s = behind(root / "_checkpoints" / "gold" / "orders", events, now_ms)
    fresh_bronze = bronze_freshness_s(conf, now_ms)
    s["behind"] = {
        "silver_versions": silver_versions,
        "silver_s": round(silver_s, 1),
        "gold_versions": gold_versions,
        "gold_s": round(gold_s, 1),
    }
    if fresh_bronze is not None:
        s["freshness_s"] = {
            "bronze": round(fresh_bronze, 1),
            "silver": round(fresh_bronze + silver_s, 1),
            "gold": round(fresh_bronze + silver_s + gold_s, 1),
        }
    s["batches"] = progress_figures(conf, since_ms)
    s["sample_s"] = round(time.time() - now_ms / 1000, 1)
    return s


def series(samples: list[dict]) -> dict[str, list[tuple[float, float]]]:
    """Each figure as (minute, value) points: `jobs.bronze.rss_mb`, `tables.silver.orders.log_mb`..."""
    points: dict[str, list[tuple[float, float]]] = {}

    def walk(prefix: str, value, minute: float) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else k, v, minute)
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            points.setdefault(prefix, []).append((minute, float(value)))

    for s in samples:
        if not s.get("failed"):
            walk("", {k: v for k, v in s.items() if k != "minute"}, s["minute"])
    return points


def slope_per_hour(points: list[tuple[float, float]]) -> float:
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    var = sum((x - mx) ** 2 for x, _ in points)
    return 0.0 if var == 0 else 60 * sum((x - mx) * (y - my) for x, y in points) / var


def kind(figure: str) -> str | None:
    """Why a figure may grow (a key of ALLOWED), None if it should be flat."""
    if figure.startswith("tables.") and figure.endswith((".data_files", ".data_mb", ".live_mb")):
        return "data"
    if figure.startswith("tables.") and figure.endswith((".log_files", ".log_mb")):
        return "log"
    if figure.endswith("progress_rows.rows"):
        return "rows"
    if figure.startswith("event_logs."):
        return "events"
    if figure.startswith("task_logs."):
        return "task logs"
    return None


# why a figure that should be flat can still rise within an hour: what bounds it, or what it
# follows (the report gives the reason next to the figure; the figure still counts as growing)
WHY = (
    (
        "nmt_code_mb",
        "the JIT's compiled code, still growing with the methods it compiles, up to "
        "-XX:ReservedCodeCacheSize (240 MB)",
    ),
    ("nmt_compiler_mb", "the JIT compiler's own arenas, freed after each compilation"),
    (
        "heap_committed_mb",
        "heap G1 commits between collections, up to -Xmx (--driver-memory); "
        "what stays live is heap_after_gc_mb",
    ),
    ("nmt_java_heap_mb", "the committed heap (heap_committed_mb)"),
    (
        "nmt_other_mb",
        "direct and Unsafe buffers (NIO: Parquet, compression, the network) that "
        "rise and fall with the batches, up to -XX:MaxDirectMemorySize (the heap's size)",
    ),
    ("rss_mb", "mostly the committed heap and the compiled code (heap_committed_mb, nmt_code_mb)"),
    ("nmt_total_mb", "the committed heap and the compiled code"),
    (
        "live_files",
        "files written since the last compaction: more when a maintenance run was "
        "skipped (the previous one still going) or failed",
    ),
    (
        "batches.",
        "a batch also reads the part of its target tables its keys can be in (silver's "
        "dedupe: the event date's partition within the batch's key range), which grows with them",
    ),
    ("freshness_s.", "follows the batch durations"),
    ("behind.", "follows the batch durations"),
    ("kafka_lag", "follows the batch durations"),
)


def why(figure: str) -> str | None:
    """What bounds or drives a figure that should be flat (WHY), None if nothing is known."""
    return next((reason for part, reason in WHY if part in figure), None)


def cycles(points: list[tuple[float, float]], window: float) -> list[list[tuple[float, float]]]:
    """The points in consecutive `window`-minute spans from the first (a span with fewer than
    three points, the run's tail, left out): one maintenance cycle each."""
    spans: dict[int, list[tuple[float, float]]] = {}
    for x, y in points:
        spans.setdefault(int((x - points[0][0]) // window), []).append((x, y))
    return [span for _, span in sorted(spans.items()) if len(span) >= 3]


def cycle_trend(spans: list[list[tuple[float, float]]]) -> float:
    """Growth per hour of the cycles' medians: a sawtooth (files between compactions, a heap
    between collections) and a lone spike do not move it; a figure that rises every cycle does."""
    return slope_per_hour(
        [((s[0][0] + s[-1][0]) / 2, statistics.median(y for _, y in s)) for s in spans]
    )


def growth(samples: list[dict], warmup: float, window: float = 10.0) -> list[dict]:
    """Per figure after the warm-up: first and last value, growth per hour (least squares), and
    a verdict on the trend of its `window`-minute cycles' medians: flat if that is within 10% of
    its mean (or 1 unit) per hour; else flat from a later cycle on if the cycles from there are
    (a figure that reached its bound: Spark's checkpoint keeps its last 100 batches); else it
    grows (or falls), with the reason when it is allowed to or known to stop at a bound."""
    rows = []
    for figure, points in sorted(series(samples).items()):
        after = [(x, y) for x, y in points if x >= warmup]
        if len(after) < 3 or figure.endswith((".batches", "sample_s")):
            continue
        if figure.startswith("jobs.maintain."):  # a new JVM each run: no trend to fit
            continue
        values = [y for _, y in after]
        mean = sum(values) / len(values)
        bound = max(0.10 * abs(mean), 1.0)
        spans = cycles(after, window)
        if len(spans) < 3:
            spans = [[p] for p in after]  # too short a run for cycles: every point
        trend = cycle_trend(spans)
        flat_from = next(
            (i for i in range(len(spans) - 1) if abs(cycle_trend(spans[i:])) <= bound), None
        )
        if flat_from == 0:
            verdict = "flat"
        elif flat_from is not None:
            verdict = f"flat from minute {spans[flat_from][0][0]:.0f}"
        elif trend < 0:
            verdict = "falls"
        else:
            verdict = f"grows: {kind(figure)}" if kind(figure) else "GROWS"
        rows.append(
            {
                "figure": figure,
                "first": values[0],
                "last": values[-1],
                "mean": round(mean, 2),
                "per_hour": round(slope_per_hour(after), 2),
                "cycles_per_hour": round(trend, 2),
                "verdict": verdict,
                "why": why(figure) if verdict == "GROWS" else None,
            }
        )
    return rows


def start(cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as out:
        return subprocess.Popen(
            cmd,
            env=env,
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,  # a killed soak takes its runners with it
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=60.0, help="how long the rate is sent")
    parser.add_argument("--rate", type=float, default=1000.0, help="records/s")
    parser.add_argument("--maintain-every", type=int, default=10, help="minutes between runs")
    parser.add_argument("--sample-seconds", type=float, default=60.0)
    parser.add_argument("--warmup-minutes", type=float, default=10.0)
    parser.add_argument("--env", default="local")
    parser.add_argument(
        "--report", type=Path, help="a soak's results JSON: its report again, nothing run"
    )
    args = parser.parse_args()
    if args.report:
        payload = json.loads(args.report.read_text())
        ran = argparse.Namespace(**payload["args"])
        report(payload["samples"], ran, payload["attempts"], payload.get("commit"))
        return
    ran_on = commit()

    conf = load_config(args.env)
    broker.start(conf)
    conf = fresh(conf, "soak")
    env = job_env(conf, args.env)
    env["LAKEHOUSE__STORAGE__LOG_DIR"] = str(conf.log_dir)
    # what each JVM commits natively, by category (a few % of CPU)
    env["JAVA_TOOL_OPTIONS"] = "-XX:NativeMemoryTracking=summary"
    # Spark's History Server, as production runs it: it compacts and cleans the event logs
    history.start(conf, quiet=True)
    lakehouse = str(Path(sys.executable).parent / "lakehouse")
    total = int(args.rate * args.minutes * 60)
    print(f"generating {total:,} records ...", flush=True)
    records = generate(total, first_chunk=200)[:total]
    logs = Path(conf.log_dir)
    jobs = start(
        [
            lakehouse,
            "jobs",
            "run",
            "conf/jobs/orders_continuous.yaml",
            "--param",
            f"env={args.env}",
        ],
        env,
        logs / "soak-continuous.log",
    )
    cron = f"0 */{args.maintain_every} * * * ?"
    maintenance = start(
        [lakehouse, "jobs", "schedule", "conf/jobs/maintenance.yaml", "--cron", cron],
        env,
        logs / "soak-maintenance.log",
    )
    print(f"jobs started; logs in {logs}", flush=True)
    while not set(LAYERS) <= set(job_jvms(conf.root)):
        assert jobs.poll() is None, (logs / "soak-continuous.log").read_text()[-3000:]
        time.sleep(2)
    topic = conf.stream("orders").topic
    sender = threading.Thread(
        target=produce_plan,
        args=(conf, StreamPlan(with_every_twist(), records), topic),
        kwargs={"track": False, "rate": args.rate},
    )
    started = time.time()
    sender.start()
    samples: list[dict] = []
    since_ms = int(started * 1000)
    RESULTS.mkdir(exist_ok=True)
    stamp = f"{datetime.now(UTC):%Y%m%dT%H%M%S}"
    lines = (
        RESULTS / f"soak-{stamp}.samples.jsonl"
    )  # each sample as it is taken: a crash keeps them
    try:
        while sender.is_alive():
            time.sleep(max(0.0, started + len(samples) * args.sample_seconds - time.time()))
            try:
                s = sample(conf, started, since_ms)
            except Exception:  # a figure that could not be read: said, and the soak goes on
                print(f"[soak] a sample failed:\n{traceback.format_exc()}", flush=True)
                samples.append({"minute": round((time.time() - started) / 60, 2), "failed": 1})
                continue
            since_ms = int(time.time() * 1000)
            samples.append(s)
            with lines.open("a") as f:
                f.write(json.dumps(s, default=str) + "\n")
            heap = ", ".join(f"{k} {v['heap_after_gc_mb']:.0f}" for k, v in s["jobs"].items())
            fresh_s = s.get("freshness_s", {}).get("gold", float("nan"))
            print(
                f"[soak] minute {s['minute']:.0f}: lag {s['kafka_lag']:,} records, gold "
                f"freshness {fresh_s:.0f} s, heap after GC (MB) {heap} (sampled in "
                f"{s['sample_s']:.1f} s)",
                flush=True,
            )
    finally:
        sender.join()
        for proc in (jobs, maintenance):
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        for proc in (jobs, maintenance):
            proc.wait(timeout=300)
        history.stop(conf, quiet=True)
    runs = task_attempts(logs / "soak-continuous.log") + task_attempts(
        logs / "soak-maintenance.log"
    )
    out = RESULTS / f"soak-{stamp}.json"
    payload = {
        "args": {k: v for k, v in vars(args).items() if k != "report"},
        "commit": ran_on,
        "samples": samples,
        "growth": growth(samples, args.warmup_minutes, args.maintain_every),
        "attempts": runs,
    }
    out.write_text(json.dumps(payload, indent=2, default=str) + "\n")
    print(f"samples: {out}")
    report(samples, args, runs, ran_on)


def report(samples: list[dict], args, runs: list[dict], ran_on: str | None) -> None:
    """Print the growth per hour and the summary, and record them in bench/RESULTS.md."""
    figures = summary(
        samples, growth(samples, args.warmup_minutes, args.maintain_every), args, runs
    )
    print("\n".join(figures))
    command = (
        f"python -m bench.soak --minutes {args.minutes:g} --rate {args.rate:g} "
        f"--maintain-every {args.maintain_every}"
    )
    name = f"Soak at {args.rate:,.0f}/s for {args.minutes:g} min"
    print(f"results: {record(name, command, figures, ran_on)}")


def task_attempts(log: Path) -> list[dict]:
    """Each task attempt that ended, from a runner's output: task, state, seconds."""
    pattern = re.compile(r"\] (\w+): attempt (\d+) (\w+) in ([\d.]+)s")
    text = log.read_text(errors="replace") if log.exists() else ""
    return [
        {"task": m[1], "attempt": int(m[2]), "state": m[3], "seconds": float(m[4])}
        for m in pattern.finditer(text)
    ]


def batch_trends(samples: list[dict], warmup: float, window: float) -> list[str]:
    """Per query, its batches' mean duration hour by hour after the warm-up, and the trend of
    its `window`-minute cycles' medians (`cycle_trend`) and the plain least-squares slope, each
    as a share of its mean per hour: what "flat over two hours" is read from."""
    lines = []
    for figure, points in sorted(series(samples).items()):
        match = re.fullmatch(r"batches\.(.+)\.mean_s", figure)
        after = [(x, y) for x, y in points if x >= warmup]
        if match is None or len(after) < 3:
            continue
        mean = statistics.mean(y for _, y in after)
        hours: dict[int, list[float]] = {}
        for x, y in after:
            hours.setdefault(int(x // 60), []).append(y)
        spans = cycles(after, window)
        trend = cycle_trend(spans) if len(spans) >= 3 else slope_per_hour(after)
        lines.append(
            f"batch duration of {match[1]} (mean of each minute's batches, s): "
            + ", ".join(
                f"hour {h + 1} {statistics.mean(v):.2f}"
                for h, v in sorted(hours.items())
                if len(v) >= 30  # not the run's last minute alone
            )
            + f"; per hour, its cycles' medians **{100 * trend / mean:+.1f} %** of its mean "
            f"{mean:.2f} s, every minute {100 * slope_per_hour(after) / mean:+.1f} %"
            + "".join(
                f"; within hour {h + 1}, its cycles' medians **{100 * t / statistics.mean(v):+.1f} "
                "%** of that hour's mean"
                for h, v in sorted(hours.items())
                if h > 0 and len(v) >= 50  # a whole later hour: the JIT warm, the tables larger
                for t in [cycle_trend(cycles([(x, y) for x, y in after if x // 60 == h], window))]
            )
        )
    return lines


def summary(samples: list[dict], report: list[dict], args, runs: list[dict]) -> list[str]:
    last = next((s for s in reversed(samples) if not s.get("failed")), {})
    maintenance = [r["seconds"] for r in runs if r["task"] == "maintain"]
    failed = [r for r in runs if r["state"] == "FAILED"]
    grows = [r for r in report if r["verdict"] == "GROWS"]
    allowed = [r for r in report if r["verdict"].startswith("grows:")]
    lines = [
        f"{len(samples)} samples ({sum(bool(s.get('failed')) for s in samples)} failed), "
        f"{args.sample_seconds:g} s apart; growth per hour fitted after "
        f"a {args.warmup_minutes:g}-minute warm-up; maintenance every {args.maintain_every} min",
        f"final Kafka lag: {last.get('kafka_lag', 0):,} records; freshness (s) at the end: "
        + ", ".join(f"{k} {v:.0f}" for k, v in last.get("freshness_s", {}).items()),
        f"maintenance runs: {len(maintenance)}, "
        + (f"{min(maintenance):.0f}-{max(maintenance):.0f} s each; " if maintenance else "")
        + f"task attempts failed: **{len(failed)}**"
        + "".join(f"; {r['task']} {r['state']}" for r in failed),
    ]
    for task, figures in sorted(last.get("jobs", {}).items()):
        if task == "maintain":  # a new JVM each run: no trend
            continue
        key = f"jobs.{task}."
        rows = {r["figure"].removeprefix(key): r for r in report if r["figure"].startswith(key)}
        lines.append(
            f"{task} JVM: "
            + ", ".join(
                f"{k} {figures[k]:g} ({rows[k]['per_hour']:+g}/h, {rows[k]['verdict']})"
                for k in JVM_FIGURES
                if k in figures and k in rows
            )
        )
    lines += batch_trends(samples, args.warmup_minutes, args.maintain_every)
    plateau = [r for r in report if r["verdict"].startswith("flat from")]
    lines.append(
        f"flat (the medians of its {args.maintain_every}-minute cycles within 10% of its mean "
        "per hour): "
        f"{sum(r['verdict'] == 'flat' for r in report)} figures; flat once at their bound: "
        f"{len(plateau)}; allowed to grow and growing: {len(allowed)}; growing and not "
        f"allowed: **{len(grows)}**"
    )
    lines += [
        f"{r['verdict']}: {r['figure']} {r['first']:g} -> {r['last']:g} "
        f"(cycles {r['cycles_per_hour']:+g}/h)" + (f": {r['why']}" if r.get("why") else "")
        for r in grows + plateau
    ]
    lines += [
        f"{r['verdict']}: {r['figure']} {r['first']:g} -> {r['last']:g} ({r['per_hour']:+g}/h)"
        for r in allowed
        if r["figure"].endswith(("data_mb", "log_files", "rows", "bytes"))
    ]
    return lines


if __name__ == "__main__":
    main()
