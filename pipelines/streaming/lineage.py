"""OpenLineage events of the layer jobs: each job run and each of its micro-batches, START then
COMPLETE (FAIL, or ABORT for a batch left to the next run), naming what it reads and writes.

Dataset names, facets and where events go: docs/monitoring.md, "Lineage (OpenLineage)". An event
that cannot be sent is logged, never a reason to stop a job.
"""

from __future__ import annotations

import time
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from importlib.metadata import version

import attr
from openlineage.client import OpenLineageClient
from openlineage.client.event_v2 import InputDataset, Job, OutputDataset, Run, RunEvent, RunState
from openlineage.client.facet_v2 import RunFacet, error_message_run, parent_run
from openlineage.client.uuid import generate_new_uuid

from pipelines import logs

log = logs.get("lineage")
PRODUCER = "https://github.com/streaming-lakehouse/streaming-lakehouse"
PAUSE_S = 60.0  # after an event could not be sent, the next ones are dropped this long

_current: JobLineage | None = None


@attr.define
class MicroBatchRunFacet(RunFacet):
    """The micro-batch a run is: its id and its streaming query's id."""

    batchId: int  # noqa: N815 (OpenLineage's camel case)
    queryId: str | None = None  # noqa: N815


class JobLineage:
    """The events of one job run and of its micro-batches."""

    def __init__(
        self,
        client: OpenLineageClient,
        namespace: str,
        name: str,
        reads: list[tuple[str, str]],
        writes: list[tuple[str, str]],
    ) -> None:
        self.client, self.namespace, self.name = client, namespace, name
        self.inputs = [InputDataset(namespace=n, name=d) for n, d in reads]
        self.outputs = [OutputDataset(namespace=n, name=d) for n, d in writes]
        self.run_id = str(generate_new_uuid())
        self.paused_until = 0.0  # monotonic time until which events are dropped

    def emit(self, state: RunState, run_id: str, job: str, facets: dict) -> None:
        event = RunEvent(
            eventType=state,
            eventTime=datetime.now(UTC).isoformat(),
            run=Run(runId=run_id, facets=facets),
            job=Job(namespace=self.namespace, name=job),
            inputs=self.inputs,
            outputs=self.outputs,
            producer=f"{PRODUCER}/{version('streaming-lakehouse')}",
        )
        if time.monotonic() < self.paused_until:
            return
        try:
            self.client.emit(event)
        except Exception as e:  # lineage is a courtesy to other tools: never stop the job
            log.warning(
                "could not send an OpenLineage event of %s (%s); dropping its events for %.0f s",
                self.name,
                e,
                PAUSE_S,
            )
            self.paused_until = time.monotonic() + PAUSE_S

    @contextmanager
    def batch(self, batch_id: int, query_id: str | None) -> Iterator[None]:
        """START and COMPLETE (or FAIL, or ABORT for a batch refused after a stop request)."""
        run_id = str(generate_new_uuid())
        parent = parent_run.ParentRunFacet(
            run=parent_run.Run(runId=self.run_id),
            job=parent_run.Job(namespace=self.namespace, name=self.name),
        )
        facets = {
            "parent": parent,
            "lakehouse_microBatch": MicroBatchRunFacet(batchId=batch_id, queryId=query_id),
        }
        job = f"{self.name}.micro_batch"
        self.emit(RunState.START, run_id, job, facets)
        try:
            yield
        except BaseException as e:
            stopped = type(e).__name__ == "StopRequested"
            state = RunState.ABORT if stopped else RunState.FAIL
            self.emit(state, run_id, job, facets | ({} if stopped else _error(e)))
            raise
        self.emit(RunState.COMPLETE, run_id, job, facets)


def _error(e: BaseException) -> dict:
    stack = "".join(traceback.format_exception(e))[-4000:]
    return {
        "errorMessage": error_message_run.ErrorMessageRunFacet(
            message=str(e)[:2000], programmingLanguage="python", stackTrace=stack
        )
    }


@contextmanager
def batch(batch_id: int, query_id: str | None) -> Iterator[None]:
    """The micro-batch's events, when this process's job emits lineage."""
    if _current is None:
        yield
        return
    with _current.batch(batch_id, query_id):
        yield


@contextmanager
def job_run(lineage: JobLineage) -> Iterator[JobLineage]:
    """START the job's run, COMPLETE it at the end of the block (FAIL on an error)."""
    global _current
    lineage.emit(RunState.START, lineage.run_id, lineage.name, {})
    _current = lineage
    try:
        yield lineage
    except BaseException as e:
        interrupted = isinstance(e, KeyboardInterrupt | SystemExit)
        state = RunState.ABORT if interrupted else RunState.FAIL
        lineage.emit(state, lineage.run_id, lineage.name, {} if interrupted else _error(e))
        raise
    finally:
        _current = None
    lineage.emit(RunState.COMPLETE, lineage.run_id, lineage.name, {})
