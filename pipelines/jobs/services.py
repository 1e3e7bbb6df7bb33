"""A layer job's metrics and lineage, resolved from the configuration: the tables, topics,
datasets, port and endpoint they need, handed to `streaming.metrics` and `streaming.lineage`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import cache, partial

from openlineage.client import OpenLineageClient
from openlineage.client.transport.file import FileConfig, FileTransport
from openlineage.client.transport.http import HttpConfig, HttpTransport

from pipelines.config import LakehouseConf
from pipelines.kafka import StableOffsets, admin_client, stable_offsets
from pipelines.streaming import lineage, metrics

# One quick retry: a batch must not wait on a lineage endpoint that is down.
RETRY = {
    "total": 1,
    "connect": 1,
    "read": 1,
    "backoff_factor": 0.2,
    "status_forcelist": [500, 502, 503, 504],
    "allowed_methods": ["HEAD", "POST"],
}


def job_tables(conf: LakehouseConf, layer: str, stream: str) -> list[str]:
    """The tables a layer's job writes (its figures are the job's)."""
    s = conf.stream(stream)
    bronze = [s.bronze_table, s.gaps_table]
    silver = [t for t in (s.events_table, s.state_table, s.quarantine_table) if t]
    gold = [t for t in (*s.gold_tables, s.late_events_table, s.high_water_table) if t]
    layers = {"bronze": bronze, "silver": silver, "gold": gold, "publish": list(s.gold_tables)}
    return layers.get(layer, bronze + silver + gold)


def job_metrics(conf: LakehouseConf, tables: list[str], topics: list[str]) -> metrics.JobMetrics:
    """The metrics of a job that writes `tables` and reads `topics` (read_committed)."""
    paths = {name: conf.table_path(name) for name in tables}
    quality = conf.table_path(conf.tables.quality_results)
    figures = metrics.TableFigures(paths, quality, conf.delta_rs_options())
    return metrics.JobMetrics(figures, metrics.OpenTransactions(topics, open_transactions(conf)))


def open_transactions(conf: LakehouseConf) -> Callable[[str], list[StableOffsets]]:
    """A topic's partitions' stable offsets, by one admin client made at the first call."""
    admin = cache(partial(admin_client, conf))
    return lambda topic: stable_offsets(conf, topic, admin())


@contextmanager
def serve_metrics(conf: LakehouseConf, layer: str, stream: str) -> Iterator[None]:
    """Serve the job's metrics at its port (metrics.ports[<layer>-<stream>]) while in the block."""
    job, m = f"{layer}-{stream}", conf.metrics
    port = m.ports.get(job)
    if not m.enabled or port is None:
        if m.enabled:
            metrics.log.warning(
                "no metrics for job %s: no metrics.ports.%s in %s", job, job, conf.source
            )
        yield
        return
    s = conf.stream(stream)
    reads_kafka = layer in ("bronze", "pipeline") and s.isolation_level == "read_committed"
    served = job_metrics(conf, job_tables(conf, layer, stream), [s.topic] if reads_kafka else [])
    with metrics.serve(served, job, m.host, port):
        yield


def dataset(conf: LakehouseConf, table: str) -> tuple[str, str]:
    """A table's OpenLineage namespace and name, from where it lives."""
    path = conf.table_path(table)
    if path.startswith("s3a://"):
        bucket, _, key = path.removeprefix("s3a://").partition("/")
        return f"s3://{bucket}", key
    if "://" in path:
        scheme, _, rest = path.partition("://")
        authority, _, key = rest.partition("/")
        return f"{scheme}://{authority}", key
    return "file", path


def topic_dataset(conf: LakehouseConf, topic: str) -> tuple[str, str]:
    server = conf.kafka.bootstrap_servers.split(",")[0].strip()
    return f"kafka://{server}", topic


def job_datasets(
    conf: LakehouseConf, layer: str, stream: str
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """The datasets a layer's job reads and writes."""
    s = conf.stream(stream)
    kafka = [topic_dataset(conf, s.topic)]
    reads = {
        "bronze": kafka,
        "silver": [dataset(conf, s.bronze_table)],
        "gold": [dataset(conf, t) for t in (s.events_table, *s.dimensions.values()) if t],
        "pipeline": kafka + [dataset(conf, t) for t in s.dimensions.values()],
        "publish": [dataset(conf, t) for t in s.gold_tables],
    }[layer]
    if layer == "publish":  # the gold tables to their topics, and the versions published
        topics = [s.gold_topic(t) for t in s.gold_tables] + [s.published_versions_topic]
        return reads, [topic_dataset(conf, t) for t in topics]
    writes = [dataset(conf, t) for t in job_tables(conf, layer, stream)]
    return reads, writes


def lineage_client(conf: LakehouseConf) -> OpenLineageClient:
    """A client that sends to lineage.url, or appends to the lineage file."""
    c = conf.lineage
    if c.url:
        config = HttpConfig(url=c.url, endpoint=c.endpoint, timeout=2.0, retry=RETRY)
        return OpenLineageClient(transport=HttpTransport(config))
    conf.lineage_file.parent.mkdir(parents=True, exist_ok=True)
    file = FileConfig(log_file_path=str(conf.lineage_file), append=True)
    return OpenLineageClient(transport=FileTransport(file))


@contextmanager
def lineage_run(
    conf: LakehouseConf, layer: str, stream: str
) -> Iterator[lineage.JobLineage | None]:
    """The job's run in OpenLineage events while in the block, if lineage.enabled."""
    if not conf.lineage.enabled:
        yield None
        return
    client, (reads, writes) = lineage_client(conf), job_datasets(conf, layer, stream)
    job = lineage.JobLineage(client, conf.lineage.namespace, f"{layer}-{stream}", reads, writes)
    with lineage.job_run(job):
        yield job
