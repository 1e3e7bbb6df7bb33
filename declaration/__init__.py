"""A table's declaration, one typed value: what a layer package says of each table it owns.

A table module declares its table as `TABLE = Declaration(...)`, and any other table it owns under
a name of its own (`GAPS` in `bronze/raw_records.py`); a stream's enrich module declares its
dimension tables as `DIMENSIONS`, role -> Declaration. The configuration gives each table its name
(`silver/orders`), from which its path follows; `pipelines.streaming.tables.declared` reads the
declaration and refuses, naming the module, anything that is not one. Pure, like the layer
packages that import it: it imports nothing of theirs nor of `pipelines`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from pyspark.sql import DataFrame

_COLUMN_TUPLES = ("partitioned_by", "cluster_by", "zorder_by")


@dataclass(frozen=True, kw_only=True)
class Declaration:
    """One table as its module declares it; every field by keyword, a misspelt one an error at
    import. Column lists may be given as any sequence of names; they are kept as tuples."""

    # What it holds: Spark DDL, the one notation, `NOT NULL` where a value is required.
    schema: str

    # Its layout: the partition columns, and the layout maintenance keeps: `cluster_by` (liquid
    # clustering, for an unpartitioned table: Delta refuses both) or `zorder_by` (within the
    # partitions of a partitioned one).
    partitioned_by: tuple[str, ...] = ()
    cluster_by: tuple[str, ...] = ()
    zorder_by: tuple[str, ...] = ()

    # Its Delta table properties, e.g. {"delta.appendOnly": "true"}.
    properties: Mapping[str, str] = field(default_factory=dict)

    # Its checks: Great Expectations 1.x expectation names with their arguments (a `quality.*`
    # name as an argument: that setting's value), and `prepare`, the derived columns they read
    # (added to the rows checked, never to the rows written).
    expectations: tuple[tuple[str, Mapping[str, object]], ...] = ()
    prepare: Callable[[DataFrame], DataFrame] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.schema, str):
            raise TypeError(f"Declaration schema: Spark DDL text, not {self.schema!r}")
        for name in _COLUMN_TUPLES:
            columns = getattr(self, name)
            if isinstance(columns, str):  # ("a") is the string "a", not a tuple: ("a",)
                raise TypeError(
                    f"Declaration {name}={columns!r}: a sequence of column names, not one string "
                    f"(one column: ({columns!r},))"
                )
            object.__setattr__(self, name, tuple(columns))
        object.__setattr__(self, "expectations", tuple(self.expectations))
