"""The push API over real HTTP on loopback: content types, auth, limits, validation, idempotency, group commit."""

from __future__ import annotations

import codecs
import errno
import gzip
import http.client
import io
import json
import os
import socket
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from functools import partial
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from deltalake.exceptions import TableNotFoundError
from pyspark.errors import AnalysisException, PySparkTypeError
from pyspark.sql.streaming.datasource import ReadAllAvailable

from lakefeed.batch.schema import decoded
from lakefeed.config import model as config
from lakefeed.connectors.streams.spool_stream import SpoolDataSource
from lakefeed.errors import TerminalError
from lakefeed.inbox.spool import Pending, Spool, SpoolEnd, SpoolReader, encode
from lakefeed.intake import openapi
from lakefeed.intake.http_server import HttpServer
from lakefeed.intake.push_api import Endpoint, PushApi, token_hash
from lakefeed.intake.s3_webhook import Webhooks
from lakefeed.pipeline.entity import EntityPipeline
from lakefeed.pipeline.sinks import Sinks
from lakefeed.pipeline.verdict import data_fault, store_fault
from tests.conftest import write_config

REPO = Path(__file__).resolve().parent.parent


@dataclass
class Api:
    cfg: config.LakefeedConfig
    pipelines: dict[str, EntityPipeline]
    endpoints: dict[str, Endpoint]
    api: PushApi
    server: HttpServer
    host: str
    port: int
    batches: int = 0
    done: dict[str, int] = field(default_factory=dict)

    def post(self, body: bytes, content_type: str = "application/json", token: str | None = "t-orders",
             path: str = "/v1/entities/orders/sources/api/records", **headers: str) -> tuple[int, dict, dict]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=30)
        head = {"Content-Type": content_type, **{k.replace("_", "-"): v for k, v in headers.items()}}
        if token is not None:
            head["Authorization"] = f"Bearer {token}"
        conn.request("POST", path, body=body, headers=head)
        resp = conn.getresponse()
        data = resp.read()
        conn.close()
        return resp.status, json.loads(data) if data else {}, dict(resp.getheaders())

    def frames(self, stream: str = "api", entity: str = "orders") -> int:
        return SpoolReader(self.cfg.entity(entity).spool(stream)).refresh()

    def ingest(self, stream: str = "api", entity: str = "orders") -> None:
        """What the stream's micro-batch does: the frames not yet processed, into the tables."""
        reader = SpoolReader(self.cfg.entity(entity).spool(stream))
        end = reader.refresh()
        entries = reader.entries(max(reader.start(), self.done.get(entity, 0)), end)
        self.pipelines[entity].process_frames(stream, entries, self.batches)
        self.batches += 1
        self.done[entity] = end

    def table(self, entity: str = "orders") -> list[dict]:
        return DeltaTable(str(self.cfg.entity(entity).table)).to_pyarrow_table().sort_by("id").to_pylist()


def _entity(name: str, token: str, **push: object) -> dict:
    return {"name": name, "cdc": {"strategy": "upsert", "primary_key": ["id"]},
            "push": [{"name": "api", "tokens_sha256": [token_hash(token)], **push}]}


@pytest.fixture
def make_api(tmp_path):
    made: list[Api] = []

    def make(http: dict | None = None, **push: object) -> Api:
        path = write_config(tmp_path, [_entity("orders", "t-orders", **push), _entity("other", "t-other")],
                            http={"host": "127.0.0.1", "port": 0, **(http or {})})
        cfg = config.load(path)
        pipelines, endpoints, schemas = {}, {}, {}
        for entity in cfg.entities:
            checkpoint = entity.stream_checkpoint("api")
            checkpoint.mkdir(parents=True)
            (checkpoint / "metadata").write_text(json.dumps({"id": f"q-{entity.name}"}))
            pipelines[entity.name] = EntityPipeline(entity, Sinks.of(entity))
            pipelines[entity.name].prepare()
            # As the daemon does it: each commit hands the table's schema on to the endpoints.
            schemas[entity.name] = pipelines[entity.name].push_schema()
            pipelines[entity.name].on_schema = partial(schemas.__setitem__, entity.name)
            endpoints[entity.name] = Endpoint.open(entity, entity.push[0], partial(schemas.get, entity.name))
        api = PushApi(list(endpoints.values()), cfg.http.max_body_bytes)
        server = HttpServer(cfg.http, api.routes())
        url = server.start()
        host, port = url.split("://")[1].split(":")
        made.append(Api(cfg, pipelines, endpoints, api, server, host, int(port)))
        return made[-1]

    yield make
    for api in made:
        api.server.stop()
        api.api.close()  # closes the endpoints' spools too


def _parquet(rows: list[dict]) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out)
    return out.getvalue()


def _arrow(rows: list[dict]) -> bytes:
    table = pa.Table.from_pylist(rows)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_every_content_type_is_acknowledged_after_the_spool_and_lands_in_delta(make_api):
    api = make_api()
    bodies = [
        (json.dumps([{"id": 1, "v": "json"}, {"id": 2, "v": "json"}]).encode(), "application/json"),
        (b'{"id": 2, "v": "ndjson"}\n{"id": 3, "v": "ndjson"}\n', "application/x-ndjson"),
        (b"id,v\n4,csv\n5,csv\n", "text/csv; charset=utf-8"),
        (_parquet([{"id": 6, "v": "parquet"}]), "application/vnd.apache.parquet"),
        (_arrow([{"id": 1, "v": "arrow"}, {"id": 7, "v": "arrow"}]), "application/vnd.apache.arrow.stream"),
    ]
    answers = [api.post(body, kind) for body, kind in bodies]
    assert [(status, a["batch"], a["records"]) for status, a, _ in answers] == [
        (202, 0, 2), (202, 1, 2), (202, 2, 2), (202, 3, 1), (202, 4, 2)]
    assert api.frames() == 5  # acknowledged means in the spool
    api.ingest()
    assert [(r["id"], r["v"]) for r in api.table()] == [
        (1, "arrow"), (2, "ndjson"), (3, "ndjson"), (4, "csv"), (5, "csv"), (6, "parquet"), (7, "arrow")]
    changelog = DeltaTable(str(api.cfg.entity("orders").changelog)).to_pyarrow_table()
    # One change per key per batch: frame 0 was superseded by frames 1 and 4 within the batch.
    assert set(changelog.column("source_file").to_pylist()) == {f"push/api/{n}" for n in (1, 2, 3, 4)}


def test_auth_unknown_targets_and_content_types(make_api):
    api = make_api()
    body = b'[{"id": 1}]'
    status, answer, headers = api.post(body, token=None)
    assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
    assert api.post(body, token="wrong")[0] == 401
    status, answer, _ = api.post(body, token="t-other")
    assert status == 403 and "orders/api" in answer["error"]
    assert api.post(body, token="t-other", path="/v1/entities/other/sources/api/records")[0] == 202
    assert api.post(body, path="/v1/entities/nope/sources/api/records")[0] == 404
    assert api.post(body, path="/v1/entities/orders/sources/nope/records")[0] == 404
    status, answer, _ = api.post(body, content_type="application/xml")
    assert status == 415 and "text/csv" in answer["error"]
    assert api.frames() == 0


def test_body_size_limit(make_api):
    api = make_api(http={"max_body_bytes": 2048})
    small = json.dumps([{"id": i} for i in range(10)]).encode()
    big = json.dumps([{"id": i, "pad": "x" * 50} for i in range(100)]).encode()
    assert api.post(small)[0] == 202
    status, answer, _ = api.post(big)
    assert status == 413 and "2048" in answer["error"]
    assert api.frames() == 1


def test_malformed_and_invalid_records_are_rejected_whole_with_rows_and_fields(make_api):
    api = make_api()
    assert api.post(b'[{"id": 1, "v": "a", "n": 5}]')[0] == 202
    api.ingest()  # the table now fixes the types: id int64, n int64
    status, answer, _ = api.post(b'[{"id": 1, "v": "a"')
    assert status == 400 and "not valid JSON" in answer["error"]
    status, answer, _ = api.post(b'{"id": 2}\nnot json\n{"id": 3}\n', "application/x-ndjson")
    assert status == 400 and [(p["row"], p["field"]) for p in answer["problems"]] == [(2, None)]
    status, answer, _ = api.post(json.dumps([{"id": 2, "n": 1}, {"id": 3, "n": "many"}, {"v": "no key"},
                                             {"id": "four", "n": 4}]).encode())
    assert status == 400
    assert sorted((p["row"], p["field"]) for p in answer["problems"]) == [(2, "n"), (3, "id"), (4, "id")]
    assert answer["problems_total"] == 3 and "nothing was stored" in answer["error"]
    status, answer, _ = api.post(b"id,n\n5,1\n6,2,extra\n", "text/csv")
    assert status == 400 and answer["problems"][0]["row"] == 2
    assert api.post(b"[]")[0] == 400
    assert api.post(b"")[0] == 400
    assert api.frames() == 1  # nothing of a rejected request was stored


def test_idempotent_retries_are_acknowledged_again_and_stored_once(make_api):
    api = make_api()
    body = b'[{"id": 1, "v": "a"}, {"id": 2, "v": "b"}]'
    first = api.post(body, Idempotency_Key="req-1")
    again = api.post(body, Idempotency_Key="req-1")
    assert first[0] == again[0] == 202
    assert (again[1]["batch"], again[1]["records"], again[1]["duplicate"]) == (first[1]["batch"], 2, True)
    with ThreadPoolExecutor(8) as pool:  # a burst of concurrent retries of one new request
        answers = list(pool.map(lambda _: api.post(body, Idempotency_Key="req-2"), range(8)))
    assert {a[1]["batch"] for a in answers} == {1} and sum(not a[1]["duplicate"] for a in answers) == 1
    assert api.frames() == 2
    # The key outlives the segment holding its frame and a restart of the spool.
    endpoint = api.endpoints["orders"]
    endpoint.commit.close()
    spool = Spool(api.cfg.entity("orders").spool("api"), segment_bytes=1, ttl_s=3600)
    spool.append([])  # rotate: the old segment is complete
    assert spool.release(2) == 1
    spool.close()
    reopened = Spool(api.cfg.entity("orders").spool("api"), segment_bytes=1, ttl_s=3600)
    assert reopened.known("req-1").offset == 0 and reopened.known("req-2").offset == 1
    assert reopened.next_offset == 2
    endpoint.commit = type(endpoint.commit)(reopened, endpoint.source.spool_max_bytes)


def test_concurrent_producers_share_fsyncs_and_get_dense_offsets(make_api):
    api = make_api()
    spool = api.endpoints["orders"].spool
    appends = []
    original = spool.append

    def counting(items):
        appends.append(len(items))
        return original(items)

    spool.append = counting
    producers, each = 8, 40

    def produce(p: int) -> list[int]:
        out = []
        for i in range(each):
            status, answer, _ = api.post(json.dumps([{"id": p * 1000 + i, "v": "x"}]).encode())
            assert status == 202
            out.append(answer["batch"])
        return out

    with ThreadPoolExecutor(producers) as pool:
        batches = [b for part in pool.map(produce, range(producers)) for b in part]
    assert sorted(batches) == list(range(producers * each))
    assert sum(appends) == producers * each
    assert len(appends) < producers * each  # some requests shared one write + fsync
    api.ingest()
    assert len(api.table()) == producers * each


def test_rate_limit_and_spool_bound_answer_with_retry_after(make_api):
    api = make_api(rate_limit_per_s=1.0, spool_max_bytes=1)
    body = b'[{"id": 1}]'
    assert api.post(body)[0] == 202  # the spool is now over its bound of 1 byte
    status, answer, headers = api.post(body)
    assert status in (429, 503) and int(headers["Retry-After"]) >= 1
    statuses = {api.post(body)[0] for _ in range(3)}
    assert statuses <= {429, 503} and api.frames() == 1


def test_event_time_header_and_column_validation(make_api):
    api = make_api()
    status, answer, _ = api.post(b'[{"id": 1}]', Event_Time="yesterday")
    assert status == 400 and "Event-Time" in answer["error"]
    assert api.post(b'[{"id": 1}]', Event_Time="2024-05-01T10:00:00Z")[0] == 202
    api.ingest()
    changelog = DeltaTable(str(api.cfg.entity("orders").changelog)).to_pyarrow_table()
    assert [t.isoformat() for t in changelog.column("event_time").to_pylist()] == ["2024-05-01T10:00:00+00:00"]


def test_the_openapi_document_is_served_and_kept_in_docs(make_api):
    served = openapi.document()
    assert json.loads((REPO / "docs" / "openapi.json").read_text()) == served, \
        "docs/openapi.json is stale: run `lakefeed openapi > docs/openapi.json`"
    post = served["paths"]["/v1/entities/{entity}/sources/{source}/records"]["post"]
    assert {"202", "400", "401", "403", "404", "413", "415", "429", "503"} <= set(post["responses"])


def test_torn_spool_tail_is_dropped_and_the_reader_resumes_after_released_segments(tmp_path):
    folder = tmp_path / "spool"
    spool = Spool(folder, segment_bytes=1, ttl_s=60)
    for _ in range(3):
        spool.append([Pending(b"x" * 10, 1, None, None)])  # one frame per segment (segment_bytes=1)
    assert spool.release(2) == 2  # frames 0 and 1 are committed; the segment holding 2 stays
    last = sorted(folder.glob("*.spool"))[-1]
    with open(last, "ab") as f:
        f.write(b"LFS1\x00\x00")  # a torn frame from a crash mid-append
    spool.close()  # the crashed writer's lock goes with it
    reopened = Spool(folder, segment_bytes=1, ttl_s=60)
    assert reopened.next_offset == 3
    reader = SpoolReader(folder)
    assert (reader.refresh(), reader.start()) == (3, 2)
    assert [e.offset for e in reader.entries(2, 3)] == [2]
    # What the daemon counts a push stream's backlog with: frames so far, past released segments.
    end = SpoolEnd(folder)
    assert end() == 3
    reopened.append([Pending(b"y" * 10, 1, None, None)])
    assert end() == 4
    assert reopened.release(4) == 1 and end() == 4 and SpoolEnd(folder)() == 4
    reopened.close()


def test_tls_serves_the_api_over_https_only(make_api, tmp_path):
    import ssl
    import subprocess

    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True)
    api = make_api(http={"tls_cert": str(cert), "tls_key": str(key)})
    assert api.server.url.startswith("https://")
    context = ssl.create_default_context(cafile=str(cert))
    conn = http.client.HTTPSConnection(api.host, api.port, context=context, timeout=30)
    conn.request("POST", "/v1/entities/orders/sources/api/records", b'[{"id": 1}]',
                 {"Authorization": "Bearer t-orders", "Content-Type": "application/json"})
    assert conn.getresponse().status == 202
    conn.close()
    with pytest.raises((http.client.HTTPException, ConnectionError)):
        api.post(b'[{"id": 2}]')  # plain HTTP on the TLS port is refused
    assert api.frames() == 1


def test_ndjson_values_keep_the_table_types_instead_of_inferred_ones(make_api):
    api = make_api()
    assert api.post(b'[{"id": 1, "ts": "2024-02-17T05:20:00Z"}]')[0] == 202
    api.ingest()  # ts is a string column now
    body = b'{"id": 2, "ts": "2024-02-18T05:20:00Z"}\n{"id": 3, "ts": "soon"}\n'
    assert api.post(body, "application/x-ndjson")[0] == 202
    api.ingest()
    assert [r["ts"] for r in api.table()] == ["2024-02-17T05:20:00Z", "2024-02-18T05:20:00Z", "soon"]


def test_a_spool_has_one_writer_at_a_time(tmp_path):
    folder = tmp_path / "spool"
    first = Spool(folder, segment_bytes=1 << 20, ttl_s=60)
    with pytest.raises(TerminalError, match="held by another writer"):
        Spool(folder, segment_bytes=1 << 20, ttl_s=60, lock_timeout_s=0.2)
    # Another process is kept out as well (an intake that outlived its daemon for a moment).
    probe = ("import sys; from lakefeed.inbox.spool import Spool\n"
             "try: Spool(__import__('pathlib').Path(sys.argv[1]), 1 << 20, 60, lock_timeout_s=0.2)\n"
             "except Exception as exc: print(type(exc).__name__)")
    held = subprocess.run([sys.executable, "-c", probe, str(folder)], capture_output=True, text=True, check=True)
    assert held.stdout.strip() == "TerminalError"
    first.append([Pending(b"x", 1, None, None)])
    first.close()
    second = Spool(folder, segment_bytes=1 << 20, ttl_s=60, lock_timeout_s=0.2)
    assert second.next_offset == 1
    second.close()


def _rss_mib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) // 1024 for line in f if line.startswith("VmRSS"))


def test_a_compression_bomb_is_413_without_the_memory_it_would_take(make_api):
    import gzip

    api = make_api(http={"max_body_bytes": 64 << 20})
    bomb = gzip.compress(b"[" + b" " * (1 << 30) + b"]", 9)  # 1 GiB of JSON in ~1 MB
    assert api.post(gzip.compress(b'[{"id": 1}]'), Content_Encoding="gzip")[0] == 202  # gzip itself is fine
    before = _rss_mib()
    for _ in range(3):
        status, answer, _ = api.post(bomb, Content_Encoding="gzip")
        assert status == 413 and "inflates to more than" in answer["error"]
    assert _rss_mib() - before < 48, "each bomb left its inflated buffers behind"
    assert api.post(b"\x1f\x8b not gzip", Content_Encoding="gzip")[0] == 400
    assert api.post(b"[]", Content_Encoding="br")[0] == 415


def test_acknowledged_records_the_table_refuses_are_parked_in_quarantine_and_the_stream_goes_on(make_api):
    """Frames an older lakefeed acknowledged without today's checks (columns differing only by case, which
    delta-rs refuses): the batch is parked in quarantine with the reason, once, and later pushes land."""
    api = make_api()
    assert api.post(b'[{"id": 1}]')[0] == 202
    api.ingest()
    poison = pa.table({"id": [2, 3], "ID": [20, 30]})
    api.endpoints["orders"].spool.append([Pending(encode(poison), 2, None, None)])
    api.ingest()  # a data fault: parked, not raised
    quarantine = DeltaTable(str(api.cfg.entity("orders").quarantine)).to_pyarrow_table().to_pylist()
    assert len(quarantine) == 2 and all("the table refused this batch" in q["reason"] for q in quarantine)
    assert sorted(json.loads(q["raw"])["id"] for q in quarantine) == ["2", "3"]
    assert api.post(b'[{"id": 4}]')[0] == 202
    api.ingest()
    assert [r["id"] for r in api.table()] == [1, 4]


def _raising(exc: Exception):
    def merge(*args: object, **kwargs: object) -> int:
        raise exc
    return merge


def test_a_bug_in_the_commit_path_stops_the_batch_and_parks_nothing(make_api, monkeypatch):
    """A plain TypeError is lakefeed's own fault (a call with the wrong arguments), not the data's: the batch
    is raised for the entity to stop with it, nothing goes to quarantine, and once the code is right the same
    frames commit. Arrow's and Spark's TypeErrors are types the data has and the writer cannot take: parked."""
    api = make_api()
    assert api.post(b'[{"id": 1}, {"id": 2}]')[0] == 202
    sink = api.pipelines["orders"].sinks.table

    monkeypatch.setattr(sink, "merge", _raising(TypeError("merge() got an unexpected keyword argument 'plan'")))
    with pytest.raises(TypeError, match="unexpected keyword"):
        api.ingest()
    assert not DeltaTable.is_deltatable(str(api.cfg.entity("orders").quarantine))
    monkeypatch.undo()
    api.done.clear()  # the batch is replayed from the spool, as a restart does
    api.ingest()
    assert [r["id"] for r in api.table()] == [1, 2]

    refusals = [pa.ArrowTypeError("Unable to merge: Field id has incompatible types: int64 vs string"),
                PySparkTypeError(errorClass="UNSUPPORTED_DATA_TYPE_FOR_ARROW_CONVERSION",
                                 messageParameters={"data_type": "uint64"})]
    for n, refusal in enumerate(refusals, start=3):
        assert api.post(json.dumps([{"id": n}]).encode())[0] == 202
        monkeypatch.setattr(sink, "merge", _raising(refusal))
        api.ingest()  # a data fault: parked, not raised
    quarantine = DeltaTable(str(api.cfg.entity("orders").quarantine)).to_pyarrow_table().to_pylist()
    reasons = {json.loads(q["raw"])["id"]: q["reason"] for q in quarantine}
    assert reasons.keys() == {"3", "4"}
    assert "ArrowTypeError" in reasons["3"] and "PySparkTypeError" in reasons["4"]


@pytest.mark.parametrize("missing", [
    TableNotFoundError("no log files"),
    AnalysisException(message="[DELTA_TABLE_NOT_FOUND] Delta table `/lake/t` doesn't exist.")])  # as Spark says it
def test_a_table_found_missing_is_retried_never_parked(make_api, monkeypatch, missing):
    """A table the commit cannot find is the lake's state at fault, not the rows' (a creation a crash cut short
    was one): it is a store fault, retried, and the acknowledged rows land once the table can be written."""
    api = make_api()
    assert api.post(b'[{"id": 1}, {"id": 2}]')[0] == 202
    assert store_fault(missing) and not data_fault(missing)
    monkeypatch.setattr(api.pipelines["orders"].sinks.table, "merge", _raising(missing))
    with pytest.raises(type(missing)):
        api.ingest()
    assert not DeltaTable.is_deltatable(str(api.cfg.entity("orders").quarantine))
    monkeypatch.undo()
    api.done.clear()  # the batch is replayed from the spool, as the runner's retry does
    api.ingest()
    assert [r["id"] for r in api.table()] == [1, 2]


def _raw_request(api: Api, body: bytes, key: bytes, send: int) -> socket.socket:
    """A request with an Idempotency-Key of raw bytes whose client sends the first `send` bytes of its body."""
    conn = socket.create_connection((api.host, api.port))
    conn.sendall(b"POST /v1/entities/orders/sources/api/records HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
                 b"t-orders\r\nContent-Type: application/json\r\nIdempotency-Key: " + key +
                 b"\r\nConnection: close\r\nContent-Length: %d\r\n\r\n" % len(body) + body[:send])
    return conn


def test_retries_waiting_for_a_request_that_fails_store_the_records_once(make_api):
    """The first request with a key stalls and its client goes away; of the two retries waiting for it, one
    stores the records and the other is answered with that one's entry."""
    api = make_api()
    body = b'[{"id": 1, "v": "a"}]'
    first = _raw_request(api, body, b"k1", send=5)
    time.sleep(0.3)  # the first request holds the key
    with ThreadPoolExecutor(2) as pool:
        retries = [pool.submit(api.post, body, Idempotency_Key="k1") for _ in range(2)]
        time.sleep(0.5)  # both wait for the first
        first.close()
        answers = sorted((r.result()[0], r.result()[1]["batch"], r.result()[1]["duplicate"]) for r in retries)
    assert answers == [(202, 0, False), (202, 0, True)]
    assert api.frames() == 1


def test_an_idempotency_key_that_is_not_utf8_is_a_400_and_an_old_one_cannot_stop_the_spool_stream(make_api):
    api = make_api()
    conn = _raw_request(api, b'[{"id": 1}]', b"k\xff\xfe", send=11)
    answer = conn.recv(10000)
    conn.close()
    assert answer.startswith(b"HTTP/1.1 400") and b"must be UTF-8" in answer
    assert api.frames() == 0
    # A key an older intake stored: Spark gets it with its bad bytes replaced, not a UnicodeEncodeError.
    folder = api.cfg.entity("orders").spool("api")
    api.endpoints["orders"].spool.append([Pending(encode(pa.table({"id": [1]})), 1, "k\udcff\udcfe", None)])
    reader = SpoolDataSource({"path": str(folder)}).streamReader(None)
    start = reader.initialOffset()
    rows = reader.partitions(start, reader.latestOffset(start, ReadAllAvailable()))[0].rows
    keys = pa.array([row[6] for row in rows], pa.string())  # as Spark's Arrow conversion does
    assert keys.to_pylist() == ["k\ufffd\ufffd"]


def test_a_segment_that_cannot_be_created_is_a_507_and_appends_work_once_there_is_space(make_api, monkeypatch):
    api = make_api(segment_bytes=1)  # every request starts a segment
    assert api.post(b'[{"id": 1}]')[0] == 202
    real_open = os.open

    def full(path, flags, *args):
        if str(path).endswith(".spool") and flags & os.O_CREAT:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", full)
    status, answer, headers = api.post(b'[{"id": 2}]')
    assert status == 507 and "nothing was stored" in answer["error"] and headers["Retry-After"]
    monkeypatch.undo()
    assert [api.post(json.dumps([{"id": n}]).encode())[:2][1]["batch"] for n in (3, 4)] == [1, 2]
    api.ingest()
    assert [r["id"] for r in api.table()] == [1, 3, 4]


def test_decompression_bombs_of_arrow_and_parquet_are_413(make_api):
    api = make_api(http={"max_body_bytes": 65536})
    zeros = pa.table({"id": pa.array(np.zeros(2_000_000, dtype=np.int64))})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, zeros.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(zeros)
    parquet = io.BytesIO()
    pq.write_table(zeros, parquet, compression="zstd")
    for body, kind in ((sink.getvalue().to_pybytes(), "arrow.stream"), (parquet.getvalue(), "parquet")):
        assert len(body) < 65536
        status, answer, _ = api.post(body, f"application/vnd.apache.{kind}")
        assert status == 413 and "decodes to more than 8 × 65536 bytes" in answer["error"], answer
    assert api.frames() == 0
    assert api.post(_arrow([{"id": 1}]), "application/vnd.apache.arrow.stream")[0] == 202


def test_gzip_members_are_all_decoded_and_cut_or_trailed_streams_are_400(make_api):
    api = make_api()
    members = gzip.compress(b'{"id": 1}\n{"id": 2}\n') + gzip.compress(b'{"id": 3}\n')
    assert api.post(members, "application/x-ndjson", Content_Encoding="gzip")[1]["records"] == 3
    whole = gzip.compress(b'{"id": 4}\n' * 50)
    for body, says in ((whole[:-12], "cut short"), (whole + b"GARBAGE", "7 bytes follow the end")):
        status, answer, _ = api.post(body, "application/x-ndjson", Content_Encoding="gzip")
        assert status == 400 and says in answer["error"]
    assert api.frames() == 1


def test_csv_with_a_bom_keeps_its_first_column_and_unreadable_headers_are_400(make_api):
    api = make_api()
    assert api.post(b'[{"code": "x", "id": 1}]')[0] == 202
    api.ingest()  # code is a string column
    assert api.post(b"\xef\xbb\xbfcode,id\n007,2\n", "text/csv")[0] == 202
    api.ingest()
    assert [r["code"] for r in api.table()] == ["x", "007"]
    for body in (b"code,id\r007,3\r", b"id," + b"v" * 200_000 + b"\n1,2\n"):
        status, answer, _ = api.post(body, "text/csv")
        assert status == 400 and "the CSV header cannot be read" in answer["error"]


def test_what_no_table_can_take_is_a_400_naming_the_column(make_api):
    api = make_api()
    cases = {
        # (a dictionary of strings is a key like its values: test_a_dictionary_encoded_key_lands_as_its_values)
        "id": [pa.array([[1]]), pa.array([{"a": 1}]), pa.array([[("a", 1)]], pa.map_(pa.string(), pa.int64())),
               pa.DictionaryArray.from_arrays(pa.array([0], pa.int32()), pa.array([[1]])), pa.array([float("nan")])],
        "c": [pa.RunEndEncodedArray.from_arrays(pa.array([1], pa.int32()), pa.array(["x"])),
              pa.array([uuid.uuid4().bytes], pa.uuid()), pa.array(['{"a": 1}'], pa.json_()),
              pa.StructArray.from_arrays([pa.array([1]), pa.array([2])], names=["a", "a"]),
              pa.array([2**31 - 1], pa.date32()), pa.array([-62167219200 - 86400 * 400], pa.timestamp("s"))],
    }
    for name, columns in cases.items():
        for column in columns:
            table = pa.table({"id": pa.array([1]), "c": column}) if name == "c" else pa.table({"id": column})
            status, answer, _ = api.post(encode(table), "application/vnd.apache.arrow.stream")
            assert status == 400 and {p["field"] for p in answer["problems"]} == {name}, (column.type, answer)
    assert api.post(b'[{"id": NaN}]')[0] == 400  # also on the fast path of small JSON requests
    assert api.frames() == 0


def test_a_dictionary_encoded_key_lands_as_its_values_and_its_nulls_are_a_400(make_api):
    """As in a landed file (batch/read.py conform): a dictionary is only an encoding of its values."""
    api = make_api()
    arrow = "application/vnd.apache.arrow.stream"
    ids = pa.DictionaryArray.from_arrays(pa.array([2, 0, 1], pa.int32()), pa.array(["k1", "k2", "k3"]))
    status, answer, _ = api.post(encode(pa.table({"id": ids, "n": [1, 2, 3]})), arrow)
    assert status == 202 and answer["records"] == 3, answer
    api.ingest()
    assert [(r["id"], r["n"]) for r in api.table()] == [("k1", 2), ("k2", 3), ("k3", 1)]
    stored = DeltaTable(str(api.cfg.entity("orders").table)).to_pyarrow_table().schema.field("id").type
    assert not pa.types.is_dictionary(stored) and pa.array(["k"]).cast(stored).to_pylist() == ["k"], stored
    # A null index (row 2) and an index of a null value (row 3) are both a null key.
    nulls = pa.DictionaryArray.from_arrays(pa.array([0, None, 1], pa.int8()), pa.array(["k4", None]))
    status, answer, _ = api.post(encode(pa.table({"id": nulls, "n": [4, 5, 6]})), arrow)
    assert status == 400 and [(p["row"], p["field"]) for p in answer["problems"]] == [(2, "id"), (3, "id")], answer
    assert api.post(encode(pa.table({"id": pa.array(["k1"]).dictionary_encode(), "n": [7]})), arrow)[0] == 202
    api.ingest()
    assert [(r["id"], r["n"]) for r in api.table()] == [("k1", 7), ("k2", 3), ("k3", 1)]


def _views(value: bytes, count: int) -> pa.Array:
    """`count` string views of one `value` held once in the data buffer, as a producer may send them."""
    views = np.zeros((count, 4), dtype=np.int32)
    views[:, 0] = len(value)
    views[:, 1] = np.frombuffer(value[:4], dtype=np.int32)[0]  # the prefix; buffer 0, offset 0
    array = pa.Array.from_buffers(pa.string_view(), count, [None, pa.py_buffer(views.tobytes()), pa.py_buffer(value)])
    array.validate(full=True)
    return array


def test_dictionaries_and_views_inside_lists_and_structs_count_expanded_in_the_decode_bound(make_api):
    api = make_api(http={"max_body_bytes": 65536})  # bodies may decode to 8 × 64 KiB = 512 KiB
    arrow = "application/vnd.apache.arrow.stream"
    value = b"x" * 30_000

    def dictionary(count: int) -> pa.Array:
        return pa.DictionaryArray.from_arrays(pa.array(np.zeros(count, dtype=np.int32)), pa.array([value.decode()]))

    def nested(count: int) -> dict[str, pa.Table]:  # each `count` × 30 kB once decoded
        one = pa.array([0, count], pa.int32())
        return {"list<dictionary>": pa.table({"id": [1], "c1": pa.ListArray.from_arrays(one, dictionary(count))}),
                "struct<dictionary>": pa.table({"id": list(range(count)),
                                                "c2": pa.StructArray.from_arrays([dictionary(count)], ["a"])}),
                "list<string_view>": pa.table({"id": [1], "c3": pa.ListArray.from_arrays(one, _views(value, count))}),
                "map<string, dictionary>": pa.table({"id": [1], "c4": pa.MapArray.from_arrays(
                    one, pa.array([str(i) for i in range(count)]), dictionary(count))})}

    for kind, table in nested(40).items():  # 1.2 MB
        body = encode(table)
        assert len(body) < 65536, (kind, len(body))
        status, answer, _ = api.post(body, arrow)
        assert status == 413 and "decodes to more than 8 × 65536 bytes" in answer["error"], (kind, answer)
    assert api.frames() == 0
    for kind, table in nested(4).items():  # 120 kB: counted as decoded, not refused for its shape
        assert api.post(encode(table), arrow)[0] == 202, kind


def test_json_objects_naming_a_key_twice_are_a_400_naming_the_record_and_the_key(make_api):
    """A parser keeps one of the values (Python's json the last): storing it would lose the other silently."""
    api = make_api()
    padded = b",".join(b'{"id": %d, "note": "%s"}' % (i, b"x" * 40) for i in range(1, 40))  # past PAIRS_BYTES
    cases = [
        (b'[{"id": 1}, {"id": 2, "id": 3}]', "application/json", [(2, "id", "'id' twice")]),
        (b"[" + padded + b', {"id": 40, "n": 1, "n": 2}]', "application/json", [(40, "n", "'n' twice")]),
        (b'[{"id": 1, "s": {"a": 1, "b": [{"c": 1, "c": 2}]}}]', "application/json", [(1, "s", "'c' twice")]),
        (b"[" + padded + b', {"id": 40, "s": {"a": 1, "a": 2}}]', "application/json", [(40, "s", "'a' twice")]),
        (b'{"id": 1, "id": 2}', "application/json", [(1, "id", "'id' twice")]),
        (b'{"id": 1}\n{"id": 2, "n": 1, "n": 2}\n', "application/x-ndjson", [(2, "n", "'n' twice")]),
        (b'{"id": 1, "s": {"a": 1, "a": 2}}\nnot json\n', "application/x-ndjson", [(1, "s", "'a' twice"),
                                                                                   (2, None, "invalid JSON")]),
    ]
    for body, kind, expected in cases:
        status, answer, _ = api.post(body, kind)
        found = [(p["row"], p["field"], next((m for *_, m in expected if m in p["message"]), p["message"]))
                 for p in answer.get("problems", [])]
        assert status == 400 and found == expected, (body[-60:], answer)
        assert "send each key once" in answer["problems"][0]["message"]
    assert api.frames() == 0
    # Large bodies whose strings look like members to the count are checked in the parser: taken when right.
    tricky = [{"id": i, "a": ":x", "b": 'say ":" ', "c": "12 : 30", "s": {"k": [{"k": 1}]}} for i in range(40)]
    assert api.post(json.dumps(tricky).encode())[:2][1]["records"] == 40


def test_json_must_be_utf8_and_its_byte_order_mark_is_dropped(make_api):
    """JSON is UTF-8 (RFC 8259 §8.1), as landed JSON files are read; many producers start it with a BOM."""
    api = make_api()
    bom = codecs.BOM_UTF8
    assert api.post(bom + b'[{"id": 1, "code": "a"}]')[0] == 202
    assert api.post(bom + b'{"id": 2, "code": "b"}\n', "application/x-ndjson")[0] == 202
    # Arrow's reader refuses this one (n changes type), so it is read line by line: the BOM is dropped there too.
    assert api.post(bom + b'{"id": 3, "n": 1}\n{"id": 4, "n": "x"}\n', "application/x-ndjson")[0] == 202
    api.ingest()
    assert [(r["id"], r["code"]) for r in api.table()] == [(1, "a"), (2, "b"), (3, None), (4, None)]
    assert "\ufeffid" not in DeltaTable(str(api.cfg.entity("orders").table)).to_pyarrow_table().column_names
    for encoding in ("utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le", "utf-32-be"):
        for text, kind in (('[{"id": 5}]', "application/json"), ('{"id": 5}\n', "application/x-ndjson")):
            status, answer, _ = api.post(text.encode(encoding), kind)
            assert status == 400 and "JSON must be sent as UTF-8" in answer["error"], (encoding, kind, answer)
            assert encoding.split("-")[1] in answer["error"].lower(), answer  # it names what it found
    assert api.frames() == 3


def test_unreadable_webhook_bodies_are_400(make_api):
    api = make_api()
    hooks = Webhooks()
    aside: list[str] = []
    landing = SimpleNamespace(entity="orders", scope=None, set_aside=lambda *args: aside.append(args[1]),
                              deliver=lambda events: len(events))
    hooks.attach(landing, SimpleNamespace(tokens_sha256=(token_hash("t"),)), SimpleNamespace())
    server = HttpServer(api.cfg.http, hooks.routes())
    host, port = server.start().split("://")[1].split(":")
    try:
        for body in (b"[" * 100_000 + b"]" * 100_000, b'{"Records": [{"x": ' + b"9" * 5000 + b"}]}"):
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            conn.request("POST", "/v1/entities/orders/notifications", body, {"Authorization": "Bearer t"})
            resp = conn.getresponse()
            answer = json.loads(resp.read())
            conn.close()
            # The parser may set such a body aside itself (200, "rejected"); what it raises is a 400, never a 500.
            assert (resp.status, answer.get("rejected")) == (200, 1) if aside else \
                resp.status == 400 and "nothing was stored" in answer["error"], answer
            aside.clear()
    finally:
        server.stop()


def _dictionary(indices: list[int | None], values: pa.Array) -> pa.DictionaryArray:
    return pa.DictionaryArray.from_arrays(pa.array(indices, pa.int32()), values)


def test_dictionaries_of_lists_structs_and_views_land_as_their_values(make_api):
    """As a landed file's (batch/read.py conform): any dictionary, at any depth, is only an encoding of its values."""
    api = make_api()
    arrow = "application/vnd.apache.arrow.stream"
    columns = {
        "lists": _dictionary([0, 1, 0, None], pa.array([[1, 2], [3]])),
        "structs": _dictionary([0, 1, 1, 0], pa.array([{"a": 1, "b": "x"}, None])),
        "texts": _dictionary([0, 1, 0, 1], pa.array(["a", None])),  # a null value as well as a null index
        "large": _dictionary([1, 0, 1, 0], pa.array(["l", "m"], pa.large_string())),
        "bytes": _dictionary([0, 0, 1, 1], pa.array([b"\x00", b"\xff"], pa.large_binary())),
        "views": _dictionary([0, 1, 0, 1], pa.array(["v" * 20, "w"], pa.string_view())),
        "in_list": pa.ListArray.from_arrays(pa.array([0, 2, 2, 3, 3]), _dictionary([0, 1, 1], pa.array([[7], []]))),
        "in_struct": pa.StructArray.from_arrays([_dictionary([0, 0, 0, 0], pa.array([{"z": 1.5}]))], ["s"]),
        "in_map": pa.MapArray.from_arrays([0, 1, 1, 2, 2], pa.array(["k", "k"]),
                                          _dictionary([1, 0], pa.array([10, 20]))),
    }
    ids = _dictionary([0, 1, 2, 3], pa.array(["i1", "i2", "i3", "i4"], pa.string_view()))  # the key: its values
    status, answer, _ = api.post(encode(pa.table({"id": ids, **columns})), arrow)
    assert status == 202 and answer["records"] == 4, answer
    api.ingest()
    rows = api.table()
    assert [r["id"] for r in rows] == ["i1", "i2", "i3", "i4"]
    for name, column in columns.items():
        assert [r[name] for r in rows] == column.to_pylist(), name
    # Sent plain, the same values fit the table's columns: the types are those of the values.
    plain = pa.table({"id": ["i5"], **{n: pa.array(c[:1].to_pylist(), decoded(c.type)) for n, c in columns.items()}})
    assert api.post(encode(plain), arrow)[0] == 202
    api.ingest()
    assert api.table()[-1]["lists"] == [1, 2] and api.table()[-1]["structs"] == {"a": 1, "b": "x"}
    # A dictionary of lists is no key: a 400 naming it, as before.
    status, answer, _ = api.post(encode(pa.table({"id": columns["lists"]})), arrow)
    assert status == 400 and [p["field"] for p in answer["problems"]] == ["id"], answer


def test_a_dictionary_that_decodes_past_the_bound_is_413_whatever_its_values_sizes(make_api):
    """One long list among many empty ones: averaged over the dictionary it looks small, taken by every index it
    is 5 GB. Each index counts as the value it takes."""
    api = make_api(http={"max_body_bytes": 1 << 20})  # may decode to 8 MiB
    offsets = np.zeros(100_002, np.int32)
    offsets[1:] = 25_000  # value 0: 25,000 int64s (200 kB), values 1 to 100,000: empty
    values = pa.ListArray.from_arrays(pa.array(offsets), pa.array(np.zeros(25_000, np.int64)))
    column = pa.DictionaryArray.from_arrays(pa.array(np.zeros(25_000, np.int32)), values)
    body = encode(pa.table({"id": np.arange(25_000), "c": column}))
    assert len(body) < 1 << 20
    status, answer, _ = api.post(body, "application/vnd.apache.arrow.stream")
    assert status == 413 and "decodes to more than 8 × 1048576 bytes" in answer["error"], answer
    assert api.frames() == 0


def test_types_delta_has_not_are_stored_as_ones_it_has_or_refused_naming_the_column(make_api):
    """Acknowledged records must be ones the table takes: a type is made one Delta has without losing a value, or
    the request is a 400 naming the column (never a 202 that the commit refuses later)."""
    api = make_api()
    arrow = "application/vnd.apache.arrow.stream"
    half = pa.array([1.5, None], pa.float32()).cast(pa.float16())
    taken = {
        "half": (half, [1.5, None]),
        "dec32": (pa.array([Decimal("1.25"), None], pa.decimal32(5, 2)), [Decimal("1.25"), None]),
        "dec64": (pa.array([Decimal("-2.5"), None], pa.decimal64(12, 2)), [Decimal("-2.5"), None]),
        "dec256": (pa.array([Decimal("9" * 36), None], pa.decimal256(38, 2)), [Decimal("9" * 36), None]),
        "time": (pa.array([1, None], pa.time64("us")), ["00:00:00.000001", None]),  # as CDM's time: text
        "view": (pa.array([[1], None], pa.list_view(pa.int64())), [[1], None]),
        "large_view": (pa.LargeListViewArray.from_arrays(pa.array([1, 0], pa.int64()), pa.array([2, 1], pa.int64()),
                                                         pa.array([7, 8, 9])), [[8, 9], [7]]),  # views out of order
        "nested": (pa.array([[["s"]], [None]], pa.list_(pa.list_(pa.string_view()))), [[["s"]], [None]]),
        "nested_half": (pa.ListArray.from_arrays(pa.array([0, 1, 1], pa.int32()), half[:1]), [[1.5], []]),
    }
    for body in (encode(pa.table({"id": [1, 2], **{n: c for n, (c, _) in taken.items()}})),
                 _parquet_of(pa.table({"id": [3, 4], **{n: c for n, (c, _) in taken.items() if "view" not in n}}))):
        kind = arrow if body[:4] != b"PAR1" else "application/vnd.apache.parquet"
        status, answer, _ = api.post(body, kind)
        assert status == 202, answer
    api.ingest()
    rows = api.table()
    for name, (_, expected) in taken.items():
        assert [r[name] for r in rows[:2]] == expected, name
    assert [r["half"] for r in rows[2:]] == [1.5, None] and rows[2]["time"] == "00:00:00.000001"
    refused = [pa.UnionArray.from_dense(pa.array([0, 1], pa.int8()), pa.array([0, 0], pa.int32()),
                                        [pa.array([1]), pa.array(["x"])]),
               pa.UnionArray.from_sparse(pa.array([0, 1], pa.int8()), [pa.array([1, 2]), pa.array(["x", "y"])]),
               pa.array([1, 2], pa.duration("s")), pa.nulls(2, pa.month_day_nano_interval()),
               pa.array([Decimal(1), None], pa.decimal256(50, 2)), pa.array([{}, {}], pa.struct([])),
               pa.array([[1], [2]], pa.list_(pa.duration("ms")))]
    for column in refused:
        status, answer, _ = api.post(encode(pa.table({"id": [5, 6], "c": column})), arrow)
        assert status == 400 and [p["field"] for p in answer["problems"]] == ["c"], (column.type, answer)
    # Values the stored type cannot hold: a 400 naming the row and column, not one naming neither.
    for column in (pa.array([1000, 1001], pa.timestamp("ns")), pa.array([1, 2**64 - 1], pa.uint64()),
                   pa.array([[1], [2**64 - 1]], pa.list_(pa.uint64()))):
        status, answer, _ = api.post(encode(pa.table({"id": [5, 6], "c": column})), arrow)
        assert status == 400 and [(p["row"], p["field"]) for p in answer["problems"]] == [(2, "c")], answer
    assert api.frames() == 2


def _parquet_of(table: pa.Table) -> bytes:
    out = io.BytesIO()
    pq.write_table(table, out)
    return out.getvalue()


def test_an_empty_batch_of_string_views_is_taken_not_a_500(make_api):
    api = make_api()
    table = pa.table({"id": [1, 2], "s": pa.array(["a", "b"], pa.string_view())})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_batch(table.to_batches()[0].slice(0, 0))  # as a producer flushing an empty buffer sends it
        writer.write_table(table)
    status, answer, _ = api.post(sink.getvalue().to_pybytes(), "application/vnd.apache.arrow.stream")
    assert status == 202 and answer["records"] == 2, answer
