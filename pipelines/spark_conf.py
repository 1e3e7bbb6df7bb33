"""Every Spark setting the lakehouse needs, as plain `--conf` pairs: no JVM, no session.

Used by `pipelines.session` to build a session and by the job runner for `spark-submit`.
"""

from __future__ import annotations

import getpass
import tempfile
from pathlib import Path

from pipelines.config import SECRET_PATTERN, InvalidConfigError, LakehouseConf

LOG4J2 = Path(__file__).parent / "resources" / "log4j2.properties"
LOG4J2_JSON = LOG4J2.with_name("log4j2-layout.json")  # the JVM's lines in log.format: json
ROCKSDB_PROVIDER = "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
# The project's Delta log store (pipelines/resources/java): each commit is created only if no one
# created it, atomically in the store, so that any number of drivers may commit to one table.
LOG_STORE_CLASS = "lakehouse.storage.ConditionalPutLogStore"
# The project's session catalog (pipelines/resources/java): Delta's, with every declared table
# reachable as <schema>.<table> at its path, from the settings under TABLE_PREFIX.
CATALOG_CLASS = "lakehouse.catalog.LakehouseCatalog"
TABLE_PREFIX = "spark.lakehouse.table."


def session_settings(conf: LakehouseConf) -> dict[str, str]:
    """Every setting the lakehouse needs, as `spark-submit --conf` pairs."""
    return {
        "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
        "spark.sql.catalog.spark_catalog": CATALOG_CLASS,
        **catalog_settings(conf),
        # with JSON logs, Spark puts the ids of what a line is about (query, batch) in its context
        "spark.log.structuredLogging.enabled": str(conf.log.format == "json").lower(),
        "spark.sql.shuffle.partitions": str(conf.spark.shuffle_partitions),
        # Frozen into each stateful query's checkpoint at its first start: chosen once, here.
        "spark.sql.streaming.stateStore.providerClass": ROCKSDB_PROVIDER,
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        "spark.sql.session.timeZone": "UTC",
        "spark.ui.enabled": str(conf.spark.ui).lower(),
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.memory": conf.spark.driver_memory,
        "spark.databricks.delta.schema.autoMerge.enabled": "false",
        # Delta rebuilds a table's state after each commit ("Compute snapshot for version") with
        # this many tasks, each generating code for the log's wide schema: the log of a streaming
        # table is small, and one task makes a pipeline batch faster than 4 or Delta's default of
        # 50 (bench/RESULTS.md, "Figures behind code choices").
        "spark.databricks.delta.snapshotPartitions": "1",
        # When the JVM's time zone is not UTC, Delta checks the file list it keeps in the
        # checksum of a table under 50 files against a rebuild of the table's state after each
        # commit (a check for pre-1883 timestamps): a driver outside UTC would pay it on every
        # commit to a gold table (a MERGE, in Europe/Paris: 13 Spark jobs instead of 12). The
        # session's zone is UTC whatever the machine's.
        "spark.databricks.delta.allFilesInCrc.verificationMode.forceOnNonUTC.enabled": "false",
        # A stage whose generated method is larger than HotSpot compiles (8,000 bytes of bytecode)
        # runs interpreted, row by row: the limit Spark's docs advise on HotSpot makes Spark run
        # such a stage through smaller compiled projections instead, which is faster
        # (bench/RESULTS.md, "Figures behind code choices").
        "spark.sql.codegen.hugeMethodLimit": "8000",
        # Spark keeps 100 generated classes; a pipeline batch's plans (parse, gold, Delta's own
        # log queries, MERGEs) need more, so each batch compiled most of its classes anew with 100
        # (bench/RESULTS.md, "Figures behind code choices").
        "spark.sql.codegen.cache.maxEntries": "2000",
        # A micro-batch's cached frames live for one batch: compressing them costs more time than
        # the memory it saves is worth (bench/RESULTS.md, "Figures behind code choices").
        "spark.sql.inMemoryColumnarStorage.compressed": "false",
        "spark.sql.streaming.stopGracefullyOnShutdown": "true",
        # A query that found no new data waits this long before asking its source again (Spark:
        # 10 ms): an idle pipeline job on its trigger of 0 s asked Kafka 100 times a second
        # (bench/RESULTS.md, "Figures behind code choices"). Batches with data still follow
        # each other at once.
        "spark.sql.streaming.pollingDelay": "250ms",
        "spark.sql.debug.maxToStringFields": "200",
        # Spark's UI, event log and plans hide a setting or source option whose key or value
        # matches: Spark's defaults, and the Kafka source's JAAS option by its key, whatever its
        # login module calls the secret in its value.
        "spark.redaction.regex": SECRET_PATTERN,
        "spark.sql.redaction.options.regex": f"(?i)url|{SECRET_PATTERN.removeprefix('(?i)')}",
        **storage_settings(conf),
        **conf.spark.extra,
    }


def catalog_settings(conf: LakehouseConf) -> dict[str, str]:
    """Every declared table's name and path (`spark.lakehouse.table.silver.orders=<path>`), read
    by the catalog at each lookup (a session may repoint a name with `spark.conf.set`), and the
    metastore behind it for every other name."""
    c = conf.catalog
    settings = {
        "spark.sql.catalogImplementation": c.metastore,
        "spark.sql.warehouse.dir": conf.warehouse_dir,
    }
    if c.metastore == "hive":
        if not c.hive_metastore_uri:
            raise InvalidConfigError(
                f"catalog.metastore is hive in {conf.source} but catalog.hive_metastore_uri is "
                "not set: give the metastore's thrift://host:port (`lakehouse metastore start` "
                "starts one on this machine)"
            )
        settings["spark.hadoop.hive.metastore.uris"] = c.hive_metastore_uri
        # the Hive client's own scratch folders: not a new /tmp/<uuid>_resources per session
        scratch = f"{tempfile.gettempdir()}/lakehouse-hive-{getpass.getuser()}"
        settings["spark.hadoop.hive.downloaded.resources.dir"] = f"{scratch}/resources"
        settings["spark.hadoop.hive.exec.local.scratchdir"] = f"{scratch}/scratch"
    tables = {f"{TABLE_PREFIX}{name}": path for name, path in conf.table_names().items()}
    return settings | tables


def event_log_settings(conf: LakehouseConf) -> dict[str, str]:
    """Spark's event log of a layer job: rolling, under the storage root ({} when disabled)."""
    if not conf.event_log.enabled:
        return {}
    return {
        "spark.eventLog.enabled": "true",
        "spark.eventLog.dir": conf.event_log_dir,
        "spark.eventLog.rolling.enabled": "true",
        "spark.eventLog.rolling.maxFileSize": conf.event_log.max_file_size,
    }


PROMETHEUS_SERVLET = "org.apache.spark.metrics.sink.PrometheusServlet"


def metrics_settings(conf: LakehouseConf, job: str) -> dict[str, str]:
    """Spark's UI at the job's fixed port, serving Spark's metrics (the streaming queries' among
    them) for Prometheus; {} when metrics are off or the job has no port."""
    port = conf.metrics.spark_ui_ports.get(job)
    if not conf.metrics.enabled or port is None:
        return {}
    sink = "spark.metrics.conf.*.sink.prometheusServlet"
    return {
        "spark.ui.enabled": "true",
        "spark.ui.port": str(port),
        "spark.ui.prometheus.enabled": "true",
        f"{sink}.class": PROMETHEUS_SERVLET,
        f"{sink}.path": "/metrics/prometheus",
        "spark.sql.streaming.metricsEnabled": "true",
        "spark.metrics.namespace": f"lakehouse_{job.replace('-', '_')}",
    }


def history_server_settings(conf: LakehouseConf) -> dict[str, str]:
    """Spark's History Server on the layer jobs' event logs: compacted, and cleaned by age."""
    return {
        "spark.history.fs.logDirectory": conf.event_log_dir,
        "spark.history.ui.port": str(conf.event_log.history_port),
        "spark.history.fs.update.interval": "5s",
        "spark.history.fs.eventLog.rolling.maxFilesToRetain": str(
            conf.event_log.max_files_to_retain
        ),
        "spark.history.fs.cleaner.enabled": "true",
        "spark.history.fs.cleaner.maxAge": f"{conf.event_log.max_age_hours}h",
        "spark.redaction.regex": SECRET_PATTERN,
        **storage_settings(conf),
    }


def storage_settings(conf: LakehouseConf) -> dict[str, str]:
    """The Delta log store, and how S3A reaches an s3a:// root. No keys: S3A reads
    AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY from the environment, as delta-rs does."""
    s3 = conf.storage.s3
    settings = {
        f"spark.delta.logStore.{scheme}.impl": LOG_STORE_CLASS for scheme in ("s3a", "file")
    }
    settings |= {
        # PUT If-None-Match for a create that must not replace a file (Delta commits, leases)
        "spark.hadoop.fs.s3a.create.conditional.enabled": "true",
        "spark.hadoop.fs.s3a.endpoint.region": s3.region,
        "spark.hadoop.fs.s3a.path.style.access": str(s3.path_style_access).lower(),
    }
    if s3.endpoint:
        settings["spark.hadoop.fs.s3a.endpoint"] = s3.endpoint
        secure = s3.endpoint.lower().startswith("https:")
        settings["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(secure).lower()
    return settings
