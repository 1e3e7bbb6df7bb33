"""The checkpoint lease: one holder at a time, named when refused; stale leases are taken over."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading

import pytest

from pipelines.streaming.lease import TTL_S, CheckpointInUseError, CheckpointLease


def test_a_second_holder_is_refused_with_the_first_named_until_it_leaves(spark, tmp_path):
    checkpoint = str(tmp_path / "checkpoint")
    with CheckpointLease(spark, checkpoint, "the silver job"):
        with pytest.raises(CheckpointInUseError) as refused:
            CheckpointLease(spark, checkpoint, "the silver job").__enter__()
        assert str(refused.value).startswith(
            f"the silver job cannot start: checkpoint {checkpoint} is in use by the silver job on "
            f"{socket.gethostname()}, pid {os.getpid()}, since "
        )
    with CheckpointLease(spark, checkpoint, "the silver job") as again:
        assert again.number == 0  # numbers start again once every lease is gone
    assert os.listdir(tmp_path / "checkpoint" / "_lease") == []


def _lease_of(tmp_path, holder: dict, number: int = 0):
    folder = tmp_path / "checkpoint" / "_lease"
    folder.mkdir(parents=True)
    (folder / str(number)).write_text(json.dumps(holder))
    return folder / str(number)


def test_the_lease_of_a_dead_process_of_this_host_is_taken_over_at_once(spark, tmp_path):
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True
    )
    pid = int(gone.stdout)
    _lease_of(tmp_path, {"host": socket.gethostname(), "pid": pid, "started": "1"})
    with CheckpointLease(spark, str(tmp_path / "checkpoint"), "the gold job") as lease:
        assert lease.number == 1


def test_a_lease_of_another_host_holds_until_it_is_not_renewed_for_the_ttl(spark, tmp_path):
    holder = {"job": "the gold job", "host": "elsewhere", "pid": 1, "since": "2026-11-23T10:00"}
    file = _lease_of(tmp_path, holder, number=7)
    checkpoint = str(tmp_path / "checkpoint")
    with pytest.raises(CheckpointInUseError, match="in use by the gold job on elsewhere, pid 1"):
        CheckpointLease(spark, checkpoint, "the gold job").__enter__()
    old = file.stat().st_mtime - TTL_S - 5
    os.utime(file, (old, old))
    with CheckpointLease(spark, checkpoint, "the gold job") as lease:
        assert lease.number == 8


def test_a_holder_whose_lease_was_taken_over_learns_it_when_it_renews(spark, tmp_path):
    checkpoint = str(tmp_path / "checkpoint")
    first = CheckpointLease(spark, checkpoint, "the bronze job").__enter__()
    file = tmp_path / "checkpoint" / "_lease" / "0"
    old = file.stat().st_mtime - TTL_S - 5
    os.utime(file, (old, old))  # as if the first one had hung for longer than the TTL
    with CheckpointLease(spark, checkpoint, "the bronze job"):
        first.renewed = 0.0
        with pytest.raises(CheckpointInUseError, match="lease lost"):
            first.renew()


def test_a_lease_being_renewed_is_read_whole_and_its_holder_named(spark, tmp_path):
    """A renewal replaces the lease's file while a second job reads it (the CI run of 2eb6400
    read it empty, mid-write, and named the holder '?')."""
    checkpoint = str(tmp_path / "checkpoint")
    stop = threading.Event()
    with CheckpointLease(spark, checkpoint, "the bronze job") as lease:

        def renew_over_and_over() -> None:
            while not stop.is_set():
                lease.renewed = 0.0  # due at once
                lease.renew()

        renewer = threading.Thread(target=renew_over_and_over)
        renewer.start()
        try:
            for _ in range(200):
                holder, _age = CheckpointLease(spark, checkpoint, "the bronze job")._read(0)
                assert holder.get("pid") == os.getpid(), holder
        finally:
            stop.set()
            renewer.join()
    assert os.listdir(tmp_path / "checkpoint" / "_lease") == []  # no staged file left behind
