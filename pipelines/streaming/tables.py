"""Tables declared once and created by one function, their changes applied or refused, never ignored.

A table is declared next to the layer that owns it, by one typed value in the module named after
it: `TABLE = Declaration(schema=..., ...)` (`declaration.Declaration`; Spark DDL, `NOT NULL` where
a value is required). `ensure_table` creates a missing table; on an existing one it applies what
Delta allows (a new nullable column, property or clustering columns) and refuses anything else
with a readable difference. The fields: ARCHITECTURE.md, "One sink, one way to declare a table".
"""

from __future__ import annotations

import importlib
import json
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, cast

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import StructType

from declaration import Declaration
from pipelines.errors import ConfigError, JobFailedError
from pipelines.streaming.delta import retry_on_conflict, snapshot
from pipelines.streaming.storage import Files

CLUSTERING_DOMAIN = "delta.clustering"  # where Delta keeps a table's liquid clustering columns
_MISSING = object()  # what `declared` finds in a module that has no such name


class TableChangeRefusedError(ConfigError):
    """A declaration changed in a way Delta cannot apply to the existing table."""


@dataclass(frozen=True)
class Table:
    """One declared table: its configured name, schema and layout, and its expectations."""

    name: str  # as configured, e.g. "silver/orders"
    schema: str  # Spark DDL
    partitioned_by: tuple[str, ...] = ()
    properties: Mapping[str, str] = field(default_factory=dict)
    expectations: tuple[tuple[str, Mapping[str, object]], ...] = ()
    prepare: Callable[[DataFrame], DataFrame] | None = None  # derived columns the checks read
    cluster_by: tuple[str, ...] = ()  # liquid clustering: OPTIMIZE clusters the rows by these
    zorder_by: tuple[str, ...] = ()  # OPTIMIZE ZORDER BY these, within each partition

    def __post_init__(self) -> None:
        where = f"table {self.name}"
        if self.cluster_by and (self.partitioned_by or self.zorder_by):
            raise ConfigError(
                f"{where}: cluster_by (liquid clustering) goes with neither partitioned_by nor "
                "zorder_by; Delta refuses both on one table"
            )
        if both := set(self.zorder_by) & set(self.partitioned_by):
            raise ConfigError(f"{where}: zorder_by {sorted(both)}: a partition column already")

    @property
    def catalog_name(self) -> str:
        """The name a catalog knows it by: `silver/orders` -> `silver.orders`."""
        return self.name.replace("/", ".")


def declared(module: ModuleType | str, name: str, attr: str = "TABLE") -> Table:
    """The table `name` as `module` declares it: the `Declaration` it names `attr`."""
    m = importlib.import_module(module) if isinstance(module, str) else module
    return _table(name, getattr(m, attr, _MISSING), f"{m.__name__}.{attr}")


def declared_dimension(module: ModuleType | str, name: str, role: str) -> Table:
    """The dimension table `name` of role `role` as the enrich `module` declares it:
    `DIMENSIONS[role]`, its `Declaration`."""
    m = importlib.import_module(module) if isinstance(module, str) else module
    where, found = f"{m.__name__}.DIMENSIONS", getattr(m, "DIMENSIONS", _MISSING)
    if not isinstance(found, Mapping):
        raise ConfigError(
            f"{where} (for table {name}): expected a dict of role -> Declaration, found "
            f"{_kind(found)}"
        )
    if role not in found:
        raise ConfigError(
            f"{where} declares no dimension {role!r} (for table {name}); it declares "
            f"{', '.join(map(repr, found)) or 'none'}"
        )
    return _table(name, found[role], f"{where}[{role!r}]")


def _table(name: str, found: object, where: str) -> Table:
    """The table `name` from `found`, what `where` holds, which must be a `Declaration`."""
    if not isinstance(found, Declaration):
        raise ConfigError(
            f"{where} (for table {name}): expected a Declaration, found {_kind(found)}"
        )
    return Table(
        name=name,
        schema=found.schema,
        partitioned_by=found.partitioned_by,
        cluster_by=found.cluster_by,
        zorder_by=found.zorder_by,
        properties=dict(found.properties),
        expectations=found.expectations,
        prepare=found.prepare,
    )


def _kind(found: object) -> str:
    """What `found` is, for a message: `no such name`, `None`, `a dict`..."""
    if found is _MISSING:
        return "no such name in the module"
    return "None" if found is None else f"a {type(found).__name__}"


def require_tables(spark: SparkSession, needed: Mapping[str, str]) -> None:
    """Refuse to start while a table a job reads is missing; `needed`: path -> how to create it."""
    for path, how in needed.items():
        if not DeltaTable.isDeltaTable(spark, path):
            raise JobFailedError(f"table {path} does not exist yet: {how}")


def ensure_table(spark: SparkSession, path: str, table: Table) -> str:
    """Create the table at `path` if missing, else bring it to its declaration; returns `path`."""
    wanted = cast(StructType, StructType.fromDDL(table.schema))  # a table's schema: a struct
    current = _current(spark, path)
    if current is None:
        builder = DeltaTable.createIfNotExists(spark).location(path).addColumns(wanted)
        if table.partitioned_by:
            builder = builder.partitionedBy(*table.partitioned_by)
        if table.cluster_by:
            builder = builder.clusterBy(*table.cluster_by)
        for key, value in table.properties.items():
            builder = builder.property(key, value)
        _clear_killed_creation(spark, path)
        # several jobs starting at once may all create it: the losers retry and find it there
        retry_on_conflict(builder.execute, what=table.name)
        return path
    have, partitioned_by, properties = current
    problems, new_columns = _differences(have, wanted)
    if partitioned_by != table.partitioned_by:
        problems.append(
            f"partitioned by {list(partitioned_by)}, declared {list(table.partitioned_by)}"
        )
    if problems:
        raise TableChangeRefusedError(
            f"table {table.name} ({path}) differs from its declaration in ways Delta cannot "
            "apply in place:\n  " + "\n  ".join(problems) + "\nMigrate it on purpose (e.g. "
            "rewrite it with the new schema) or restore the declaration."
        )
    if new_columns:
        columns = ", ".join(f"`{f.name}` {f.dataType.simpleString()}" for f in new_columns)
        spark.sql(f"ALTER TABLE delta.`{path}` ADD COLUMNS ({columns})")
    changed = {k: v for k, v in table.properties.items() if properties.get(k) != v}
    if changed:
        pairs = ", ".join(f"'{k}' = '{v}'" for k, v in changed.items())
        alter = f"ALTER TABLE delta.`{path}` SET TBLPROPERTIES ({pairs})"
        retry_on_conflict(lambda: spark.sql(alter), what=table.name)  # idempotent: retried
    if table.cluster_by and clustering_columns(spark, path) != table.cluster_by:
        # rows written before stay where they are until maintenance's next OPTIMIZE clusters them
        cluster = f"ALTER TABLE delta.`{path}` CLUSTER BY ({', '.join(table.cluster_by)})"
        retry_on_conflict(lambda: spark.sql(cluster), what=table.name)  # idempotent: retried
    return path


def ensure_tables(spark: SparkSession, tables: Mapping[str, Table]) -> None:
    """`ensure_table` for each path -> declaration, side by side: a creation waits on its
    commit and the log's files more than it computes (a job's first start: ~1 s a table)."""
    with ThreadPoolExecutor(min(len(tables), 4) or 1) as pool:
        for _ in pool.map(lambda item: ensure_table(spark, *item), tables.items()):
            pass  # the first failure is raised here, once every creation has ended


def clustering_columns(spark: SparkSession, path: str) -> tuple[str, ...]:
    """The liquid clustering columns of the Delta table at `path` (none: not clustered), from
    its clustering domain: in the version's checksum when it lists the table's domains (no
    Spark job), else from the snapshot's computed state, as Delta 4.4 reads a domain: a state
    rebuild, a cost at every job start (bench/RESULTS.md, "Figures behind code choices")."""
    current = snapshot(spark, path)
    checksum = current.checksumOpt()
    domains = checksum.get().domainMetadata() if checksum.isDefined() else None
    if domains is not None and domains.isDefined():
        listed = domains.get()
        for d in (listed.apply(i) for i in range(listed.size())):
            if d.domain() == CLUSTERING_DOMAIN and not d.removed():
                columns = json.loads(d.configuration())["clusteringColumns"]
                return tuple(".".join(parts) for parts in columns)
        return ()
    utils = cast(Any, spark._jvm).org.apache.spark.sql.delta.skipping.clustering.ClusteredTableUtils
    found = utils.getClusteringColumnsOptional(current)
    if not found.isDefined():
        return ()
    columns = found.get()
    return tuple(columns.apply(i).physicalName().mkString(".") for i in range(columns.size()))


def constraints(spark: SparkSession, path: str) -> tuple[list[str], dict[str, str]]:
    """The NOT NULL columns and the CHECK constraints (name -> SQL expression) of the Delta table
    at `path`, read from its log's metadata: no Spark job."""
    schema, _, properties = _current(spark, path)
    prefix = "delta.constraints."
    checks = {k.removeprefix(prefix): v for k, v in properties.items() if k.startswith(prefix)}
    return [f.name for f in schema.fields if not f.nullable], checks


def _clear_killed_creation(spark: SparkSession, path: str) -> None:
    """Remove what a creation killed before its first commit left: a `_delta_log` folder with no
    file in it (Delta makes it, and `_staged_commits` in it, first). Delta takes such a folder for
    an existing table and refuses to create one there, so the job could never start again."""
    files, log = Files(spark), f"{path}/_delta_log"
    names = files.names(log)
    if names and set(names) <= {"_staged_commits"} and not files.names(f"{log}/_staged_commits"):
        log_warning = f"table {path}: its creation was killed before the first commit; creating it"
        logging.getLogger("lakehouse.tables").warning(log_warning)
        files.delete(log, recursive=True)


def _current(spark: SparkSession, path: str) -> tuple[StructType, tuple, dict] | None:
    """Schema, partition columns and properties of the Delta table at `path`, None if there is
    none; read from the log's metadata, which costs no Spark job (DESCRIBE DETAIL costs seconds)."""
    found = snapshot(spark, path)
    if found.version() < 0:
        return None
    meta, java = found.metadata(), cast(Any, spark._jvm).scala.jdk.javaapi.CollectionConverters
    return (
        StructType.fromJson(json.loads(meta.schemaString())),
        tuple(java.asJava(meta.partitionColumns())),
        dict(java.asJava(meta.configuration())),
    )


def _differences(have: StructType, wanted: StructType) -> tuple[list[str], list]:
    """What cannot be applied, and the new nullable columns that can."""
    problems, new = [], []
    existing = {f.name: f for f in have.fields}
    for f in wanted.fields:
        old = existing.pop(f.name, None)
        if old is None and f.nullable:
            new.append(f)
        elif old is None:
            problems.append(f"new column {f.name} is NOT NULL (only nullable ones are added)")
        elif old.dataType != f.dataType:
            problems.append(
                f"column {f.name} is {old.dataType.simpleString()}, declared {f.dataType.simpleString()}"
            )
        elif old.nullable != f.nullable:
            problems.append(
                f"column {f.name} is {'' if old.nullable else 'NOT '}NULL, declared "
                f"{'' if f.nullable else 'NOT '}NULL"
            )
    problems += [f"column {name} is not declared any more" for name in existing]
    return problems, new
