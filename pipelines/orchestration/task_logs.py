"""The job runner's task logs, bounded: a long-running task's log is rotated by size, and the
logs of old runs are removed by age, so a pipeline that runs for months does not fill the disk.

A task writes its output straight to `<log dir>/<run id>/<task>-<attempt>.log` (opened for
appending), never through the runner, so a task's last lines reach the file even when the runner
dies first. The runner rotates it as logrotate's `copytruncate` does: the file is copied to
`.log.1` (older copies shift to `.2`, ...) and cut to nothing; the task's next write lands at its
start. A line the task writes between the copy's last read and the cut (microseconds) is lost.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path


def rotate(log: Path, max_bytes: int, backups: int) -> bool:
    """Rotate `log` if it holds `max_bytes` or more, keeping `backups` copies; True if it did."""
    try:
        if log.stat().st_size < max_bytes:
            return False
    except FileNotFoundError:
        return False
    copies = [log.with_name(f"{log.name}.{i}") for i in range(1, backups + 1)]
    copies[-1].unlink(missing_ok=True)
    for older, newer in reversed(list(zip(copies[1:], copies[:-1], strict=True))):
        if newer.exists():
            os.replace(newer, older)
    with log.open("r+b") as current, copies[0].open("wb") as copy:
        shutil.copyfileobj(current, copy)  # to the end, what the task appended meanwhile too
        current.truncate(0)
    return True


def remove_old_runs(log_dir: Path, days: int, now: float | None = None) -> list[Path]:
    """Remove the log folders of runs whose newest file is older than `days`; the removed."""
    cutoff = (time.time() if now is None else now) - days * 86400
    removed = []
    for run in sorted(log_dir.iterdir() if log_dir.is_dir() else ()):
        if not (run.is_dir() and run.name.isdigit()):
            continue
        files = [f for f in run.rglob("*") if f.is_file()]
        if max((f.stat().st_mtime for f in files), default=run.stat().st_mtime) < cutoff:
            shutil.rmtree(run, ignore_errors=True)
            removed.append(run)
    return removed
