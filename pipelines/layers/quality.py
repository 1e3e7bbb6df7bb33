"""`lakehouse dq`: run the Great Expectations suites on the tables, record and publish the results.

Each run gets an id; every expectation's outcome goes to the Delta table `quality/results` (run id,
time, table, table version, suite, expectation, column, success, observed value, unexpected count)
and to Great Expectations' HTML Data Docs under `<storage root>/_quality/`. A failed suite whose
policy is `fail` raises QualityCheckFailedError with a summary naming each failed expectation.
"""

from __future__ import annotations

import json
import logging
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from delta.tables import DeltaTable
from pyspark.sql import DataFrame, SparkSession

from pipelines.config import InvalidConfigError, LakehouseConf
from pipelines.errors import QualityError
from pipelines.streaming.spark import local_frame
from pipelines.streaming.storage import Files
from pipelines.streaming.tables import Table, ensure_table

RESULTS_SCHEMA = (
    "run_id string, run_at timestamp, table string, table_version bigint, scope string, "
    "suite string, expectation string, column string, success boolean, observed_value string, "
    "unexpected_count bigint"
)
APPEND_ONLY = {"delta.appendOnly": "true"}
log = logging.getLogger("lakehouse.quality")  # a failed `warn` suite's failures: warnings


class QualityCheckFailedError(QualityError):
    """A suite with the `fail` policy did not pass; the message lists what failed."""


@dataclass(frozen=True)
class Suite:
    """The expectations of one table, built from its declaration."""

    name: str
    table: str
    expectations: list
    prepare: Callable[[DataFrame], DataFrame]


def suites(conf: LakehouseConf, tables: dict[str, Table]) -> list[Suite]:
    """A suite for each of `tables` (declarations by name) with expectations, as configured."""
    import great_expectations.expectations as gxe  # heavy: imported only when checks run

    settings = {"quality.known_share": 1.0 - conf.quality.unknown_share_max}

    def argument(value: object) -> object:
        """A tuple as the list GE wants; a `quality.*` name as the configured value."""
        if isinstance(value, tuple):
            return list(value)
        return settings.get(value, value) if isinstance(value, str) else value

    def expectation(kind: str, kwargs: dict) -> object:
        cls = getattr(gxe, "".join(w.capitalize() for w in kind.split("_")))
        return cls(**{k: argument(v) for k, v in kwargs.items()})

    return [
        Suite(
            t.name.replace("/", "_"),
            t.name,
            [expectation(k, a) for k, a in t.expectations],
            t.prepare or (lambda df: df),
        )
        for t in tables.values()
        if t.expectations
    ]


@dataclass(frozen=True)
class SuiteOutcome:
    suite: str
    table: str
    table_version: int | None
    success: bool
    failures: list[str]


@contextmanager
def _project(spark: SparkSession, conf: LakehouseConf) -> Iterator[Path]:
    """Great Expectations' file project: `<root>/_quality` on a local root; on object storage a
    local copy for the run, copied back after it (results and Data Docs), through Hadoop."""
    if not conf.remote:
        root = Path(conf.root) / "_quality"
        root.mkdir(parents=True, exist_ok=True)
        yield root
        return
    files, remote = Files(spark), f"{conf.root}/_quality"
    with tempfile.TemporaryDirectory(prefix="lakehouse-quality-") as work:
        local = Path(work) / "_quality"
        if not files.download(remote, local):
            local.mkdir()
        try:
            yield local
        finally:  # a failed suite's results and docs too
            files.upload(local, remote)


def _context(root: Path | None):
    """Great Expectations' file project at `root`; None: one in memory, with no Data Docs."""
    import great_expectations as gx

    logging.getLogger("great_expectations").setLevel(logging.ERROR)
    if root is None:
        context = gx.get_context(mode="ephemeral")
    else:
        context = gx.get_context(mode="file", project_root_dir=str(root))
    try:  # no progress bars per metric: the job prints its own summary
        from great_expectations.data_context.types.base import ProgressBarsConfig

        context.variables.progress_bars = ProgressBarsConfig(globally=False)
    except Exception:  # an older or newer layout of that setting: keep the bars
        pass
    return context


def _describe(result) -> tuple[str, str | None, str, int | None]:
    """Expectation, column(s), observed value as JSON and unexpected count of one result."""
    kwargs, found = result.expectation_config.kwargs, result.result
    column = kwargs.get("column") or ",".join(kwargs.get("column_list", ())) or None
    observed = json.dumps(found.get("observed_value"), default=str)
    return result.expectation_config.type, column, observed, found.get("unexpected_count")


def run_quality(
    spark: SparkSession,
    conf: LakehouseConf,
    declared: dict[str, Table],
    tables: list[str] | None = None,
) -> list[SuiteOutcome]:
    """Run the suites of the `declared` tables (of `tables`, or all whose table exists) on the
    tables as they are now."""
    known = [s.table for s in suites(conf, declared)]
    unknown = sorted(set(tables or ()) - set(known))
    if unknown:
        raise InvalidConfigError(
            f"no quality suite for {', '.join(unknown)}; suites exist for {', '.join(known)}"
        )
    frames = {}
    for table in tables or known:
        path = conf.table_path(table)
        if DeltaTable.isDeltaTable(spark, path):
            version = DeltaTable.forPath(spark, path).history(1).first()["version"]
            df = spark.read.format("delta").option("versionAsOf", version).load(path)
            frames[table] = (df, version)
    return check_frames(spark, conf, frames, declared, scope="table")


def check_frames(
    spark: SparkSession,
    conf: LakehouseConf,
    frames: dict[str, tuple[DataFrame, int | None]],
    declared: dict[str, Table],
    *,
    scope: str,
) -> list[SuiteOutcome]:
    """Run the suites of the given tables (their declarations in `declared`) on the given
    DataFrames (a whole table, or one micro-batch's rows), record the results and apply each
    suite's policy. Only a run on whole tables (`scope` "table") adds to the Data Docs: a page
    per micro-batch would grow `_quality` without end (the results table records each batch)."""
    if scope != "table":
        return _check_frames(spark, conf, frames, declared, scope, _context(None), docs=False)
    with _project(spark, conf) as project:
        return _check_frames(spark, conf, frames, declared, scope, _context(project), docs=True)


def _check_frames(
    spark: SparkSession,
    conf: LakehouseConf,
    frames: dict[str, tuple[DataFrame, int | None]],
    declared: dict[str, Table],
    scope: str,
    context,
    *,
    docs: bool,
) -> list[SuiteOutcome]:
    import great_expectations as gx

    source = context.data_sources.add_or_update_spark(name="lakehouse")
    run_id = uuid.uuid4().hex[:12]
    run_at = datetime.now(UTC).replace(tzinfo=None)
    rows, outcomes = [], []
    for suite in suites(conf, declared):
        if suite.table not in frames:
            continue
        frame, version = frames[suite.table]
        result = _validate(gx, context, source, suite, suite.prepare(frame), docs)
        where = f"{suite.table} ({scope if version is None else f'version {version}'})"
        failures, head = [], (run_id, run_at, suite.table, version, scope, suite.name)
        for r in result.results:
            expectation, column, observed, unexpected = _describe(r)
            rows.append((*head, expectation, column, bool(r.success), observed, unexpected))
            if not r.success:
                failures.append(
                    f"{where}: {expectation}"
                    f"{f' on {column}' if column else ''} failed"
                    f"{f', {unexpected} unexpected values' if unexpected else ''}"
                    f"{f', observed {observed}' if observed not in ('null', None) else ''}"
                )
        outcomes.append(
            SuiteOutcome(suite.name, suite.table, version, bool(result.success), failures)
        )
    if rows:
        results = Table(conf.tables.quality_results, RESULTS_SCHEMA, properties=APPEND_ONLY)
        path = ensure_table(spark, conf.table_path(results.name), results)
        local_frame(spark, rows, RESULTS_SCHEMA).write.format("delta").mode("append").save(path)
    failing = [
        o
        for o in outcomes
        if not o.success
        and conf.quality.policies.get(o.suite, conf.quality.default_policy) == "fail"
    ]
    for o in outcomes:
        if not o.success and o not in failing:
            for f in o.failures:
                log.warning("%s", f)
    if failing:
        lines = "\n  ".join(f for o in failing for f in o.failures)
        raise QualityCheckFailedError(
            f"data-quality run {run_id}: {len(failing)} suite(s) failed:\n  {lines}\n"
            f"(results in {conf.table_path(conf.tables.quality_results)})"
        )
    return outcomes


def _validate(gx, context, source, suite: Suite, df, docs: bool):
    known = {a.name: a for a in source.assets}
    asset = known.get(suite.name) or source.add_dataframe_asset(name=suite.name)
    batch_def = next((b for b in asset.batch_definitions if b.name == "whole"), None)
    batch_def = batch_def or asset.add_batch_definition_whole_dataframe("whole")
    gx_suite = context.suites.add_or_update(
        gx.ExpectationSuite(name=suite.name, expectations=list(suite.expectations))
    )
    definition = context.validation_definitions.add_or_update(
        gx.ValidationDefinition(data=batch_def, suite=gx_suite, name=f"{suite.name}_validation")
    )
    checkpoint = context.checkpoints.add_or_update(
        gx.Checkpoint(
            name=f"{suite.name}_checkpoint",
            validation_definitions=[definition],
            actions=[gx.checkpoint.UpdateDataDocsAction(name="docs")] if docs else [],
        )
    )
    run = checkpoint.run(batch_parameters={"dataframe": df})
    return next(iter(run.run_results.values()))
