"""The pipeline job: one streaming query carries each micro-batch from Kafka through bronze,
silver and gold, instead of three queries each waiting for the previous one's commits.

Each table is still written exactly once per batch, each commit recording the batch (this
query's id, the batch id; a MERGE also under its own Delta transaction ids), so a batch re-run
after a crash skips every write that committed and does the others, in any order. Gold goes
first, since a gold row is what users wait for, and the writes of independent tables run side by
side (`IdempotentSink.in_parallel`), each MERGE in a session of its own. Per micro-batch:
1. silver parses and validates the Kafka records once, and finds the valid events that the
   events table does not hold yet (as the silver job does with the raw table's new rows);
2. gold: those events are windowed and added to the gold tables (as the gold job does with the
   events table's new rows), its tables side by side;
3. once gold committed, side by side: silver events (those same events appended to the events
   table), bronze (the Kafka records appended to the raw table, as the bronze job does) and the
   quarantine (the batch's invalid records).
The state table (a MERGE of each order's newest version, the batch's costliest write) is not on
that path: a second query of the same application MERGEs the events table's new rows into it
every `pipeline.state_trigger_interval` (`silver.UpsertState`), with its own checkpoint (the
silver job's state query's: one position whichever job runs the root) and its
commits recording what of the events table it consumed, so the state table trails the events
table by up to that interval. A run with `--once` runs it to the end after the pipeline query.
The new events are found before any of the batch's writes and the events table changes only by
the events append, so a re-run of the batch finds the same events until it has stored them, and
by then its gold writes committed (a re-run skips them).
A write that fails stops the batch: the writes running beside it end, nothing after it is
written, nor is the batch committed to the checkpoint, so ingestion stops with it (bronze
included: a batch is landed in bronze only once gold has it) and the restarted query runs the
same batch again, skipping the writes that committed. A record that silver cannot write is
quarantined, not failed: only a failure of the storage or the job stops ingestion.

The per-layer jobs stay for spark-submit and for streams that want them apart; one storage root
is run either by the pipeline or by the three jobs (their checkpoints differ, but for the state
query's, which both run).
"""

from __future__ import annotations

from dataclasses import replace
from functools import partial

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from pipelines.config import LakehouseConf
from pipelines.kafka import kafka_failure
from pipelines.layers import bronze, gold, silver
from pipelines.streaming import checkpoints
from pipelines.streaming.delta import recover_checkpoint
from pipelines.streaming.query import run_query
from pipelines.streaming.sink import IdempotentSink
from pipelines.streaming.spark import FACTORY_MODE, INTERPRETED, session_confs
from pipelines.streaming.storage import Files

# Up to this many offsets a batch's writes run interpreted projections (measured: faster up to
# 60,000), and its parse up to PARSE_INTERPRETED (the parse alone, warm, on 2 cores, best of 5:
# 5,000 records 0.83 s compiled and 0.52 s interpreted, 20,000 0.79 s either way, 60,000 1.11 s
# compiled and 1.43 s interpreted).
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
            conf,
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
