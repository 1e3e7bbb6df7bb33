"""Typed, per-environment configuration: `conf/<env>.yaml`, overridden by environment variables.

Every key is checked: an unknown key or a bad value fails at load time with a message that names
the key and the file (or the environment variable) it came from.

Environment variables:
    LAKEHOUSE_ENV            environment name, i.e. which `conf/<env>.yaml` (default `local`)
    LAKEHOUSE_CONF_DIR       folder holding the YAML files (default: the repository's `conf/`)
    LAKEHOUSE__A__B=value    overrides key `a.b` (double underscores separate levels), e.g.
                             LAKEHOUSE__KAFKA__BOOTSTRAP_SERVERS=broker1:9092,broker2:9092
    LAKEHOUSE_KAFKA_SASL_PASSWORD   the SASL password; secrets never come from files.
"""

from __future__ import annotations

import dataclasses
import os
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from pipelines.errors import ConfigError

ENV_PREFIX = "LAKEHOUSE__"
SASL_PASSWORD_ENV = "LAKEHOUSE_KAFKA_SASL_PASSWORD"
REPO_ROOT = Path(__file__).resolve().parent.parent


class InvalidConfigError(ConfigError):
    """A configuration key is unknown or its value is wrong; the message names key and source."""


@dataclass(frozen=True)
class StorageConf:
    """Where the tables live: one root, tables and checkpoints derived from it."""

    root: str = "data/local"


@dataclass(frozen=True)
class KafkaConf:
    """How to reach Kafka. The SASL password comes only from LAKEHOUSE_KAFKA_SASL_PASSWORD."""

    bootstrap_servers: str = "127.0.0.1:9092"
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    ssl_ca_location: str | None = None
    request_timeout_s: int = 15


@dataclass(frozen=True)
class LocalBrokerConf:
    """The embedded single-node KRaft broker started by `lakehouse kafka start`."""

    version: str = "4.3.1"
    host: str = "127.0.0.1"
    port: int = 9092
    controller_port: int = 9093
    data_dir: str = ".lakehouse/kafka/local"
    heap: str = "768m"
    start_timeout_s: int = 90


@dataclass(frozen=True)
class SparkConf:
    """Session settings; `extra` is passed to the builder as is."""

    master: str = "local[2]"
    app_name: str = "lakehouse"
    shuffle_partitions: int = 4
    ui: bool = False
    log_level: Literal["ERROR", "WARN", "INFO", "DEBUG"] = "WARN"
    driver_memory: str = "2g"
    extra: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamConf:
    """One Kafka topic and the bronze table it lands in."""

    topic: str
    bronze_table: str
    partitions: int = 4
    replication_factor: int = 1
    events_table: str | None = None  # silver: every valid event once
    state_table: str | None = None  # silver: current state per natural key
    quarantine_table: str | None = None  # silver: every invalid record with its reason


@dataclass(frozen=True)
class BronzeConf:
    """Bronze ingest: trigger, rate limit, and what to do when Kafka lost offsets to retention."""

    trigger_interval: str = "10 seconds"
    max_offsets_per_trigger: int | None = 200_000
    on_data_loss: Literal["fail", "record"] = "fail"


@dataclass(frozen=True)
class SilverConf:
    """Silver job: trigger and how much of bronze one micro-batch takes."""

    trigger_interval: str = "10 seconds"
    max_files_per_trigger: int | None = 50


@dataclass(frozen=True)
class GoldConf:
    """Gold job: trigger, allowed lateness, batch size, and where the dimension seeds are."""

    trigger_interval: str = "10 seconds"
    allowed_lateness_minutes: int = 10
    max_files_per_trigger: int | None = 50
    seed_dir: str = "conf/seeds"
    check_quality_per_batch: bool = False  # run the gold suites on each batch before its MERGE


@dataclass(frozen=True)
class QualityConf:
    """Data-quality checks: per-suite policy (`warn` or `fail`) and the `unknown` share allowed."""

    default_policy: Literal["warn", "fail"] = "fail"
    policies: dict[str, Literal["warn", "fail"]] = field(default_factory=dict)
    unknown_share_max: float = 0.10  # share of gold rows under `unknown`


@dataclass(frozen=True)
class ClusterConf:
    """The Spark standalone cluster of `lakehouse cluster start`: a master and its workers."""

    host: str = "127.0.0.1"
    master_port: int = 7077
    master_webui_port: int = 8080
    workers: int = 2
    worker_cores: int = 1
    worker_memory: str = "2g"
    dir: str = ".lakehouse/cluster"
    start_timeout_s: int = 60

    @property
    def master_url(self) -> str:
        return f"spark://{self.host}:{self.master_port}"


@dataclass(frozen=True)
class ProgressTableConf:
    """The progress table: every streaming query's progress, appended to a Delta table."""

    enabled: bool = True
    table: str = "system/query_progress"
    flush_interval_s: float = 10.0  # how often buffered progress rows are written


@dataclass(frozen=True)
class ProducerConf:
    """Defaults of `lakehouse produce` for the reference stream."""

    stream: str = "orders"
    seed: int = 7
    orders: int = 1_000
    start_time: str = "2026-11-22T10:00:00Z"
    events_per_second: float = 20.0


@dataclass(frozen=True)
class LakehouseConf:
    """The whole configuration of one environment."""

    env: str = "local"
    source: str = "<defaults>"
    storage: StorageConf = field(default_factory=StorageConf)
    kafka: KafkaConf = field(default_factory=KafkaConf)
    local_broker: LocalBrokerConf = field(default_factory=LocalBrokerConf)
    spark: SparkConf = field(default_factory=SparkConf)
    bronze: BronzeConf = field(default_factory=BronzeConf)
    silver: SilverConf = field(default_factory=SilverConf)
    gold: GoldConf = field(default_factory=GoldConf)
    quality: QualityConf = field(default_factory=QualityConf)
    progress_table: ProgressTableConf = field(default_factory=ProgressTableConf)
    cluster: ClusterConf = field(default_factory=ClusterConf)
    producer: ProducerConf = field(default_factory=ProducerConf)
    streams: dict[str, StreamConf] = field(default_factory=dict)

    @property
    def root(self) -> Path:
        return _resolve(self.storage.root)

    def table_path(self, table: str) -> str:
        """Path of a table named like `bronze/orders_raw` (or `bronze.orders_raw`)."""
        return str(self.root / _table_rel(table))

    def checkpoint_path(self, table: str) -> str:
        """The one checkpoint of the sink that writes `table`."""
        return str(self.root / "_checkpoints" / _table_rel(table))

    def stream(self, name: str) -> StreamConf:
        try:
            return self.streams[name]
        except KeyError:
            known = ", ".join(sorted(self.streams)) or "none"
            raise InvalidConfigError(
                f"unknown stream {name!r}: {self.source} defines streams: {known}"
            ) from None

    @property
    def seed_dir(self) -> Path:
        return _resolve(self.gold.seed_dir)

    @property
    def broker_data_dir(self) -> Path:
        return _resolve(self.local_broker.data_dir)

    @property
    def cluster_dir(self) -> Path:
        return _resolve(self.cluster.dir)

    def with_overrides(self, **sections: Any) -> LakehouseConf:
        """A copy with whole sections or fields replaced, e.g. storage=StorageConf(root=...)."""
        return dataclasses.replace(self, **sections)


def _table_rel(table: str) -> Path:
    parts = re.split(r"[./]", table)
    if not all(re.fullmatch(r"[A-Za-z0-9_\-]+", p) for p in parts):
        raise InvalidConfigError(
            f"bad table name {table!r}: use layer/name, e.g. bronze/orders_raw"
        )
    return Path(*parts)


def _resolve(path: str) -> Path:
    p = Path(os.path.expanduser(path))
    return p if p.is_absolute() else (REPO_ROOT / p)


def conf_dir() -> Path:
    return Path(os.environ.get("LAKEHOUSE_CONF_DIR", REPO_ROOT / "conf"))


def load_config(env: str | None = None, path: str | Path | None = None) -> LakehouseConf:
    """Load `conf/<env>.yaml` (or `path`), apply LAKEHOUSE__* overrides, and check every key."""
    env = env or os.environ.get("LAKEHOUSE_ENV", "local")
    file = Path(path) if path else conf_dir() / f"{env}.yaml"
    if not file.is_file():
        available = sorted(p.stem for p in conf_dir().glob("*.yaml"))
        raise InvalidConfigError(
            f"no configuration file {file} for environment {env!r} (available: {available})"
        )
    try:
        raw = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as e:
        raise InvalidConfigError(f"{file} is not valid YAML: {e}") from None
    if not isinstance(raw, dict):
        raise InvalidConfigError(f"{file}: the top level must be a mapping of sections")
    raw.setdefault("env", env)
    sources: dict[str, str] = {}
    _apply_env_overrides(raw, sources)
    conf = _build(LakehouseConf, {**raw, "source": str(file)}, "", str(file), sources)
    return conf


def _apply_env_overrides(raw: dict[str, Any], sources: dict[str, str]) -> None:
    for name, value in sorted(os.environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        keys = [k.lower() for k in name[len(ENV_PREFIX) :].split("__")]
        node = raw
        for k in keys[:-1]:
            child = node.get(k)
            if child is None:
                child = node[k] = {}
            if not isinstance(child, dict):
                raise InvalidConfigError(f"environment variable {name}: {k!r} is not a section")
            node = child
        node[keys[-1]] = yaml.safe_load(value) if value != "" else None
        sources[".".join(keys)] = f"environment variable {name}"


_DURATION = re.compile(r"^\d+(\.\d+)?\s*(milliseconds?|seconds?|minutes?|hours?)$", re.IGNORECASE)
# Checks beyond the type, keyed by the field's dotted name.
_CHECKS: dict[str, tuple[Any, str]] = {
    "bronze.trigger_interval": (_DURATION.match, "a duration such as '10 seconds' or '1 minute'"),
    "silver.trigger_interval": (_DURATION.match, "a duration such as '10 seconds' or '1 minute'"),
    "gold.trigger_interval": (_DURATION.match, "a duration such as '10 seconds' or '1 minute'"),
    "spark.driver_memory": (re.compile(r"^\d+[kmgt]$", re.IGNORECASE).match, "a size such as '2g'"),
    "local_broker.heap": (re.compile(r"^\d+[kmg]$", re.IGNORECASE).match, "a size such as '768m'"),
}


def _check(key: str, value: Any, where: str) -> None:
    check = _CHECKS.get(key)
    if check and value is not None and not check[0](str(value)):
        raise InvalidConfigError(f"{key} in {where}: expected {check[1]}, got {value!r}")


def _build(cls: type, data: Any, prefix: str, file: str, sources: dict[str, str]) -> Any:
    where = _where(prefix, file, sources)
    if not isinstance(data, dict):
        raise InvalidConfigError(f"{prefix or 'top level'} in {where}: expected a mapping")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        key = f"{prefix}{unknown[0]}"
        raise InvalidConfigError(
            f"unknown key {key!r} in {_where(key, file, sources)}; "
            f"known keys{' of ' + prefix.rstrip('.') if prefix else ''}: {', '.join(sorted(names))}"
        )
    kwargs = {}
    for name in names & set(data):
        key = f"{prefix}{name}"
        kwargs[name] = _convert(hints[name], data[name], key, file, sources)
        _check(key, kwargs[name], _where(key, file, sources))
    try:
        return cls(**kwargs)
    except TypeError as e:
        missing = re.findall(r"'(\w+)'", str(e))
        key = f"{prefix}{missing[0]}" if missing else prefix.rstrip(".")
        raise InvalidConfigError(f"missing key {key!r} in {where}") from None


def _convert(tp: Any, value: Any, key: str, file: str, sources: dict[str, str]) -> Any:
    where = _where(key, file, sources)
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, key, file, sources)
    if value is None:
        raise InvalidConfigError(f"{key} in {where}: a value is required, got null")
    if origin is Literal:
        if value not in args:
            raise InvalidConfigError(
                f"{key} in {where}: {value!r} is not one of {', '.join(map(str, args))}"
            )
        return value
    if origin is dict:
        if not isinstance(value, dict):
            raise InvalidConfigError(f"{key} in {where}: expected a mapping, got {value!r}")
        vt = args[1]
        return {str(k): _convert(vt, v, f"{key}.{k}", file, sources) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        return _build(tp, value, f"{key}.", file, sources)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise InvalidConfigError(f"{key} in {where}: expected true or false, got {value!r}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            if value < 0:
                raise InvalidConfigError(f"{key} in {where}: must be >= 0, got {value}")
            return value
        raise InvalidConfigError(f"{key} in {where}: expected an integer, got {value!r}")
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
            return float(value)
        raise InvalidConfigError(f"{key} in {where}: expected a positive number, got {value!r}")
    if tp is str:
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            return str(value)
        raise InvalidConfigError(f"{key} in {where}: expected a string, got {value!r}")
    raise InvalidConfigError(f"{key} in {where}: unsupported type {tp}")  # pragma: no cover


def _where(key: str, file: str, sources: dict[str, str]) -> str:
    key = key.rstrip(".")
    for k, src in sources.items():
        if k == key or k.startswith(key + ".") or key.startswith(k + "."):
            return src
    return file
