"""The shared main of the layer jobs: their options, the configuration, a session, the query."""

from __future__ import annotations

import argparse
from collections.abc import Callable

from pipelines.config import load_config
from pipelines.errors import exit_on_known_errors
from pipelines.kafka import check_reachable
from pipelines.streaming.spark import build_spark


def parse_args(argv: list[str] | None, prog: str, description: str) -> argparse.Namespace:
    """The options every layer's job takes."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--env", default=None, help="configuration environment (conf/<env>.yaml)")
    parser.add_argument("--stream", default="orders", help="stream name from the configuration")
    parser.add_argument("--once", action="store_true", help="process what is available, then stop")
    parser.add_argument("--quiet", action="store_true", help="no per-batch progress lines")
    return parser.parse_args(argv)


def run_layer_job(
    argv: list[str] | None, layer: str, run: Callable, doc: str, *, needs_kafka: bool = False
) -> int:
    """A layer job's main: its options, the configuration, a session, then the layer's query."""
    args = parse_args(argv, prog=layer, description=doc.splitlines()[0])
    with exit_on_known_errors():
        conf = load_config(args.env)
        if needs_kafka:
            check_reachable(conf)  # fail fast, naming the broker, before a JVM starts
        spark = build_spark(conf, app_name=f"lakehouse-{layer}-{args.stream}")
        run(spark, conf, args.stream, once=args.once, progress=not args.quiet)
    return 0
