"""Known failures end a command with one readable line, never only a Java stack trace."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

EXIT_KNOWN_ERROR = 2


def _known() -> tuple[type[BaseException], ...]:
    from pipelines.config import InvalidConfigError
    from pipelines.kafka import KafkaUnreachableError, TopicMissingError
    from pipelines.layers.bronze import BronzeFailedError, RetentionGapError
    from pipelines.layers.gold import GoldFailedError
    from pipelines.layers.quality import QualityCheckFailedError
    from pipelines.layers.silver import SilverFailedError
    from pipelines.local.broker import LocalBrokerError
    from pipelines.local.cluster import ClusterError
    from pipelines.local.jars import JarResolutionError
    from pipelines.orchestration.spec import InvalidJobSpecError
    from pipelines.reference.producer import ProduceError

    return (
        BronzeFailedError, RetentionGapError, InvalidConfigError, JarResolutionError,
        KafkaUnreachableError, TopicMissingError, LocalBrokerError, ProduceError, SilverFailedError,
        GoldFailedError, QualityCheckFailedError, InvalidJobSpecError, ClusterError,
    )  # fmt: skip


@contextmanager
def exit_on_known_errors() -> Iterator[None]:
    """Turn a known error into `error: <message>` on stderr and exit code 2."""
    try:
        yield
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as e:
        if isinstance(e, _known()):
            print(f"error: {e}", file=sys.stderr)
            sys.exit(EXIT_KNOWN_ERROR)
        raise
