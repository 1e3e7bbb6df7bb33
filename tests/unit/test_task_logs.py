"""The job runner's task logs stay bounded: rotated by size under a writer that keeps its
descriptor, and old runs' folders removed by age."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from pipelines.orchestration.runner import DRIVER_PYTHON, last_error
from pipelines.orchestration.task_logs import remove_old_runs, rotate

# a chatty task: 20,000 numbered lines, each flushed as a logging handler does, ~10,000 a second
# (a layer job writes a few a second), then one last line
WRITER = (
    "import time\n"
    "for i in range(20_000):\n"
    "    print(f'line {i:06d}', flush=True)\n"
    "    if i % 10 == 0: time.sleep(0.001)\n"
    "print('end')"
)
LIMIT = 32 * 1024  # 220,000 bytes written: ~6 rotations


def test_a_log_rotated_under_a_running_writer_stays_bounded_and_keeps_its_lines_in_order(
    tmp_path,
):
    log = tmp_path / "bronze-1.log"
    with open(log, "ab", buffering=0) as out:  # as the runner opens it
        writer = subprocess.Popen([sys.executable, "-c", WRITER], stdout=out)
    rotations = 0
    while writer.poll() is None:
        rotations += rotate(log, LIMIT, backups=3)
        time.sleep(0.01)
    rotations += rotate(log, LIMIT, backups=3)

    assert rotations >= 4  # the oldest copies were dropped
    kept = [log.with_name(f"bronze-1.log.{i}") for i in (3, 2, 1)] + [log]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in kept)
    assert all(p.stat().st_size < 2 * LIMIT for p in kept)
    # a line written as a cut came may be split between two files, and one written between a
    # copy's last read and the cut is lost; every other line is whole, in order, to the last
    copies = [p.read_text().splitlines() for p in kept]
    assert copies[-1][-1] == "end"
    whole = [line for c in copies for line in c[1:-1]]
    assert all(len(line) == 11 for line in whole)
    numbers = [int(line.split()[1]) for line in whole]
    assert numbers == sorted(numbers) and numbers[-1] == 19_999
    ends = 2 * len(kept) - 2  # the ends left out above, within the range of numbers
    lost = numbers[-1] - numbers[0] + 1 - len(numbers) - ends  # 0 in the runs here
    assert lost <= len(numbers) // 100, (lost, rotations)  # 1%, on a busy machine too


def test_a_log_under_its_bound_is_left_as_it_is(tmp_path):
    log = tmp_path / "silver-1.log"
    log.write_text("a line\n")
    assert not rotate(log, 1024, backups=3)
    assert not rotate(tmp_path / "missing.log", 1024, backups=3)
    assert [p.name for p in tmp_path.iterdir()] == ["silver-1.log"]


def test_the_logs_of_runs_older_than_the_retention_are_removed_and_nothing_else(tmp_path):
    now = time.time()
    day = 86400

    def run(name: str, age_days: float) -> None:
        folder = tmp_path / name
        folder.mkdir()
        (folder / "bronze-1.log").write_text("x")
        os.utime(folder / "bronze-1.log", (now - age_days * day,) * 2)

    run("1700000000000", 31)  # ended a month ago
    run("1700000000001", 29)
    run("1700000000002", 40)
    (tmp_path / "1700000000002" / "gold-1.log").write_text("still writing")  # a long run
    (tmp_path / "lineage.jsonl").write_text("{}")  # not a run's folder
    old = tmp_path / "bench"
    old.mkdir()
    os.utime(old, (now - 90 * day,) * 2)

    removed = remove_old_runs(tmp_path, days=30, now=now)

    assert removed == [tmp_path / "1700000000000"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "1700000000001",
        "1700000000002",
        "bench",
        "lineage.jsonl",
    ]
    assert remove_old_runs(tmp_path / "missing", days=30) == []


def test_a_failing_python_driver_leaves_its_last_line_in_the_task_log(tmp_path):
    """spark-submit copies a Python driver's output on a thread it does not wait for: the runner's
    driver wrapper writes it into the task's log itself, beside what the runner appended."""
    log = tmp_path / "task-0.log"
    log.write_text("$ spark-submit ...\n")
    env = {**os.environ, "LAKEHOUSE_DRIVER_PYTHON": sys.executable, "LAKEHOUSE_TASK_LOG": str(log)}
    script = "import sys; print('error: x failed on purpose', flush=True); sys.exit(3)"
    done = subprocess.run([str(DRIVER_PYTHON), "-c", script], env=env, capture_output=True)
    assert (done.returncode, done.stdout, done.stderr) == (3, b"", b"")
    assert log.read_text() == "$ spark-submit ...\nerror: x failed on purpose\n"
    assert last_error(log) == "x failed on purpose"
