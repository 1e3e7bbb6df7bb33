"""The lakehouse on a real S3 endpoint (S3Proxy on loopback, started like the broker): the same
jobs give the same tables, and several drivers commit to one table without losing a commit."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from tests.conftest import subprocess_env

pytestmark = pytest.mark.integration

# A driver of its own (a JVM of its own) appending one row per commit, from when `go` appears.
APPEND = """
import sys, time
from pathlib import Path
from pipelines.config import load_config
from pipelines.session import build_spark

writer, path, commits, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
spark = build_spark(load_config(), f"append-{writer}")
spark.range(1).write.format("delta").mode("append").save(path + "-warm-" + writer)
(go.parent / f"ready-{writer}").touch()
while not go.exists():
    time.sleep(0.05)
for i in range(commits):
    row = spark.range(1).selectExpr(f"'{writer}' AS writer", f"CAST({i} AS INT) AS i")
    row.write.format("delta").mode("append").save(path)
"""


def test_a_commit_is_never_replaced_on_s3_nor_on_a_local_disk(spark, s3, tmp_path):
    jvm = spark._jvm
    hadoop = spark._jsc.hadoopConfiguration()
    store = jvm.lakehouse.storage.ConditionalPutLogStore(hadoop)
    for root in ("s3a://lake/logstore", tmp_path.as_uri()):
        path = jvm.org.apache.hadoop.fs.Path(f"{root}/_delta_log/00000000000000000000.json")
        first, second = jvm.java.util.ArrayList(), jvm.java.util.ArrayList()
        first.add('{"first":1}')
        second.add('{"second":2}')
        store.write(path, first.iterator(), False, hadoop)
        with pytest.raises(Exception, match="FileAlreadyExistsException"):
            store.write(path, second.iterator(), False, hadoop)
        lines = list(store.read(path, hadoop))
        assert lines == ['{"first":1}'], root  # the first commit, whole


def test_two_drivers_and_delta_rs_commit_to_one_table_at_once_and_lose_no_commit(
    spark, s3, tmp_path
):
    conf = s3.updated({"storage.root": "s3a://lake/concurrent"})
    path, commits = conf.table_path("system/contended"), 8
    spark.range(0).selectExpr("'' AS writer", "CAST(0 AS INT) AS i").write.format("delta").save(
        path
    )
    script, go = tmp_path / "append.py", tmp_path / "go"
    script.write_text(APPEND)
    drivers = {
        name: subprocess.Popen(
            [sys.executable, str(script), name, path, str(commits), str(go)],
            env=subprocess_env(conf),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in ("driver-a", "driver-b")
    }
    try:
        while not all((tmp_path / f"ready-{n}").exists() for n in drivers):
            assert all(d.poll() is None for d in drivers.values()), [
                d.communicate()[0][-2000:] for d in drivers.values() if d.poll() is not None
            ]
            time.sleep(0.1)  # the drivers start up; each says when it is ready

        def delta_rs() -> None:  # the runner's kind of writer, in this process
            for i in range(commits):
                row = pa.table({"writer": ["delta-rs"], "i": pa.array([i], pa.int32())})
                write_deltalake(path, row, mode="append", storage_options=conf.delta_rs_options())

        rs = threading.Thread(target=delta_rs)
        go.touch()
        rs.start()
        outputs = {n: d.communicate(timeout=300)[0] for n, d in drivers.items()}
        rs.join(timeout=300)
    finally:
        for d in drivers.values():
            d.kill()
    assert all(d.returncode == 0 for d in drivers.values()), outputs
    rows = sorted(tuple(r) for r in spark.read.format("delta").load(path).collect())
    writers = ("delta-rs", "driver-a", "driver-b")
    assert rows == [(w, i) for w in writers for i in range(commits)]
    history = spark.sql(f"DESCRIBE HISTORY delta.`{path}`").select("version").collect()
    assert sorted(r.version for r in history) == list(range(3 * commits + 1))
    # the race happened: a driver found its next version taken (and Delta retried it)
    taken = sum(
        text.count("another writer committed this version first") for text in outputs.values()
    )
    assert taken >= 1, "no commit collided: the drivers did not race; nothing was shown"
