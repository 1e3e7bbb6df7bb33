"""One running copy per checkpoint: a lease in the checkpoint, renewed while the job runs.

The lease lives with the checkpoint and goes through Hadoop's FileSystem like the checkpoint, so it
holds for jobs on several machines. Leases are numbered files, `_lease/<n>`; the highest number
holds. A job takes the next number with an exclusive create (`O_EXCL` on a local disk,
`create(overwrite=false)` elsewhere: atomic on HDFS and on stores with conditional writes), so of
two jobs starting together exactly one gets it. A lease not renewed for `TTL_S` seconds, or held
by a process of this host that is gone, is stale: the next job takes the next number.
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

TTL_S = 60.0  # a lease not renewed for this long belongs to a process that died
RENEW_S = 10.0


class CheckpointInUseError(JobFailedError):
    """Another process runs the job of this checkpoint; the message names it."""


class CheckpointLease:
    """`with CheckpointLease(spark, checkpoint, job) as lease:` runs the block as the
    checkpoint's only job; `lease.renew()` keeps it while the block runs."""

    def __init__(self, spark: SparkSession, checkpoint: str, job: str) -> None:
        jvm = spark._jvm
        self.jvm, self.where, self.job = jvm, checkpoint, job
        self.folder = jvm.org.apache.hadoop.fs.Path(f"{checkpoint.rstrip('/')}/_lease")
        self.fs = self.folder.getFileSystem(spark._jsc.hadoopConfiguration())
        pid = os.getpid()
        since = datetime.now(UTC).isoformat(timespec="seconds")
        self.mine = {"job": job, "host": socket.gethostname(), "pid": pid, "since": since}
        self.mine |= {"started": process_start(pid), "token": uuid.uuid4().hex}
        self.number: int | None = None
        self.renewed = 0.0

    def __enter__(self) -> CheckpointLease:
        self.fs.mkdirs(self.folder)
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
                    self.fs.delete(self._path(old), False)
                return self

    def __exit__(self, *exc) -> None:
        if self.number is not None and self._newest() == self.number:
            self.fs.delete(self._path(self.number), False)

    def renew(self) -> None:
        """Rewrite the lease (at most every RENEW_S seconds), so that it never looks stale."""
        if self.number is not None and time.monotonic() - self.renewed >= RENEW_S:
            if (newest := self._newest()) != self.number:
                holder, age = self._read(newest) if newest is not None else ({}, 0.0)
                self.number = None
                raise CheckpointInUseError("lease lost: " + self._in_use(holder, age))
            self._write(self.fs.create(self._path(self.number), True))
            self.renewed = time.monotonic()

    def _in_use(self, holder: dict, age: float) -> str:
        h = {k: holder.get(k, "?") for k in ("job", "host", "pid", "since")}
        return (
            f"{self.job} cannot start: checkpoint {self.where} is in use by {h['job']} on "
            f"{h['host']}, pid {h['pid']}, since {h['since']} (lease renewed {age:.0f}s ago). "
            f"Stop it first; if it died, its lease expires {TTL_S:.0f}s after its last renewal."
        )

    def _path(self, number: int):
        return self.jvm.org.apache.hadoop.fs.Path(self.folder, str(number))

    def _newest(self) -> int | None:
        names = [s.getPath().getName() for s in self.fs.listStatus(self.folder)]
        return max((int(n) for n in names if n.isdigit()), default=None)

    def _create(self, number: int) -> bool:
        """Create lease `number` if nobody has, atomically; False if it exists."""
        path = self._path(number)
        if self.fs.getScheme() == "file":
            try:
                fd = os.open(path.toUri().getPath(), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            except FileExistsError:
                return False
            with os.fdopen(fd, "w") as f:
                json.dump(self.mine, f)
            return True
        try:
            self._write(self.fs.create(path, False))
        except Exception as e:  # py4j: FileAlreadyExistsException, or the store's refusal
            if "exist" in str(e).lower():
                return False
            raise
        return True

    def _write(self, stream) -> None:
        try:
            stream.write(bytearray(json.dumps(self.mine).encode()))
        finally:
            stream.close()

    def _read(self, number: int) -> tuple[dict, float]:
        """Lease `number` and its age in seconds ({} if it is being written or unreadable)."""
        path = self._path(number)
        try:
            age = time.time() - self.fs.getFileStatus(path).getModificationTime() / 1000
            stream = self.fs.open(path)
        except Exception:  # gone meanwhile: its holder stopped
            return {}, TTL_S + 1
        try:
            data = bytes(self.jvm.org.apache.commons.io.IOUtils.toByteArray(stream))
        finally:
            stream.close()
        try:
            return json.loads(data), age
        except ValueError:
            return {}, age

    def _stale(self, holder: dict, age: float) -> bool:
        if age > TTL_S:
            return True
        pid = holder.get("pid")
        if holder.get("host") != self.mine["host"] or not isinstance(pid, int):
            return False
        return process_start(pid) != holder.get("started")
