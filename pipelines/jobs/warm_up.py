"""A short driver that loads the classes every job loads, for `lakehouse setup` to archive them.

Run by `pipelines.local.cds` under `spark-submit` with `-XX:ArchiveClassesAtExit`: Delta (create,
append, MERGE, a streaming read into foreachBatch), the Kafka source's planning, S3A's client,
window aggregates and `try_cast`, all on a temporary folder and with no broker or endpoint.
"""

from __future__ import annotations

import shutil
import tempfile

from delta.tables import DeltaTable
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from pipelines.config import LakehouseConf
from pipelines.session import build_spark


def main() -> None:
    spark = build_spark(LakehouseConf(), "lakehouse-warm-up")
    folder = tempfile.mkdtemp(prefix="lakehouse-warm-up-")
    try:
        rows = spark.range(200).select(
            "id",
            F.col("id").cast("string").alias("key"),
            F.timestamp_seconds(F.col("id") * 7).alias("event_time"),
        )
        rows.write.format("delta").save(f"{folder}/events")
        table = DeltaTable.forPath(spark, f"{folder}/events")
        merge = table.alias("t").merge(rows.alias("s"), "t.id = s.id")
        merge.whenMatchedUpdateAll().whenNotMatchedInsertAll().execute()

        def batch(frame: DataFrame, _batch_id: int) -> None:
            windows = frame.groupBy(F.window("event_time", "1 minute"), "key").agg(
                F.count("*").alias("n"),
                F.sum(F.expr("try_cast(key AS DECIMAL(18, 2))")).alias("total"),
            )
            windows.write.format("delta").mode("append").save(f"{folder}/windows")

        query = (
            spark.readStream.format("delta")
            .load(f"{folder}/events")
            .writeStream.foreachBatch(batch)
            .option("checkpointLocation", f"{folder}/checkpoint")
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        spark.read.format("delta").load(f"{folder}/windows").count()
        kafka = spark.readStream.format("kafka").option("kafka.bootstrap.servers", "127.0.0.1:9")
        kafka.option("subscribe", "warm-up").load().explain()  # planning only: no broker needed
        _s3a_client(spark)
    finally:
        spark.stop()
        shutil.rmtree(folder, ignore_errors=True)


def _s3a_client(spark) -> None:
    """S3A's file system and AWS SDK client, made without a request (no bucket probe)."""
    jvm = spark.sparkContext._jvm
    hadoop = spark.sparkContext._jsc.hadoopConfiguration()
    hadoop.set("fs.s3a.endpoint", "http://127.0.0.1:9")
    hadoop.set("fs.s3a.bucket.probe", "0")
    hadoop.set("fs.s3a.access.key", "warm-up")  # not a real key: no request is made
    hadoop.set("fs.s3a.secret.key", "warm-up")
    try:
        jvm.org.apache.hadoop.fs.FileSystem.newInstance(jvm.java.net.URI("s3a://warm-up/"), hadoop)
    except Exception:  # noqa: BLE001 (S3A's jars are optional: a root on local disk needs none)
        pass


if __name__ == "__main__":
    main()
