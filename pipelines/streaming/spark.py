"""What the layers do with a session: small driver-side frames, and settings for a block."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import cast

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType


def local_frame(spark: SparkSession, rows: list, schema: str) -> DataFrame:
    """A DataFrame of a few driver-side rows (dicts by column name, or tuples in the schema's
    order), handed to the JVM as Arrow: `createDataFrame` of Python rows starts Python workers
    to read them back (a second and more in a new driver, CPU in every job after)."""
    struct = cast(StructType, StructType.fromDDL(schema))  # a row's schema: a struct
    arrow = to_arrow_schema(struct, timezone="UTC")
    names = struct.fieldNames()
    rows = [
        {
            k: _aware(v)
            for k, v in (row.items() if isinstance(row, dict) else zip(names, row, strict=True))
        }
        for row in rows
    ]
    return spark.createDataFrame(pa.Table.from_pylist(rows, schema=arrow), struct)


def _aware(value):
    """A naive datetime is local time, as pyspark reads and writes them."""
    return value.astimezone() if isinstance(value, datetime) and value.tzinfo is None else value


# Spark generates and compiles Java for each projection outside whole-stage code generation, per
# task: a fixed cost that dominates small jobs (Delta's log replay, a MERGE of a few rows) and
# that interpreted projections skip, at a cost per row: a small pipeline batch's writes run
# faster interpreted, the state MERGE and a large append slower
# (bench/RESULTS.md, "Figures behind code choices").
FACTORY_MODE = "spark.sql.codegen.factoryMode"  # an internal Spark setting, tested both ways
INTERPRETED = {FACTORY_MODE: "NO_CODEGEN"}
COMPILED = {FACTORY_MODE: "FALLBACK"}  # Spark's default


@contextmanager
def session_confs(spark: SparkSession, confs: dict[str, str]) -> Iterator[None]:
    """Set `confs` on the session inside the block, and put back what was there after it."""
    before = {k: spark.conf.get(k, None) for k in confs}
    for key, value in confs.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, old in before.items():
            if old is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, old)
