"""The gold job: windowed aggregates of silver/order_events, joined with the dimensions.

Per micro-batch of new events (a stream over the insert-only `silver/order_events`):
- events older than the allowed lateness behind the newest event time already processed go to
  `gold/late_events` with their reason, and stay out of the windows;
- the others are joined with the dimension tables as they are now (read per batch, so an update
  is seen by the next batch) and aggregated per window and group;
- the batch's partial aggregates are MERGEd into the gold tables, adding to the window rows:
  a window row is current as soon as its batch commits. Additions are not idempotent by nature,
  so every write is tagged with Delta's transaction ids (app id per table, batch id): a replayed
  batch adds nothing twice.
The tables are the state: there is no Spark watermark to drop late events silently.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from delta.tables import DeltaTable
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from gold import orders_by_country_5m as by_country
from gold import revenue_by_category_1m as by_category
from gold.dimensions import with_dimensions
from gold.late_events import late_events, on_time_events
from pipelines.config import LakehouseConf
from pipelines.errors import JobFailedError
from pipelines.layers.silver import silver_tables
from pipelines.streaming import checkpoints
from pipelines.streaming.delta import idempotent_txn, retry_on_conflict, start_delta_to_batches
from pipelines.streaming.query import (
    first_line,
    progress_table_for,
    refuse_new_batch_when_stopping,
    run_query,
)

PRODUCTS_SCHEMA = "product_id string, name string, category string, list_price decimal(12,2)"
CUSTOMERS_SCHEMA = "customer_id string, name string, country string, segment string"
REVENUE_SCHEMA = (
    "window_start timestamp, window_end timestamp, category string, currency string, "
    "paid_orders bigint, units bigint, revenue decimal(18,2)"
)
COUNTRY_SCHEMA = (
    "window_start timestamp, window_end timestamp, country string, created_orders bigint, "
    "order_value decimal(18,2)"
)
LATE_SCHEMA = (
    "event_id string, order_id string, event_type string, event_time timestamp, "
    "newest_event_time timestamp, reason string"
)
PROGRESS_SCHEMA = "query_id string, batch_id bigint, newest_event_time timestamp"


class GoldFailedError(JobFailedError):
    """The gold query stopped with an error; the message names the tables and the cause."""


@dataclass(frozen=True)
class GoldTables:
    events: str
    products: str
    customers: str
    revenue: str
    countries: str
    late: str
    progress: str
    checkpoint: str


def gold_tables(conf: LakehouseConf) -> GoldTables:
    return GoldTables(
        events=silver_tables(conf, conf.stream("orders")).events,
        products=conf.table_path("dimensions/products"),
        customers=conf.table_path("dimensions/customers"),
        revenue=conf.table_path("gold/revenue_by_category_1m"),
        countries=conf.table_path("gold/orders_by_country_5m"),
        late=conf.table_path("gold/late_events"),
        progress=conf.table_path("gold/_progress"),
        checkpoint=conf.checkpoint_path("gold/orders"),
    )


def seed_dimensions(spark: SparkSession, conf: LakehouseConf) -> dict[str, int]:
    """Load `products` and `customers` from the seed files into their Delta tables (replacing)."""
    tables = gold_tables(conf)
    counts = {}
    for name, schema, path in (("products", PRODUCTS_SCHEMA, tables.products),
                               ("customers", CUSTOMERS_SCHEMA, tables.customers)):  # fmt: skip
        file = conf.seed_dir / f"{name}.csv"
        if not file.is_file():
            raise GoldFailedError(f"seed file {file} is missing (gold.seed_dir in {conf.source})")
        df = (
            spark.read.option("header", True)
            .option("mode", "FAILFAST")
            .schema(schema)
            .csv(str(file))
        )
        df.write.format("delta").mode("overwrite").save(path)
        counts[name] = spark.read.format("delta").load(path).count()
    return counts


def _create(spark: SparkSession, path: str, schema: str, **properties: str) -> None:
    builder = DeltaTable.createIfNotExists(spark).location(path)
    builder = builder.addColumns(spark.createDataFrame([], schema).schema)
    for key, value in properties.items():
        builder = builder.property(key, value)
    builder.execute()


def ensure_gold_tables(spark: SparkSession, tables: GoldTables) -> None:
    _create(spark, tables.revenue, REVENUE_SCHEMA)
    _create(spark, tables.countries, COUNTRY_SCHEMA)
    _create(spark, tables.late, LATE_SCHEMA, **{"delta.appendOnly": "true"})
    _create(spark, tables.progress, PROGRESS_SCHEMA, **{"delta.appendOnly": "true"})


def _add_condition(keys: list[str], lo: datetime, hi: datetime) -> F.Column:
    condition = F.col("t.window_start").between(F.lit(lo), F.lit(hi))
    for k in keys:
        condition = condition & (F.col(f"t.{k}") == F.col(f"s.{k}"))
    return condition


class UpsertGold:
    """foreachBatch sink of the gold job; see the module docstring."""

    def __init__(self, conf: LakehouseConf, tables: GoldTables) -> None:
        self.tables = tables
        self.conf = conf
        self.lateness_s = conf.gold.allowed_lateness_minutes * 60
        self._query_id: str | None = None

    def query_id(self) -> str:
        if self._query_id is None:
            self._query_id = checkpoints.query_id(self.tables.checkpoint)
            if self._query_id is None:
                raise GoldFailedError(f"no query id in checkpoint {self.tables.checkpoint}")
        return self._query_id

    def newest_before(self, spark: SparkSession, batch_id: int) -> datetime | None:
        """Newest event time processed by earlier batches (a replay sees the same value)."""
        rows = spark.read.format("delta").load(self.tables.progress)
        earlier = rows.where(
            ~((F.col("query_id") == self.query_id()) & (F.col("batch_id") >= batch_id))
        )
        return earlier.agg(F.max("newest_event_time")).first()[0]

    def __call__(self, batch: DataFrame, batch_id: int) -> None:
        refuse_new_batch_when_stopping(batch_id)
        spark = batch.sparkSession
        events = batch.persist()
        enriched = None
        try:
            newest = self.newest_before(spark, batch_id)
            stats = events.agg(F.max("event_time"), F.min("event_time")).first()
            if stats[0] is None:
                return
            self._append(
                late_events(events, newest, self.lateness_s), self.tables.late, "late", batch_id
            )
            on_time = on_time_events(events, newest, self.lateness_s)
            products = spark.read.format("delta").load(self.tables.products)
            customers = spark.read.format("delta").load(self.tables.customers)
            enriched = with_dimensions(on_time, products, customers).persist()
            # windows an on-time event can touch start at most 5 minutes before it
            lo = stats[1].replace(second=0, microsecond=0) - timedelta(minutes=5)
            hi = stats[0]
            revenue = enriched.transform(by_category.revenue_by_category_1m)
            countries = enriched.transform(by_country.orders_by_country_5m)
            if self.conf.gold.check_quality_per_batch:
                from pipelines.layers.quality import check_frames

                # a batch that fails a `fail` suite is not written: the query stops on it
                check_frames(spark, self.conf, {
                    "gold/revenue_by_category_1m": (revenue, None),
                    "gold/orders_by_country_5m": (countries, None),
                }, scope=f"batch {batch_id}")  # fmt: skip
            self._add(spark, revenue, self.tables.revenue, by_category.KEY_COLUMNS,
                      by_category.VALUE_COLUMNS, "revenue", batch_id, lo, hi)  # fmt: skip
            self._add(spark, countries, self.tables.countries, by_country.KEY_COLUMNS,
                      by_country.VALUE_COLUMNS, "countries", batch_id, lo, hi)  # fmt: skip
            newest_after = max(x for x in (newest, stats[0]) if x is not None)
            progress = spark.createDataFrame(
                [(self.query_id(), batch_id, newest_after)], PROGRESS_SCHEMA
            )
            self._append(progress, self.tables.progress, "progress", batch_id)
        finally:
            if enriched is not None:
                enriched.unpersist()
            events.unpersist()

    def _append(self, df: DataFrame, path: str, name: str, batch_id: int) -> None:
        retry_on_conflict(
            lambda: df.write.format("delta").mode("append")
            .option("txnAppId", f"gold:{name}:{self.query_id()}")
            .option("txnVersion", batch_id)
            .save(path),
            what=f"gold/{name}",
        )  # fmt: skip

    def _add(self, spark, partial: DataFrame, path: str, keys: list[str], values: list[str],
             name: str, batch_id: int, lo: datetime, hi: datetime) -> None:  # fmt: skip
        def merge() -> None:
            with idempotent_txn(spark, f"gold:{name}:{self.query_id()}", batch_id):
                (
                    DeltaTable.forPath(spark, path).alias("t")
                    .merge(partial.alias("s"), _add_condition(keys, lo, hi))
                    .whenMatchedUpdate(set={v: F.col(f"t.{v}") + F.col(f"s.{v}") for v in values})
                    .whenNotMatchedInsertAll()
                    .execute()
                )  # fmt: skip

        retry_on_conflict(merge, what=f"gold/{name}")


def start_gold(spark: SparkSession, conf: LakehouseConf, *, once: bool = False) -> StreamingQuery:
    tables = gold_tables(conf)
    for path, what in ((tables.events, "silver/order_events: run `lakehouse run silver` first"),
                       (tables.products, "dimensions/products: run `lakehouse seed` first"),
                       (tables.customers, "dimensions/customers: run `lakehouse seed` first")):  # fmt: skip
        if not DeltaTable.isDeltaTable(spark, path):
            raise GoldFailedError(f"{path} does not exist yet ({what})")
    ensure_gold_tables(spark, tables)
    return start_delta_to_batches(
        spark,
        tables.events,
        UpsertGold(conf, tables),
        name="gold_orders",
        checkpoint=tables.checkpoint,
        max_files_per_trigger=conf.gold.max_files_per_trigger,
        once=once,
        trigger_interval=conf.gold.trigger_interval,
    )


def run_gold(spark: SparkSession, conf: LakehouseConf, *, once: bool = False,
             progress: bool = True) -> StreamingQuery:  # fmt: skip
    tables = gold_tables(conf)

    def explain(e: StreamingQueryException) -> Exception:
        return GoldFailedError(f"gold from {tables.events} failed: {first_line(str(e))}")

    return run_query(lambda: start_gold(spark, conf, once=once), name="gold",
                     progress=progress, explain=explain, progress_table=progress_table_for(spark, conf))  # fmt: skip
