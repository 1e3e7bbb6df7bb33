"""OpenLineage events of a layer job, sent to a real HTTP endpoint: the job's run and its
micro-batches, START then COMPLETE or FAIL, the datasets named where they live."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from pipelines.config import load_config
from pipelines.jobs import services
from pipelines.streaming import lineage


@pytest.fixture
def endpoint():
    """An HTTP server that keeps every POST: (path, JSON body)."""
    received: list[tuple[str, dict]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            body = self.rfile.read(int(self.headers["Content-Length"]))
            received.append((self.path, json.loads(body)))
            self.send_response(201)
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", received
    server.shutdown()
    server.server_close()


def test_a_job_run_and_its_batches_reach_an_http_endpoint(endpoint, tmp_path):
    url, received = endpoint
    conf = load_config("test").updated({"lineage.url": url, "storage.root": str(tmp_path)})
    with services.lineage_run(conf, "silver", "orders") as job:
        with lineage.batch(0, "q-1"):
            pass
        with pytest.raises(ValueError), lineage.batch(1, "q-1"):
            raise ValueError("a bad batch")
    assert {path for path, _ in received} == {"/api/v1/lineage"}
    events = [body for _, body in received]
    assert [(e["job"]["name"], e["eventType"]) for e in events] == [
        ("silver-orders", "START"),
        ("silver-orders.micro_batch", "START"),
        ("silver-orders.micro_batch", "COMPLETE"),
        ("silver-orders.micro_batch", "START"),
        ("silver-orders.micro_batch", "FAIL"),
        ("silver-orders", "COMPLETE"),
    ]
    assert {e["run"]["runId"] for e in (events[0], events[-1])} == {job.run_id}
    batches = events[1:5]
    assert {e["run"]["facets"]["parent"]["run"]["runId"] for e in batches} == {job.run_id}
    assert [e["run"]["facets"]["lakehouse_microBatch"]["batchId"] for e in batches] == [0, 0, 1, 1]
    assert events[4]["run"]["facets"]["errorMessage"]["message"] == "a bad batch"
    assert [(d["namespace"], d["name"]) for d in events[0]["inputs"]] == [
        ("file", f"{tmp_path}/bronze/orders_raw")
    ]
    assert [d["name"] for d in events[0]["outputs"]] == [
        f"{tmp_path}/silver/{t}" for t in ("order_events", "orders", "orders_quarantine")
    ]


def test_datasets_are_named_by_where_they_live():
    conf = load_config("test").updated({"storage.root": "s3a://lake/prod"})
    assert services.dataset(conf, "silver/orders") == ("s3://lake", "prod/silver/orders")
    assert services.topic_dataset(conf, "orders.events") == (
        "kafka://127.0.0.1:19092",
        "orders.events",
    )
    reads, writes = services.job_datasets(conf, "pipeline", "orders")
    assert reads == [
        ("kafka://127.0.0.1:19092", "orders.events"),
        ("s3://lake", "prod/dimensions/products"),
        ("s3://lake", "prod/dimensions/customers"),
    ]
    assert len(writes) == 2 + 3 + 4


def test_an_endpoint_that_does_not_answer_never_stops_the_job(tmp_path, caplog):
    conf = load_config("test").updated(
        {"lineage.url": "http://127.0.0.1:9", "storage.root": str(tmp_path)}
    )
    with services.lineage_run(conf, "bronze", "orders"), lineage.batch(0, None):
        pass
    assert [r.getMessage()[:45] for r in caplog.records if r.name == "lakehouse.lineage"] == [
        "could not send an OpenLineage event of bronze"
    ]
