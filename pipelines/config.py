"""Typed, per-environment configuration: `conf/<env>.yaml`, overridden by environment variables.

Sources, highest first: LAKEHOUSE__* variables (`LAKEHOUSE__A__B` sets `a.b`), `conf/<env>.yaml`,
the defaults below; secrets come only from the environment. Errors name the key and where its
value came from. Parsing and the variables: docs/configuration.md, "Every key is checked", and
docs/configuration.md, "Environment variables".
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal, cast, get_args, get_origin

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    TypeAdapter,
)
from pydantic_core import ErrorDetails, PydanticCustomError, ValidationError

from pipelines.errors import ConfigError

ENV_PREFIX = "LAKEHOUSE__"
SASL_PASSWORD_ENV = "LAKEHOUSE_KAFKA_SASL_PASSWORD"
# What names a secret, in an option's key or value: redacted from our logs and Spark's UI.
SECRET_PATTERN = r"(?i)secret|password|token|access[.]?key|jaas"
REPO_ROOT = Path(__file__).resolve().parent.parent


class InvalidConfigError(ConfigError):
    """A configuration key is unknown or its value is wrong; the message names key and source."""


def _matching(pattern: str, what: str) -> AfterValidator:
    """A check that a string matches `pattern`, else an error saying `what` is expected."""
    regex = re.compile(pattern, re.IGNORECASE | re.ASCII)

    def check(value: str) -> str:
        if not regex.fullmatch(value):
            raise PydanticCustomError("expected", f"expected {what}")
        return value

    return AfterValidator(check)


_DURATION = r"\d+(\.\d+)?\s*(millisecond|second|minute|hour)s?"
Duration = Annotated[str, _matching(_DURATION, "a duration such as '10 seconds' or '1 minute'")]
_UNIT_SECONDS = {"millisecond": 0.001, "second": 1.0, "minute": 60.0, "hour": 3600.0}


def duration_seconds(duration: str) -> float:
    """A configured `Duration` ('10 seconds', '500 milliseconds') in seconds."""
    # a Duration matches _DURATION (checked when configured): both matches hold
    whole = cast(re.Match[str], re.fullmatch(_DURATION, duration.strip(), re.IGNORECASE))
    number, unit = whole.group(0, 2)
    return (
        float(cast(re.Match[str], re.match(r"[\d.]+", number)).group(0))
        * _UNIT_SECONDS[unit.lower()]
    )


Size = Annotated[str, _matching(r"\d+[kmgt]", "a size such as '2g' or '768m'")]
TableName = Annotated[str, _matching(r"[\w-]+([./][\w-]+)*", "a table name like 'bronze/orders'")]
Count = Annotated[int, Field(ge=1)]  # also timeouts in whole seconds
Positive = Annotated[float, Field(gt=0)]
Port = Annotated[int, Field(ge=1, le=65535)]
Share = Annotated[float, Field(ge=0, le=1)]


class _Section(BaseModel):
    # Strict: a YAML value must have the field's type; environment text is parsed by it first.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)


# Roots on Hadoop file systems, by the same code: tables, checkpoints, leases and results go
# through Hadoop's FileSystem API, the runs table through delta-rs. s3a is tested against a real
# S3 endpoint; abfss, gs and hdfs need their connector on the classpath (and delta-rs's support).
_ROOT = r"(?![A-Za-z][\w+.-]*:).+|(s3a|abfss?|gs|hdfs)://[^/]+(/.*)?"
_ROOT_WHAT = (
    "a local folder or a URI of a bucket (and prefix): s3a://bucket/prefix, abfss://container@"
    "account.dfs.core.windows.net/prefix, gs://bucket/prefix, hdfs://namenode/prefix (s3:// "
    "and s3n:// are not Hadoop's S3 connector: use s3a://)"
)


class S3Conf(_Section):
    """The S3 or S3-compatible endpoint of an s3a:// root. The keys come only from the
    environment, AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, read alike by Spark's S3A connector
    and by delta-rs (or from the machine's role when they are unset)."""

    endpoint: str | None = None  # e.g. http://127.0.0.1:9590; None: AWS's, for `region`
    region: str = "us-east-1"
    path_style_access: bool = False  # bucket in the path, not the host name: most local servers

    def delta_rs_options(self) -> dict[str, str]:
        """delta-rs's `storage_options` for the same endpoint (keys from the environment).
        Commits are conditional PUTs (If-None-Match), as the Spark side's log store makes them."""
        options = {"AWS_REGION": self.region, "conditional_put": "etag"}
        if self.endpoint:
            options["AWS_ENDPOINT_URL"] = self.endpoint
            options["AWS_ALLOW_HTTP"] = str(self.endpoint.lower().startswith("http:")).lower()
        options["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = str(not self.path_style_access).lower()
        return options


class StorageConf(_Section):
    """Where the tables live: one root, tables and checkpoints derived from it."""

    # A local folder (the embedded default) or a URI; anything else is refused, never turned into
    # a local folder named like it.
    root: Annotated[str, _matching(_ROOT, _ROOT_WHAT)] = "data/local"
    s3: S3Conf = S3Conf()
    # Task logs of the job runner: a local folder; by default `<root>/_jobs/logs` on a local
    # root and `.lakehouse/logs/<env>` on a remote one.
    log_dir: str | None = None


class LocalStorageConf(_Section):
    """The embedded S3 server of `lakehouse storage start`: S3Proxy with its filesystem backend
    (objects are files under `data_dir`), keys from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY."""

    version: str = "4.1.0"
    host: str = "127.0.0.1"
    port: Port = 9590
    data_dir: str = ".lakehouse/s3/local"
    heap: Size = "256m"
    start_timeout_s: Count = 60


_THRIFT = r"thrift://[\w.-]+:\d+(,thrift://[\w.-]+:\d+)*"


class CatalogConf(_Section):
    """Where the names the lakehouse does not declare live (declared tables resolve by name
    either way). `in-memory`: each session's own, nothing to run; `hive`: a Hive metastore at
    `hive_metastore_uri` shared by every session, e.g. `lakehouse metastore start`'s."""

    metastore: Literal["in-memory", "hive"] = "in-memory"
    hive_metastore_uri: Annotated[str, _matching(_THRIFT, "thrift://host:port")] | None = None
    warehouse_dir: str | None = None  # tables created without a location; <root>/_warehouse


class LocalMetastoreConf(_Section):
    """The Hive metastore of `lakehouse metastore start`: Hive's thrift service from pyspark's
    jars, its database in embedded Derby under `data_dir` (one process opens it: the service)."""

    host: str = "127.0.0.1"
    port: Port = 9083
    data_dir: str = ".lakehouse/metastore/local"
    heap: Size = "512m"
    start_timeout_s: Count = 60


class KafkaConf(_Section):
    """How to reach Kafka. The SASL password comes only from LAKEHOUSE_KAFKA_SASL_PASSWORD."""

    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_ca_location: str | None = None
    request_timeout_s: Count = 15


class LocalBrokerConf(_Section):
    """The embedded KRaft broker started by `lakehouse kafka start`: one node, or a cluster of
    `brokers` nodes (each broker and controller), node i at `port` + i - 1 and
    `controller_port` + i - 1."""

    version: str = "4.3.1"
    host: str = "127.0.0.1"
    brokers: Annotated[int, Field(ge=1, le=9)] = 1
    # SASL_SSL: TLS with a CA of its own (data_dir/security/tls/ca.pem, for kafka.ssl_ca_location)
    # and SCRAM, as kafka.sasl_mechanism says, for the user kafka.sasl_username
    security_protocol: Literal["PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    port: Port = 9092
    controller_port: Port = 9093
    data_dir: str = ".lakehouse/kafka/local"
    heap: Size = "768m"
    # more JVM options for each node and the storage tool that formats it, e.g.
    # `-XX:TieredStopAtLevel=1` (the tests': a node starts on less CPU,
    # bench/RESULTS.md, "Figures behind code choices")
    jvm_options: list[str] = []
    start_timeout_s: Count = 90


class SparkConf(_Section):
    """Session settings; `extra` is passed to the builder as is."""

    master: str = "local[2]"
    app_name: str = "lakehouse"
    shuffle_partitions: Count = 4
    ui: bool = False
    log_level: Literal["ERROR", "WARN", "INFO", "DEBUG"] = "WARN"
    driver_memory: Size = "2g"
    extra: dict[str, str] = {}


class LogConf(_Section):
    """The project's own log lines (Spark's level is `spark.log_level`; `--log-level` sets both)."""

    level: Literal["ERROR", "WARN", "INFO", "DEBUG"] = "INFO"
    format: Literal["text", "json"] = "text"  # json: one object per line, the JVM's lines too
    # the job runner's task logs (<log dir>/<run id>/<task>-<attempt>.log): a long-running task's
    # rotated at task_max_mb (task_backups copies kept), a run's removed task_retention_days after
    # its last line
    task_max_mb: Count = 64
    task_backups: Count = 3
    task_retention_days: Count = 30


class StreamConf(_Section):
    """One Kafka topic and the tables it flows through; each table is declared by the module
    named after it (`silver/orders` -> `silver.orders`) unless `modules` names another."""

    topic: str
    bronze_table: TableName
    partitions: Count = 4
    replication_factor: Count = 1
    min_insync_replicas: Count | None = None  # the topic's min.insync.replicas; None: the broker's
    events_table: TableName | None = None  # silver: every valid event once
    state_table: TableName | None = None  # silver: current state per natural key
    quarantine_table: TableName | None = None  # silver: every invalid record with its reason
    gold_tables: list[TableName] = []  # gold: windowed aggregates of the events, added per batch
    late_events_table: TableName | None = None  # gold: events too late for the windows
    dimensions: dict[str, TableName] = {}  # gold: role -> dimension table joined per batch
    enrich: str | None = None  # gold: module with enrich(events, dimensions) and their schemas
    modules: dict[str, str] = {}  # table -> module declaring it, e.g. for a stream in a test
    # Which records of the topic belong to the stream: `read_committed`, only those of committed
    # Kafka transactions (and plain records); `read_uncommitted` also takes records of aborted and
    # still-open transactions. Every consumer of the topic the project runs reads this way.
    isolation_level: Literal["read_committed", "read_uncommitted"] = "read_committed"
    # gold table -> the compacted Kafka topic every change of its rows is published to
    # (`lakehouse run publish`), exactly once; default `<topic>.<table>`, e.g.
    # orders.events.gold.revenue_by_category_1m
    gold_topics: dict[TableName, str] = {}
    # the publisher's own compacted topic: the last table version it published, per gold table,
    # committed in the same Kafka transaction as the changes; default `_lakehouse.published.<topic>`
    published_topic: str | None = None

    def module(self, table: str) -> str:
        """The module that declares `table`."""
        return self.modules.get(table) or table.replace("/", ".")

    @property
    def gaps_table(self) -> str:
        """Bronze: the offset ranges Kafka deleted before they were read."""
        return f"{self.bronze_table}_gaps"

    def gold_topic(self, table: str) -> str:
        """The topic the changes of gold table `table` are published to."""
        return self.gold_topics.get(table) or f"{self.topic}.{table.replace('/', '.')}"

    @property
    def published_versions_topic(self) -> str:
        """The publisher's topic of published versions (`published_topic`, or its default)."""
        return self.published_topic or f"_lakehouse.published.{self.topic}"

    @property
    def high_water_table(self) -> str | None:
        """Gold: the newest event time seen, from which lateness is measured."""
        return self.late_events_table and f"{self.late_events_table}_high_water"

    def tables(self) -> list[str]:
        """Every table of the stream, in flow order."""
        names = [self.bronze_table, self.gaps_table, self.events_table, self.state_table]
        names += [self.quarantine_table, *self.gold_tables, self.late_events_table]
        names += [self.high_water_table, *self.dimensions.values()]
        return [n for n in names if n]


class BronzeConf(_Section):
    """Bronze ingest: trigger, rate limit, and what to do when Kafka lost offsets to retention."""

    trigger_interval: Duration = "10 seconds"
    # offsets per micro-batch (and up to one more per partition); None: all there are
    max_offsets_per_trigger: Count | None = None
    source_options: dict[str, str] = {}  # Spark Kafka source options, e.g. minPartitions
    on_data_loss: Literal["fail", "record"] = "fail"


class SilverConf(_Section):
    """Silver job: triggers, how much of bronze one micro-batch takes, and the clock bound."""

    trigger_interval: Duration = "10 seconds"
    max_files_per_trigger: Count | None = 50
    # and bronze files up to about this size (one file at least): a batch's parse is cached in
    # the driver, and a backlog taken whole spills it to disk (bench/RESULTS.md, "Figures behind
    # code choices")
    max_bytes_per_trigger: Size | None = "64m"
    # an event_time more than this ahead of its record's Kafka timestamp is invalid (quarantined):
    # one producer with a broken clock must not make every later event late in gold
    max_clock_skew_minutes: Annotated[int, Field(ge=0)] = 5
    # the state table (a MERGE) follows the events table in a query of its own, this often
    state_trigger_interval: Duration = "30 seconds"


class PipelineConf(_Section):
    """The pipeline job: one query through bronze, silver and gold per micro-batch."""

    trigger_interval: Duration = "0 seconds"  # the next batch starts as soon as one ends
    max_offsets_per_trigger: Count | None = 1_000_000  # a backlog drains in batches of this many
    # the state table (a MERGE) follows the events table in a query of its own, this often: its
    # MERGE reads the whole state table whatever it adds, and beside the pipeline's batches it
    # slows them (bench/RESULTS.md, "Figures behind code choices")
    state_trigger_interval: Duration = "2 minutes"
    # `lakehouse run pipeline`'s driver (spark.driver_memory is the other jobs'): it holds a batch
    # of every layer at once and the state query's MERGE; with 2g, at 10,000 records/s and 1.9M
    # orders, it stalled for 30 s in collections (bench/RESULTS.md, "Figures behind code choices")
    driver_memory: Size = "4g"


class GoldConf(_Section):
    """Gold job: trigger, allowed lateness, batch size, and where the dimension seeds are."""

    trigger_interval: Duration = "10 seconds"
    allowed_lateness_minutes: Annotated[int, Field(ge=0)] = 10
    max_files_per_trigger: Count | None = 50
    max_bytes_per_trigger: Size | None = None  # and silver files up to about this size
    seed_dir: str = "conf/seeds"
    check_quality_per_batch: bool = False  # run the gold suites on each batch before its MERGE


class PublishConf(_Section):
    """Gold to Kafka (`lakehouse run publish`): every change of each gold table (`gold_topics` of
    its stream) to its compacted topic, in version order, in Kafka transactions that also commit
    the versions published (the stream's `published_topic`), so each change is seen once."""

    trigger_interval: Duration = "1 second"  # how often the gold tables are looked at
    partitions: Count = 1  # of each gold topic: one keeps every change in the table's order
    max_versions_per_transaction: Count = 100  # of each table; a backlog goes in several
    transaction_timeout_s: Count = 60  # Kafka aborts a transaction left open this long


class QualityConf(_Section):
    """Data-quality checks: per-suite policy (`warn` or `fail`) and the `unknown` share allowed."""

    default_policy: Literal["warn", "fail"] = "fail"
    policies: dict[str, Literal["warn", "fail"]] = {}
    unknown_share_max: Share = 0.10  # share of gold rows under `unknown`


class ClusterConf(_Section):
    """The Spark standalone cluster of `lakehouse cluster start`: a master and its workers."""

    host: str = "127.0.0.1"
    master_port: Port = 7077
    master_webui_port: Port = 8080
    workers: Count = 2
    worker_cores: Count = 1
    worker_memory: Size = "2g"
    # cores each application takes unless it sets spark.cores.max (the master's
    # spark.deploy.defaultCores): Spark's default, every free core, would leave a job's other
    # tasks waiting for the first one to end, for ever beside a continuous one
    app_cores: Count = 1
    dir: str = ".lakehouse/cluster"
    start_timeout_s: Count = 60

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.master_port}"


_DEFAULT_JOBS = (
    "bronze-orders",
    "silver-orders",
    "gold-orders",
    "pipeline-orders",
    "publish-orders",
)


class MetricsConf(_Section):
    """Prometheus metrics of the long-running layer jobs, at ports fixed per job (`<layer>-<stream>`):
    the lakehouse's own at `ports` (/metrics), Spark's own (its UI's PrometheusServlet, so the UI
    is on for these jobs) at `spark_ui_ports` (/metrics/prometheus). `lakehouse metrics targets`
    writes them as a Prometheus file_sd file."""

    enabled: bool = True
    host: str = "127.0.0.1"
    ports: dict[str, Port] = dict(zip(_DEFAULT_JOBS, range(9411, 9416), strict=True))
    spark_ui_ports: dict[str, Port] = dict(zip(_DEFAULT_JOBS, range(4051, 4056), strict=True))
    targets_file: str | None = None  # default: .lakehouse/prometheus/<env>.json


class LineageConf(_Section):
    """OpenLineage events of the layer jobs: each job run and micro-batch, START then COMPLETE,
    naming the datasets read and written; to a file, or to an HTTP endpoint (`url`)."""

    enabled: bool = True
    namespace: str = "lakehouse"  # the jobs' namespace
    file: str | None = None  # JSON lines; default: <log dir>/lineage.jsonl
    url: str | None = None  # e.g. Marquez at http://127.0.0.1:5000: events go there, not to a file
    endpoint: str = "api/v1/lineage"


class MaintenanceConf(_Section):
    """`lakehouse maintain`: compaction, old files removed, the log checkpointed."""

    # VACUUM keeps what a version this young needs: time travel, and streaming readers that fall
    # behind. Delta's own floor is 7 days; a shorter retention is refused here, naming this key.
    vacuum_retention_hours: Annotated[int, Field(ge=168)] = 168
    # LITE finds what to delete in the log; FULL lists the storage, also finding the files of
    # writes that never committed (a job killed mid-batch), at a far higher cost
    vacuum_full: bool = False


class EventLogConf(_Section):
    """Spark's event log of the layer jobs, for Spark's History Server (`lakehouse history`)."""

    enabled: bool = True
    dir: str | None = None  # default: <storage root>/_spark_events
    max_file_size: Size = "32m"  # a job's log rolls over to a new file at this size (>= 10m)
    max_files_to_retain: Count = 8  # per job: the History Server compacts older files
    max_age_hours: Count = 168  # the History Server deletes the logs of jobs older than this
    history_port: Port = 18080  # the History Server's UI and REST API
    history_dir: str = ".lakehouse/history"  # its own log and pid file


class ProgressTableConf(_Section):
    """The progress table: every streaming query's progress, appended to a Delta table."""

    enabled: bool = True
    table: TableName = "system/query_progress"
    flush_interval_s: Positive = 10.0  # how often buffered progress rows are written


CatalogName = Annotated[str, _matching(r"[a-z_]\w*[.][a-z_]\w*", "a name like 'silver.orders'")]


class TablesConf(_Section):
    """The tables every job shares, and the names tables are reached by (`<schema>.<table>`: a
    table's path with `/` as `.`, unless `names` gives it another)."""

    quality_results: TableName = "quality/results"
    job_runs: TableName = "_jobs/runs"
    names: dict[TableName, CatalogName] = {"_jobs/runs": "system.job_runs"}


class JobClusterConf(_Section):
    """What a job spec's cluster (an `existing_cluster_id` or a `job_cluster_key`) runs on here."""

    master: str | None = None  # None: spark.master, unless the spec or the command names one
    spark_conf: dict[str, str] = {}  # under the spec's own spark_conf


class JobsConf(_Section):
    """Clusters of Databricks job specs, by the id or key the specs give them."""

    clusters: dict[str, JobClusterConf] = {}


class ProducerConf(_Section):
    """Defaults of `lakehouse produce` for the reference stream."""

    stream: str = "orders"
    seed: int = 7
    orders: Count = 1_000
    start_time: str = "2026-11-22T10:00:00Z"
    events_per_second: Positive = 20.0


class LakehouseConf(_Section):
    """The whole configuration of one environment; `env` and `source` are set by the loader."""

    env: str = "local"
    source: str = "<defaults>"
    storage: StorageConf = StorageConf()
    kafka: KafkaConf = KafkaConf()
    local_broker: LocalBrokerConf = LocalBrokerConf()
    local_storage: LocalStorageConf = LocalStorageConf()
    catalog: CatalogConf = CatalogConf()
    local_metastore: LocalMetastoreConf = LocalMetastoreConf()
    spark: SparkConf = SparkConf()
    log: LogConf = LogConf()
    bronze: BronzeConf = BronzeConf()
    silver: SilverConf = SilverConf()
    gold: GoldConf = GoldConf()
    pipeline: PipelineConf = PipelineConf()
    publish: PublishConf = PublishConf()
    quality: QualityConf = QualityConf()
    progress_table: ProgressTableConf = ProgressTableConf()
    event_log: EventLogConf = EventLogConf()
    metrics: MetricsConf = MetricsConf()
    lineage: LineageConf = LineageConf()
    maintenance: MaintenanceConf = MaintenanceConf()
    cluster: ClusterConf = ClusterConf()
    producer: ProducerConf = ProducerConf()
    jobs: JobsConf = JobsConf()
    tables: TablesConf = TablesConf()
    streams: dict[str, StreamConf] = {}
    _origins: dict[str, str] = PrivateAttr(default_factory=dict)  # set key -> where, by the loader

    def origin(self, key: str) -> str:
        """Where the value of the dotted `key` came from: a variable, a file, or the defaults."""
        while key and key not in self._origins:
            key = key.rpartition(".")[0]
        return self._origins.get(key, "default")

    @property
    def root(self) -> str:
        """The storage root: an absolute local path, or a URI as configured (no trailing /)."""
        if self.remote:
            return self.storage.root.rstrip("/")
        return str(_resolve(self.storage.root))

    @property
    def remote(self) -> bool:
        """Whether the root is a URI (object storage, HDFS) rather than a local folder."""
        return re.match(r"[A-Za-z][\w+.-]*:", self.storage.root) is not None

    @property
    def uses_s3(self) -> bool:
        """Whether Spark needs S3A: an s3a:// root, or an S3 endpoint configured."""
        return self.root.startswith("s3a://") or self.storage.s3.endpoint is not None

    def delta_rs_options(self) -> dict[str, str] | None:
        """delta-rs's `storage_options` for the root (None: its defaults, from the environment)."""
        return self.storage.s3.delta_rs_options() if self.root.startswith("s3a://") else None

    def table_path(self, table: str) -> str:
        """Path of a table named like `bronze/orders_raw` (or `bronze.orders_raw`)."""
        return f"{self.root}/{_table_rel(table)}"

    def table_names(self) -> dict[str, str]:
        """Every declared table by its name in the session catalog (`silver.orders`) -> path."""
        tables = [t for stream in self.streams.values() for t in stream.tables()]
        tables += [self.tables.quality_results, self.progress_table.table, self.tables.job_runs]
        named: dict[str, str] = {}
        for table in tables:
            rel = _table_rel(table)
            name = self.tables.names.get(table) or self.tables.names.get(rel)
            if name is None:
                schema, _, rest = rel.partition("/")
                name = f"{schema}.{rest.replace('/', '_')}".lower().lstrip("_")
            if named.get(name, rel) != rel:
                raise InvalidConfigError(
                    f"tables {named[name]!r} and {table!r} in {self.source} are both named "
                    f"{name!r}: give one another name under tables.names"
                )
            named[name] = rel
        return {name: f"{self.root}/{rel}" for name, rel in named.items()}

    def checkpoint_path(self, table: str) -> str:
        """The one checkpoint of the sink that writes `table`."""
        return f"{self.root}/_checkpoints/{_table_rel(table)}"

    @property
    def event_log_dir(self) -> str:
        """Where the layer jobs write Spark's event log: a local path or a URI."""
        return _folder(self.event_log.dir, f"{self.root}/_spark_events")

    @property
    def warehouse_dir(self) -> str:
        """Where a table created by name without a location goes."""
        return _folder(self.catalog.warehouse_dir, f"{self.root}/_warehouse")

    @property
    def metastore_data_dir(self) -> Path:
        return _resolve(self.local_metastore.data_dir)

    @property
    def lineage_file(self) -> Path:
        """Where the OpenLineage events go when no `lineage.url` is set."""
        return _resolve(self.lineage.file) if self.lineage.file else self.log_dir / "lineage.jsonl"

    @property
    def targets_file(self) -> Path:
        """The Prometheus file_sd file of the jobs' metrics endpoints."""
        return _resolve(self.metrics.targets_file or f".lakehouse/prometheus/{self.env}.json")

    def metric_targets(self) -> list[dict[str, Any]]:
        """Every job's two metrics endpoints as Prometheus file_sd target groups."""
        m, groups = self.metrics, []
        for job, port in sorted(m.ports.items()):
            labels = {"job": f"lakehouse-{job}", "env": self.env}
            groups.append({"targets": [f"{m.host}:{port}"], "labels": labels})
            if (ui := m.spark_ui_ports.get(job)) is not None:
                spark = {"job": f"spark-{job}", "env": self.env}
                spark["__metrics_path__"] = "/metrics/prometheus"
                groups.append({"targets": [f"{m.host}:{ui}"], "labels": spark})
        return groups

    @property
    def history_dir(self) -> Path:
        return _resolve(self.event_log.history_dir)

    @property
    def log_dir(self) -> Path:
        """The local folder of the job runner's task logs."""
        if self.storage.log_dir is not None:
            return _resolve(self.storage.log_dir)
        if self.remote:
            return _resolve(".lakehouse/logs") / self.env
        return Path(self.root) / "_jobs" / "logs"

    def stream(self, name: str) -> StreamConf:
        if name not in self.streams:
            known = ", ".join(sorted(self.streams)) or "none"
            raise InvalidConfigError(
                f"unknown stream {name!r}: {self.source} defines streams: {known}"
            )
        return self.streams[name]

    @property
    def seed_dir(self) -> Path:
        return _resolve(self.gold.seed_dir)

    @property
    def storage_data_dir(self) -> Path:
        return _resolve(self.local_storage.data_dir)

    @property
    def broker_data_dir(self) -> Path:
        return _resolve(self.local_broker.data_dir)

    @property
    def ssl_ca_file(self) -> Path | None:
        """`kafka.ssl_ca_location`, a relative path taken from the repository."""
        location = self.kafka.ssl_ca_location
        return None if location is None else _resolve(location)

    @property
    def cluster_dir(self) -> Path:
        return _resolve(self.cluster.dir)

    def updated(self, values: dict[str, object]) -> LakehouseConf:
        """A copy with dotted keys set, e.g. {"storage.root": "/tmp/x"}, checked like a file."""
        tree = self.model_dump(exclude={"env": True, "source": True, "kafka": {"sasl_password"}})
        sources: dict[str, str] = {}
        for key, value in values.items():
            _put(tree, key.split("."), value, "updated()", sources)
        secret = self.kafka.sasl_password
        return _validated(tree, sources, [], secret, env=self.env, source=self.source)

    def as_dict(self) -> dict[str, Any]:
        """The effective configuration as plain JSON-able data, secrets masked."""
        return self.model_dump(mode="json")


def _table_rel(table: str) -> str:
    if not re.fullmatch(r"[\w-]+([./][\w-]+)*", table, re.ASCII):
        raise InvalidConfigError(
            f"bad table name {table!r}: use layer/name, e.g. bronze/orders_raw"
        )
    return "/".join(re.split(r"[./]", table))


def _folder(configured: str | None, default: str) -> str:
    """A configured folder: a URI as given, a local path resolved; `default` when unset."""
    if configured is None:
        return default
    if re.match(r"[A-Za-z][\w+.-]*:", configured):
        return configured.rstrip("/")
    return str(_resolve(configured))


def _resolve(path: str) -> Path:
    return REPO_ROOT / Path(path).expanduser()  # an absolute path replaces REPO_ROOT


def load_config(env: str | None = None, path: str | Path | None = None) -> LakehouseConf:
    """Load `conf/<env>.yaml` (or `path`), apply LAKEHOUSE__* variables, and check every key."""
    env = env or os.environ.get("LAKEHOUSE_ENV", "local")
    folder = Path(os.environ.get("LAKEHOUSE_CONF_DIR", REPO_ROOT / "conf"))
    file = Path(path) if path else folder / f"{env}.yaml"
    if not file.is_file():
        available = sorted(p.stem for p in folder.glob("*.yaml"))
        raise InvalidConfigError(
            f"no configuration file {file} for environment {env!r} (available: {available})"
        )
    try:
        tree = yaml.load(file.read_text(encoding="utf-8"), Loader=_Yaml) or {}
    except yaml.YAMLError as e:
        raise InvalidConfigError(f"{file} is not valid YAML: {e}") from None
    if not isinstance(tree, dict):
        raise InvalidConfigError(f"{file}: the top level must be a mapping of sections")
    sources: dict[str, str] = {}
    problems: list[str] = []
    in_file = [key for key, _ in leaf_values(tree)]
    for name, text in sorted(os.environ.items()):
        if name.startswith(ENV_PREFIX):
            keys = _env_keys(name[len(ENV_PREFIX) :].split("__"))
            where = f"environment variable {name}"
            try:  # the text parsed by the type of the key it sets; "" is null
                value = None if text == "" else _parsed(text, _field_type(keys))
                _put(tree, keys, value, where, sources)
            except ValidationError as e:
                problems += [_problem(err, {}, where, tuple(keys)) for err in e.errors()]
    secret = os.environ.get(SASL_PASSWORD_ENV) or None
    conf = _validated(tree, sources, problems, secret, env=env, source=str(file))
    conf._origins = {key: str(file) for key in in_file} | sources
    return conf


def leaf_values(tree: dict, prefix: str = "") -> list[tuple[str, Any]]:
    """The values of a tree by dotted key (each of a map's keys, a list as one value)."""
    leaves = []
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            leaves += leaf_values(value, f"{dotted}.")
        else:
            leaves.append((dotted, value))
    return leaves


class _Yaml(yaml.SafeLoader):
    """YAML read as 1.2 reads it, so that a value means what it does in an environment variable:
    booleans only true or false, integers in decimal (1.1 reads `yes` as true and `0123` as 83)."""


_Yaml.yaml_implicit_resolvers = {
    first: [(tag, rx) for tag, rx in resolvers if not tag.endswith((":bool", ":int"))]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Yaml.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)
_Yaml.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^[-+]?\d+$"), list("-+0123456789")
)
_Yaml.add_constructor("tag:yaml.org,2002:int", lambda loader, node: int(node.value, 10))


def _parsed(text: str, field_type: Any) -> Any:
    """A variable's text as a value of `field_type`: a list as a YAML flow sequence, a boolean
    only as true or false (in any case)."""
    value: Any = text
    if get_origin(field_type) in (list, tuple):
        try:
            value = yaml.load(text, Loader=_Yaml)
        except yaml.YAMLError:
            pass  # refused below, as not a list
    if field_type is bool or bool in get_args(field_type):
        value = {"true": True, "false": False}.get(text.lower(), text)
        return TypeAdapter(field_type).validate_python(value, strict=True)
    return TypeAdapter(field_type).validate_python(value)


def _env_keys(parts: list[str]) -> list[str]:
    """A variable's keys: field names in lower case, a map's keys as written unless all in
    capitals (`..._EXTRA__spark.sql.ansi.enabled` keeps its case, `..._STREAMS__ORDERS` is
    `orders`)."""
    keys: list[str] = []
    field_type: Any = LakehouseConf
    for part in parts:
        if get_origin(field_type) is dict:
            keys.append(part.lower() if part.isupper() else part)
            field_type = get_args(field_type)[1]
        else:
            keys.append(part.lower())
            fields = getattr(field_type, "model_fields", {})
            field_type = fields[keys[-1]].annotation if keys[-1] in fields else Any
    return keys


def _field_type(keys: list[str]) -> Any:
    """The type of the key `keys` (a model class for a section); `Any` for an unknown key, so its
    text stays text and the whole-tree check refuses it, naming where it came from."""
    field_type: Any = LakehouseConf
    for key in keys:
        if get_origin(field_type) is dict:
            field_type = get_args(field_type)[1]
        elif key in getattr(field_type, "model_fields", {}):
            field_type = field_type.model_fields[key].annotation
        else:
            return Any
    return field_type


def _put(tree: dict, keys: list[str], value: Any, where: str, sources: dict[str, str]) -> None:
    """Set `keys` to `value` in `tree`, creating sections (a map from its defaults: one key set
    keeps its siblings), and remember where the value came from."""
    node, field_type = tree, cast(Any, LakehouseConf)
    for i, key in enumerate(keys[:-1]):
        fields = getattr(field_type, "model_fields", {})
        if node.get(key) is None:
            default = fields[key].default if key in fields else None
            node[key] = dict(default) if isinstance(default, dict) else {}
            sources.setdefault(".".join(keys[: i + 1]), where)
            sources |= {".".join([*keys[: i + 1], k]): "default" for k in node[key]}
        node = node[key]
        if not isinstance(node, dict):
            raise InvalidConfigError(f"{where}: {'.'.join(keys[: i + 1])} is not a section")
        field_type = fields[key].annotation if key in fields else Any
    node[keys[-1]] = value
    sources[".".join(keys)] = where


def _validated(
    tree: dict, sources: dict[str, str], problems: list[str], secret: Any, **fixed: str
) -> LakehouseConf:
    """Check the merged tree strictly, with the password and `env` and `source` set by the loader."""
    problems += [_unknown(k, _where(k, sources, fixed["source"])) for k in fixed if k in tree]
    kafka = tree.setdefault("kafka", {})
    if isinstance(kafka, dict):
        if "sasl_password" in kafka:
            where = _where("kafka.sasl_password", sources, fixed["source"])
            problems.append(
                f"kafka.sasl_password in {where}: secrets come only from the environment "
                f"variable {SASL_PASSWORD_ENV}"
            )
        kafka["sasl_password"] = secret
    try:
        conf = LakehouseConf.model_validate({**tree, **fixed})
    except ValidationError as e:
        problems += [_problem(err, sources, fixed["source"]) for err in e.errors()]
    if not problems:  # a ValidationError always has errors: `conf` is set here
        return conf
    if len(problems) == 1:
        raise InvalidConfigError(problems[0])
    raise InvalidConfigError(f"{len(problems)} configuration problems:\n  " + "\n  ".join(problems))


def _where(key: str, sources: dict[str, str], default: str) -> str:
    """Where `key` came from: the variable that set it or its section, else the file."""
    while key and key not in sources:
        key = key.rpartition(".")[0]
    return sources.get(key, default)


def _unknown(key: str, where: str) -> str:
    *section, _ = key.split(".")
    known = sorted(set(_field_type(section).model_fields) - {"env", "source"})
    of = f" of {'.'.join(section)}" if section else ""
    return f"unknown key {key!r} in {where}; known keys{of}: {', '.join(known)}"


_EXPECTED = {"int": "an integer", "float": "a number", "bool": "true or false"}
_EXPECTED |= {"string": "a string", "dict": "a mapping", "model": "a mapping"}
_BOUNDS = {"greater_than": ">", "greater_than_equal": ">=", "less_than_equal": "<="}


def _problem(error: ErrorDetails, sources: dict, default: str, prefix: tuple = ()) -> str:
    """One pydantic error as a sentence naming the key and where its value came from."""
    key = ".".join([*prefix, *map(str, error["loc"])])
    where = _where(key, sources, default)
    kind, value, ctx = error["type"], error["input"], error.get("ctx", {})
    if kind == "extra_forbidden":
        return _unknown(key, where)
    if kind == "missing":
        return f"missing key {key!r} in {where}"
    if kind == "literal_error":
        choices = ", ".join(re.findall(r"'([^']*)'", ctx["expected"]))
        return f"{key} in {where}: {value!r} is not one of {choices}"
    family = kind.split("_")[0]
    if kind in _BOUNDS:
        expected = f"must be {_BOUNDS[kind]} {next(iter(ctx.values()))}"
    else:  # our own checks' messages are pydantic's ("expected a duration ...")
        expected = f"expected {_EXPECTED[family]}" if family in _EXPECTED else error["msg"]
    return f"{key} in {where}: {expected}, got {value!r}"
