"""The project's errors: one base class, and an exit code for each kind of failure."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from enum import IntEnum


class ExitCode(IntEnum):
    """What a `lakehouse` command or a job script exits with (docs/operations.md, "Exit codes")."""

    OK = 0
    UNEXPECTED = 1  # a bug: the traceback is printed
    USAGE = 2  # a wrong command line
    CONFIG = 3  # a bad configuration or job spec: the message names the key and the file
    UNREACHABLE = 4  # a broker, the storage or the cluster did not answer: the message names it
    QUALITY = 5  # a data-quality suite with the `fail` policy failed
    JOB_FAILED = 6  # a query, a task or a tool stopped with an error, or data would be lost
    DENIED = 7  # a broker refused the login, or its certificate is not trusted: not retried
    INTERRUPTED = 130  # SIGINT or SIGTERM: stopped cleanly on request


class LakehouseError(Exception):
    """Base of every error this project raises on purpose; the message is for a person."""

    exit_code = ExitCode.JOB_FAILED


class ConfigError(LakehouseError, ValueError):
    """A setting, a spec or a declaration is wrong; the message names the key and its source."""

    exit_code = ExitCode.CONFIG


class UnreachableError(LakehouseError):
    """Something the command needs did not answer: a broker, the storage, a cluster."""

    exit_code = ExitCode.UNREACHABLE


class DeniedError(LakehouseError):
    """A service refused our credentials, or we refused its certificate: a retry cannot help."""

    exit_code = ExitCode.DENIED


class JobFailedError(LakehouseError):
    """A query, a task or a tool stopped with an error; the message names what and why."""


class QualityError(LakehouseError):
    """A data-quality suite with the `fail` policy did not pass."""

    exit_code = ExitCode.QUALITY


def _to_stderr(message: str) -> None:
    print(message, file=sys.stderr)


# How a process reports the error it ends with: one line on stderr; `pipelines.logs` makes it a
# JSON log line when the logs are JSON.
report: Callable[[str], None] = _to_stderr


@contextmanager
def exit_on_known_errors() -> Iterator[None]:
    """Turn a LakehouseError into `error: <message>` on stderr and its exit code, no traceback."""
    try:
        yield
    except KeyboardInterrupt:
        report("interrupted")
        sys.exit(ExitCode.INTERRUPTED)
    except LakehouseError as e:
        report(f"error: {e}")
        sys.exit(e.exit_code)
