"""One running copy per checkpoint: a lease in the checkpoint, renewed while the job runs.

Leases are numbered files, `_lease/<n>`, the highest holding, each taken by an exclusive create
(`Files.create_new`); one not renewed for `TTL_S` seconds, or held by a process of this host that
is gone, is stale and the next number takes over. Why it holds across machines:
docs/guarantees.md, "Two copies of one job".
"""

from __future__ import annotations

import json
import os
import socket
import time
import uuid
from datetime import UTC, datetime

from pyspark.sql import SparkSession

from pipelines.errors import JobFailedError
from pipelines.local.processes import process_start
from pipelines.streaming.storage import Files

TTL_S = 60.0  # a lease not renewed for this long belongs to a process that died
RENEW_S = 10.0


class CheckpointInUseError(JobFailedError):
    """Another process runs the job of this checkpoint; the message names it."""


class CheckpointLease:
    """`with CheckpointLease(spark, checkpoint, job) as lease:` runs the block as the
    checkpoint's only job; `lease.renew()` keeps it while the block runs."""

    def __init__(self, spark: SparkSession, checkpoint: str, job: str) -> None:
        self.files, self.where, self.job = Files(spark), checkpoint, job
        self.folder = f"{checkpoint.rstrip('/')}/_lease"
        pid = os.getpid()
        since = datetime.now(UTC).isoformat(timespec="seconds")
        self.mine = {"job": job, "host": socket.gethostname(), "pid": pid, "since": since}
        self.mine |= {"started": process_start(pid), "token": uuid.uuid4().hex}
        self.number: int | None = None
        self.renewed = 0.0

    def __enter__(self) -> CheckpointLease:
        self.files.mkdirs(self.folder)
        while True:
            number = self._newest()
            if number is not None:
                holder, age = self._read(number)
                if not self._stale(holder, age):
                    raise CheckpointInUseError(self._in_use(holder, age))
            number = -1 if number is None else number
            if self._create(number + 1):  # else another job took it first: look again
                self.number, self.renewed = number + 1, time.monotonic()
                for old in range(max(0, number - 5), number + 1):
                    self.files.delete(self._path(old))
                return self

    def __exit__(self, *exc) -> None:
        if self.number is not None and self._newest() == self.number:
            self.files.delete(self._path(self.number))

    def renew(self) -> None:
        """Rewrite the lease (at most every RENEW_S seconds), so that it never looks stale."""
        if self.number is not None and time.monotonic() - self.renewed >= RENEW_S:
            if (newest := self._newest()) != self.number:
                holder, age = self._read(newest) if newest is not None else ({}, 0.0)
                self.number = None
                raise CheckpointInUseError("lease lost: " + self._in_use(holder, age))
            self.files.write_text(self._path(self.number), json.dumps(self.mine))
            self.renewed = time.monotonic()

    def _in_use(self, holder: dict, age: float) -> str:
        h = {k: holder.get(k, "?") for k in ("job", "host", "pid", "since")}
        return (
            f"{self.job} cannot start: checkpoint {self.where} is in use by {h['job']} on "
            f"{h['host']}, pid {h['pid']}, since {h['since']} (lease renewed {age:.0f}s ago). "
            f"Stop it first; if it died, its lease expires {TTL_S:.0f}s after its last renewal."
        )

    def _path(self, number: int) -> str:
        return f"{self.folder}/{number}"

    def _newest(self) -> int | None:
        return max((int(n) for n in self.files.names(self.folder) if n.isdigit()), default=None)

    def _create(self, number: int) -> bool:
        """Create lease `number` if nobody has, atomically; False if it exists."""
        return self.files.create_new(self._path(number), json.dumps(self.mine))

    def _read(self, number: int) -> tuple[dict, float]:
        """Lease `number` and its age in seconds ({} if it is being written or unreadable)."""
        path = self._path(number)
        try:
            age = time.time() - self.files.modified_s(path)
            text = self.files.read_text(path)
        except Exception:  # gone meanwhile: its holder stopped
            return {}, TTL_S + 1
        if text is None:
            return {}, TTL_S + 1
        try:
            return json.loads(text), age
        except ValueError:
            return {}, age

    def _stale(self, holder: dict, age: float) -> bool:
        if age > TTL_S:
            return True
        pid = holder.get("pid")
        if holder.get("host") != self.mine["host"] or not isinstance(pid, int):
            return False
        return process_start(pid) != holder.get("started")
