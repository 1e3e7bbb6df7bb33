"""The project's logs: Python's `logging` for every message, on stderr, as text or JSON lines.

Each entry point calls `configure(conf)` (`log.level`, `log.format`). A JSON line carries what it
belongs to: the job run and task (the job runner's environment), and in a micro-batch its query
and batch ids (`batch_context`). The driver's JVM logs the same way (`log4j2.properties`, with the
project's own JSON template, `-Dlakehouse.log.appender=json`). A secret of the environment (the
Kafka password, the S3 secret key) never reaches a line: it is masked wherever it appears.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from pipelines import errors
from pipelines.config import SASL_PASSWORD_ENV, LakehouseConf

ROOT = "lakehouse"  # every logger of the project is under it: lakehouse.bronze, ...
SECRET_ENV = (SASL_PASSWORD_ENV, "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
MASK = "***"
# The context of a line: the job runner's environment, then the batch being written.
RUN_ENV = {"run_id": "LAKEHOUSE_JOB_RUN_ID", "task": "LAKEHOUSE_TASK_KEY"}
_batch = threading.local()
T = TypeVar("T")


def get(name: str) -> logging.Logger:
    """The project's logger for `name` (`bronze` -> `lakehouse.bronze`)."""
    return logging.getLogger(f"{ROOT}.{name}")


@contextmanager
def batch_context(query_id: str | None, batch_id: int) -> Iterator[None]:
    """Every line logged in the block (on this thread) names this query and batch."""
    before = getattr(_batch, "ids", None)
    _batch.ids = (query_id, batch_id)
    try:
        yield
    finally:
        _batch.ids = before


def in_this_context(fn: Callable[[], T]) -> Callable[[], T]:
    """`fn`, to run on another thread with this thread's query and batch on its log lines."""
    ids = getattr(_batch, "ids", None)

    def run() -> T:
        if ids is None:
            return fn()
        with batch_context(*ids):
            return fn()

    return run


def context() -> dict[str, object]:
    """The job run, task, query and batch of a line logged here and now (None where unknown)."""
    ids = getattr(_batch, "ids", None) or (None, None)
    fields: dict[str, object] = {k: os.environ.get(v) for k, v in RUN_ENV.items()}
    return fields | {"query_id": ids[0], "batch_id": ids[1]}


def mask(text: str) -> str:
    """`text` with every secret of the environment replaced by ***."""
    for name in SECRET_ENV:
        if (secret := os.environ.get(name)) and len(secret) >= 4:
            text = text.replace(secret, MASK)
    return text


class _Context(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in context().items():
            if getattr(record, key, None) is None:  # an `extra` given by the caller wins
                setattr(record, key, value)
        return True


class TextFormatter(logging.Formatter):
    """`21:04:05 INFO lakehouse.bronze: message`, as the JVM's lines look."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        return mask(super().format(record))


class JsonFormatter(logging.Formatter):
    """One JSON object per line: ts, level, logger, msg, and run_id, task, query_id, batch_id and
    exception where known: the fields of the JVM's JSON lines."""

    def format(self, record: logging.LogRecord) -> str:
        ts = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
        line: dict[str, object] = {
            "ts": f"{ts}.{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key in ("run_id", "task", "query_id", "batch_id"):  # as the JVM's: only those known
            if (value := getattr(record, key, None)) is not None:
                line[key] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return mask(json.dumps(line, default=str))


def configure(conf: LakehouseConf) -> None:
    """Send the project's loggers (at `log.level`) and every other library's warnings to stderr,
    in `log.format`. Safe to call again (the handler is replaced)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if conf.log.format == "json" else TextFormatter())
    handler.addFilter(_Context())
    handler.set_name(ROOT)
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == ROOT]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.WARNING)
    logging.getLogger(ROOT).setLevel("WARNING" if conf.log.level == "WARN" else conf.log.level)
    # the one line a process ends with, in the same form as the others
    json_lines = conf.log.format == "json"
    errors.report = (lambda message: get("job").error("%s", message)) if json_lines else _stderr


def print_json(value: object) -> None:
    """`value` as indented JSON on stdout: dataclasses as objects, dates and paths as text."""

    def plain(v: object) -> object:
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            return dataclasses.asdict(v)
        return str(v)

    print(json.dumps(value, indent=2, default=plain))


def _stderr(message: str) -> None:
    print(mask(message), file=sys.stderr)
