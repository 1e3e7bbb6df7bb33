"""The pipeline job: one streaming query carries each micro-batch from Kafka through bronze,
silver and gold (gold first, then silver's events, bronze and the quarantine side by side), each
table written once per batch; a second query keeps the state table. How it is kept exact:
docs/guarantees.md, "The whole pipeline in one query".
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.config import LakehouseConf
from pipelines.kafka import kafka_failure
from pipelines.layers import bronze, gold, progress_table, silver
from pipelines.streaming import checkpoints
from pipelines.streaming.delta import recover_checkpoint
from pipelines.streaming.query import run_query
from pipelines.streaming.sink import IdempotentSink
from pipelines.streaming.spark import FACTORY_MODE, INTERPRETED, session_confs
from pipelines.streaming.storage import Files

# Up to this many offsets a batch's writes run interpreted projections, and its parse up to
# PARSE_INTERPRETED: faster there (bench/RESULTS.md, "Figures behind code choices").
SMALL_BATCH = 60_000
PARSE_INTERPRETED = 20_000


class Pipeline(IdempotentSink):
    """foreachBatch sink that runs the bronze, silver and gold sinks on one micro-batch."""

    def __init__(self, conf: LakehouseConf, stream_name: str) -> None:
        stream = conf.stream(stream_name)
        super().__init__(conf.checkpoint_path(f"pipeline/{stream_name}"))
        ck = self.checkpoint
        self.bronze = bronze.bronze_sink(
            conf, stream, replace(bronze.bronze_tables(conf, stream), checkpoint=ck)
        )
        silver_tables = silver.silver_tables(conf, stream)
        self.silver = silver.UpsertSilver(replace(silver_tables, checkpoint=ck))
        # the state table follows the events table in a query of its own (`start_state`)
        self.state = silver.state_sink(silver_tables)
        self.gold = (
            gold.gold_sink(conf, replace(gold.gold_tables(conf, stream_name), checkpoint=ck))
            if stream.gold_tables
            else None
        )
        self.topic = stream.topic
        self.layers = [s for s in (self.bronze, self.silver, self.gold) if s is not None]
        for layer in self.layers:  # one checkpoint, one cache, one timing per batch
            layer.share(self.context)

    def write_batch(self, batch: DataFrame, batch_id: int) -> None:
        # a small batch runs interpreted projections (`INTERPRETED`), unless the session sets
        # the mode itself; the state query (its own session) stays compiled
        offsets = checkpoints.batch_offsets_read(
            Files(self.spark), self.checkpoint, batch_id, self.topic
        )
        chosen = offsets is None or self.spark.conf.get(FACTORY_MODE, None) is not None

        def interpreted_up_to(limit: int) -> dict[str, str]:
            return INTERPRETED if not chosen and offsets <= limit else {}

        with session_confs(self.spark, interpreted_up_to(PARSE_INTERPRETED)):
            parsed = self.silver.parse(batch)  # parsed and cached here, at once
        with session_confs(self.spark, interpreted_up_to(SMALL_BATCH)):
            new = self.silver.new_events(parsed)
            if self.gold is not None and new is not None:
                self.gold.write_batch(new, batch_id)  # its tables side by side
            self.in_parallel(
                partial(self.silver.write_events, new, batch_id),
                partial(self.bronze.write_batch, batch, batch_id),
                partial(self.silver.write_quarantine, parsed, batch_id),
            )

    def written(self) -> list[str]:
        """Every table the pipeline writes: a lost checkpoint is rebuilt from their records."""
        b, s = self.bronze.tables, self.silver.tables
        tables = [b.raw, s.events, s.quarantine]
        if self.gold is not None:
            g = self.gold.tables
            tables += [*g.aggregates.values(), g.late, g.high_water]
        return tables


def start_pipeline(
    spark: SparkSession,
    conf: LakehouseConf,
    stream_name: str = "orders",
    sink: Pipeline | None = None,
    *,
    once: bool = False,
) -> StreamingQuery:
    """Start the one query of a stream's whole pipeline, reading Kafka."""
    sink = sink or Pipeline(conf, stream_name)
    silver.ensure_silver_tables(spark, conf, sink.silver.tables)
    if sink.gold is not None:
        gold.require_dimensions(spark, sink.gold.tables)
        gold.ensure_gold_tables(spark, conf, sink.gold.tables)
    topic = sink.topic
    recover_checkpoint(spark, sink.checkpoint, sink.written(), "pipeline", lambda o: topic in o)
    return bronze.start_bronze(
        spark,
        conf,
        stream_name,
        sink,
        once=once,
        checkpoint=sink.checkpoint,
        name=f"pipeline_{stream_name}",
        trigger_interval=conf.pipeline.trigger_interval,
        max_offsets=conf.pipeline.max_offsets_per_trigger,
    )


def run_pipeline(
    spark: SparkSession,
    conf: LakehouseConf,
    stream_name: str = "orders",
    *,
    once: bool = False,
    progress: bool = True,
) -> StreamingQuery:
    """Run the pipeline until done (`once`) or until SIGINT/SIGTERM, with the query that MERGEs
    the events table's new rows into the state table beside it (continuous) or after it (`once`:
    the state table then holds every event the run stored)."""
    sink = Pipeline(conf, stream_name)
    stream = conf.stream(stream_name)
    return silver.run_with_state(
        spark,
        conf,
        sink.state,
        lambda companion: run_query(
            spark,
            progress_table(spark, conf),
            lambda: start_pipeline(spark, conf, stream_name, sink, once=once),
            sink,
            name="pipeline",
            what=f"pipeline of topic {stream.topic!r} from {conf.kafka.bootstrap_servers}",
            progress=progress,
            explain=lambda e: kafka_failure(e, conf, f"pipeline of topic {stream.topic!r}"),
            companion=companion,
        ),
        name="pipeline",
        trigger_interval=conf.pipeline.state_trigger_interval,
        once=once,
        progress=progress,
    )
