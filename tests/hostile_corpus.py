"""The bad-input corpus: what careless producers and unlucky operators send a running daemon.

Data only; tests/test_hostile.py runs every case against one real daemon process (without the
DAC override capability, so file permissions hold as they do for the service user). A case says
what it sends and what must come back: an HTTP status and a phrase of the error, a quarantine
reason, a log event, or a config problem. Whatever a case is, the daemon must still be up and
every record it acknowledged must be in the table after a clean stop and a restart.
"""

from __future__ import annotations

import gzip
import json
import zlib
from dataclasses import dataclass, field
from typing import Any

TOKEN = "hostile-token"
PUSH = "/v1/entities/sales/sources/api/records"


@dataclass(frozen=True)
class Push:
    """A request to the push API; `acked_ids` are the ids a 202 stores."""

    name: str
    body: bytes
    status: int
    says: str = ""  # a phrase of the answer's error (or problems)
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    raw_headers: bytes | None = None  # sent on a raw socket as they are (bytes no client library sends)
    path: str = PUSH
    method: str = "POST"
    token: str | None = TOKEN
    acked_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Landing:
    """Something put in the landing folder (`sales/` holds CSV, `events/` NDJSON)."""

    name: str
    make: str  # how: file, fifo, socket, symlink, mode000, folder, grow
    relative: str | bytes  # below the landing folder; bytes for names that are not UTF-8
    content: bytes = b""
    reason: str | None = None  # a phrase of the quarantine reason; None: nothing quarantined
    ids: tuple[int, ...] = ()  # rows that must land in the table
    link_to: str = ""


@dataclass(frozen=True)
class Manifest:
    """The `fragile` entity's manifest replaced by `document` (None: deleted), then fixed again."""

    name: str
    document: Any
    says: str  # a phrase of the entity.failed error ("" when the entity keeps running)
    land: str = ""  # a file landed for the entity meanwhile (e.g. a name a bad pattern backtracks on)
    appears: str = ""  # when the entity keeps running: a file landed after, which the manifest must list
    unmatched: str = ""  # a phrase of the file.unmatched reason for `land`


@dataclass(frozen=True)
class Config:
    """A config file that `config.load` (what `lakefeed validate` and a reload run) must refuse."""

    name: str
    text: str | bytes  # bytes: not UTF-8
    says: str  # a phrase of one problem, which names `file:line: field`
    line: int


def _rows(*ids: int) -> bytes:
    return json.dumps([{"id": i, "amount": 1.5, "day": "2024-01-01"} for i in ids]).encode()


def _nested(depth: int) -> bytes:
    return b'[{"id": 7, "n": ' + b'{"a": ' * depth + b"1" + b"}" * depth + b"}]"


def _csv(*ids: int, header: str = "id,amount,day") -> bytes:
    return (header + "\n" + "".join(f"{i},2.5,2024-02-0{i % 9 + 1}\n" for i in ids)).encode()


BOMB = gzip.compress(b"[" + b" " * (300 << 20) + b"]", compresslevel=9)  # 300 MB of blanks in ~300 kB

PUSHES = [
    Push("json-array-5000-deep", b"[" * 5000 + b"]" * 5000, 400, "nests too deeply"),
    Push("json-object-5000-deep", _nested(5000), 400, "nests too deeply"),
    Push("lone-surrogate-value", b'[{"id": 1, "day": "\\ud800"}]', 400, "surrogates"),
    Push("lone-surrogate-document", b'"\\ud800"', 400, "JSON array of objects"),
    Push("csv-duplicate-header", b"id,id,day\n1,2,x\n", 400, "appears twice", "text/csv"),
    Push("event-time-year-1-with-offset", _rows(1), 400, "Event-Time",
         headers={"Event-Time": "0001-01-01T00:30:00+01:00"}),
    Push("event-time-year-1-utc", _rows(9001), 202, headers={"Event-Time": "0001-01-01T00:00:00Z"},
         acked_ids=(9001,)),
    Push("event-time-year-9999", _rows(9002), 202, headers={"Event-Time": "9999-12-31T23:59:59Z"},
         acked_ids=(9002,)),
    Push("keys-differing-by-case", b'[{"id": 1, "ID": 2}]', 400, "differ only by case"),
    Push("case-of-a-table-column", b'[{"id": 1, "Amount": 2}]', 400, "differs only by case"),
    Push("internal-column-name", b'[{"id": 1, "__event_time": 2}]', 400, "lakefeed's own"),
    Push("internal-kind-column", b'[{"id": 1, "__kind": "delete"}]', 400, "lakefeed's own"),
    Push("nesting-60-deep", _nested(60), 400, "nests 60 levels"),
    Push("nesting-16-deep-is-fine", _nested(15), 202, acked_ids=(7,)),
    Push("invalid-utf8-ndjson", b'{"id": 1, "day": "\xff\xfe"}\n', 400, "", "application/x-ndjson"),
    Push("invalid-utf8-json", b'[{"id": 1, "day": "\xff"}]', 400, "", "application/json"),
    Push("invalid-utf8-csv", b"id,day\n1,\xff\xfe\n", 400, "", "text/csv"),
    Push("token-with-byte-ff", _rows(1), 401, raw_headers=b"Authorization: Bearer hostile\xfftoken\r\n"),
    Push("nul-in-a-header", _rows(1), 400, raw_headers=b"Authorization: Bearer " + TOKEN.encode()
         + b"\r\nX-Trace: a\x00b\r\n"),
    Push("nul-in-the-token", _rows(1), 400, raw_headers=b"Authorization: Bearer hostile\x00token\r\n"),
    Push("empty-body", b"", 400, "empty"),
    Push("not-json", b"{oops", 400, "not valid JSON"),
    Push("json-scalar", b"5", 400, "JSON array of objects"),
    Push("array-of-numbers", b"[1, 2]", 400, "JSON array of objects"),
    Push("int-beyond-64-bits", b'[{"id": 123456789012345678901234567890}]', 400, "not a valid int64"),
    Push("unknown-content-type", _rows(1), 415, "unsupported Content-Type", "application/xml"),
    Push("no-token", _rows(1), 401, "Bearer", token=None),
    Push("wrong-token", _rows(1), 401, "not valid", token="nope"),
    Push("unknown-entity", _rows(1), 404, "no push source", path="/v1/entities/nobody/sources/api/records"),
    Push("get-on-push-route", b"", 405, method="GET"),
    Push("declared-too-large", b"[]", 413, "larger than", headers={"Content-Length-Override": "1"}),
    Push("gzip-bomb", BOMB, 413, "", headers={"Content-Encoding": "gzip"}),
    Push("deflate-body", zlib.compress(_rows(9003)), 202, headers={"Content-Encoding": "deflate"},
         acked_ids=(9003,)),
    Push("idempotency-key-too-long", _rows(1), 400, "Idempotency-Key", headers={"Idempotency-Key": "k" * 300}),
    Push("event-time-garbage", _rows(1), 400, "Event-Time", headers={"Event-Time": "yesterday"}),
    Push("csv-ragged-rows", b"id,amount\n1,2\n3\n", 400, "columns", "text/csv"),
    Push("parquet-garbage", b"PAR1 not really", 400, "not valid parquet", "application/vnd.apache.parquet"),
    Push("arrow-garbage", b"\xff\xff\xff\xff\x10\x00", 400, "not valid arrow", "application/vnd.apache.arrow.stream"),
    Push("ndjson-bad-line", b'{"id": 1}\n{oops\n', 400, "NDJSON", "application/x-ndjson"),
    Push("empty-column-name", b'[{"id": 1, "": 2}]', 400, "empty"),
    Push("control-char-in-name", b'[{"id": 1, "a\\nb": 2}]', 400, "control character"),
    Push("too-many-columns", json.dumps([{"id": 1, **{f"c{i}": i for i in range(2100)}}]).encode(), 400,
         "limits.max_columns"),
    Push("wrong-type-for-a-column", b'[{"id": 1, "amount": "lots"}]', 400, "amount"),
    Push("empty-array", b"[]", 400, "no records"),
    Push("null-record", b"[null]", 400, "JSON object"),
    Push("a-good-batch", _rows(9004, 9005), 202, acked_ids=(9004, 9005)),
]

LANDINGS = [
    Landing("fifo", "fifo", "sales/pipe.csv", reason="a FIFO, not a regular file"),
    Landing("unix-socket", "socket", "sales/sock.csv", reason="a socket, not a regular file"),
    Landing("symlink-to-etc-passwd", "symlink", "sales/passwd.csv", link_to="/etc/passwd",
            reason="a symbolic link"),
    Landing("mode-000", "mode000", "sales/secret.csv", _csv(1), reason="permission denied"),
    Landing("name-not-utf8", "file", b"sales/bad\xff\xfename.csv", _csv(1), reason="not valid UTF-8"),
    Landing("csv-100k-columns", "file", "sales/wide.csv",
            (",".join(f"c{i}" for i in range(100_000)) + "\n" + ",".join("1" * 100_000) + "\n").encode(),
            reason="limits.max_columns"),
    Landing("csv-line-of-9mb", "file", "sales/long.csv", b"id," + b"x" * (9 << 20) + b"\n1,2\n",
            reason="limits.max_line_bytes"),
    Landing("csv-duplicate-header", "file", "sales/dup.csv", b"id,id,day\n1,2,x\n", reason="appears twice"),
    Landing("csv-case-clash", "file", "sales/case.csv", b"ID,amount\n1,2\n", reason="only by case"),
    Landing("csv-internal-name", "file", "sales/internal.csv", b"id,__order\n1,2\n", reason="lakefeed's own"),
    Landing("csv-binary-garbage", "file", "sales/garbage.csv", bytes(range(256)) * 64, reason="cannot be decoded"),
    Landing("csv-invalid-utf8", "file", "sales/latin1.csv", b"id,amount,day\n1,2,caf\xe9\n",
            reason="cannot be decoded"),
    Landing("a-folder-named-csv", "folder", "sales/folder.csv"),
    Landing("empty-csv", "file", "sales/empty.csv", b""),
    Landing("ndjson-10k-deep", "file", "events/deep.json", b'{"id": 1, "n": ' + b"[" * 100_000 + b"]" * 100_000
            + b"}\n", reason="nest"),
    Landing("ndjson-invalid-utf8", "file", "events/bad.json", b'{"id": 1, "day": "\xff"}\n', reason=""),
    Landing("ndjson-60-deep", "file", "events/deep60.json", _nested(60)[1:-1] + b"\n", reason="nests 60 levels"),
    Landing("a-good-csv", "file", "sales/good.csv", _csv(9101, 9102), ids=(9101, 9102)),
    Landing("a-good-ndjson", "file", "events/good.json", b'{"id": 9201, "day": "x"}\n'),
]

_FRAGILE = {"entityName": "fragile", "entityPath": "fragile.cdm.json/fragile",
            "dataPartitionPatterns": [{"name": "all", "rootLocation": "fragile", "globPattern": "/*.csv"}]}

MANIFESTS = [
    Manifest("entities-is-a-number", {"manifestName": "default", "entities": 5}, "/entities must be a list"),
    Manifest("pattern-is-a-string", {"manifestName": "default", "entities": [{**_FRAGILE,
             "dataPartitionPatterns": ["/*.csv"]}]}, "dataPartitionPatterns/0 must be an object"),
    Manifest("regex-is-a-number", {"manifestName": "default", "entities": [{**_FRAGILE,
             "dataPartitionPatterns": [{"name": "x", "regularExpression": 5}]}]}, "must be a string"),
    Manifest("not-json", "{ oops", "is not valid JSON"),
    Manifest("time-not-iso", {"manifestName": "default", "entities": [{**_FRAGILE, "lastFileModifiedTime": "n/a"}]},
             "lastFileModifiedTime must be an ISO 8601 time"),
    Manifest("nested-too-deep", '{"manifestName": "default", "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
             "is not valid JSON"),
    Manifest("a-list", [1, 2], "must hold a JSON object"),
    Manifest("declaration-deleted", {"manifestName": "default", "entities": []}, "",
             appears="fragile/after-undeclared.csv"),
    Manifest("deleted-while-running", None, "", appears="fragile/after-delete.csv"),
    Manifest("catastrophic-regex", {"manifestName": "default", "entities": [{**_FRAGILE,
             "dataPartitionPatterns": [{"name": "evil", "rootLocation": "fragile",
                                        "regularExpression": "/(a|aa)+\\.csv"}]}]},
             "", land="fragile/" + "a" * 64 + "!.csv", appears="fragile/aaaa.csv", unmatched="time limit"),
]

CONFIGS = [
    Config("yaml-syntax", "lake_dir: x\nentities: [\n", "", 3),
    Config("unknown-field", "entities:\n  - name: a\n    push: [{name: p, tokens_sha256: []}]\n    colour: red\n",
           "colour", 4),
    Config("wrong-type", "entities:\n  - name: a\n    push: [{name: p, tokens_sha256: []}]\n"
           "    limits: {max_nesting: deep}\n", "max_nesting", 4),
    Config("nesting-limit-zero", "entities:\n  - name: a\n    push: [{name: p, tokens_sha256: []}]\n"
           "    limits: {max_nesting: 0}\n", "max_nesting", 4),
    Config("bad-regex", "entities:\n  - name: a\n    source: {type: local_dir, path: x}\n    patterns:\n"
           "      - {name: p, regular_expression: '(unclosed'}\n", "does not compile", 5),
    Config("negative-interval", "entities:\n  - name: a\n    source: {type: local_dir, path: x, "
           "reconcile_interval_s: -1}\n", "reconcile_interval_s", 3),
    Config("token-not-a-hash", "entities:\n  - name: a\n    push: [{name: p, tokens_sha256: [secret]}]\n",
           "SHA-256", 3),
    Config("no-source-at-all", "entities:\n  - name: a\n", "give the entity a source", 2),
    Config("duplicate-key", "entities:\n  - name: a\n    name: b\n    source: {type: local_dir, path: x}\n",
           "'name' is given twice", 3),
    Config("not-utf8", b"lake_dir: x\n# caf\xe9\nentities: []\n", "not UTF-8", 2),
    Config("nested-too-deep", "lake_dir: " + "[" * 5000 + "]" * 5000 + "\n", "nested too deeply", 1),
    Config("empty-source-path", "entities:\n  - name: a\n    source: {type: local_dir, path: }\n",
           "source.local_dir.path", 3),
    Config("timeout-beyond-a-century", "shutdown_timeout_s: 1e10\nentities:\n  - name: a\n"
           "    source: {type: local_dir, path: x}\n", "shutdown_timeout_s", 1),
]
