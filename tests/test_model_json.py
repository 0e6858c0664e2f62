"""model.json folders (Azure Synapse Link for Dataverse): read as the CDM SDK reads them, taken once complete,
bound by position per folder, merged by versionnumber."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable

from lakefeed.batch import model_json
from lakefeed.batch.read import read_file
from lakefeed.config import model as config
from lakefeed.connectors.sources.local_dir import LocalDirSource
from lakefeed.inbox.files import Inbox, InboxReader
from tests.conftest import wait_for, write_config

HOST = "https://orgacct.dfs.core.windows.net/dataverse-org"
ACCOUNT = [("Id", "guid"), ("SinkCreatedOn", "dateTime"), ("IsDelete", "boolean"), ("versionnumber", "int64"),
           ("name", "string"), ("revenue", "decimal")]


def _model(folder: str, tables: dict[str, list[tuple[str, str]]]) -> str:
    return json.dumps({"name": "cdm", "description": "cdm", "version": "1.0", "entities": [
        {"$type": "LocalEntity", "name": name, "description": name,
         "attributes": [{"name": n, "dataType": t} for n, t in attributes],
         "partitions": [{"name": "2024", "location": f"{HOST}/{folder}/{name}/2024.csv"}]}
        for name, attributes in tables.items()]})


def _folder(root: Path, folder: str, tables: dict[str, list[tuple[str, str]]], rows: dict[str, str],
            model: bool = True) -> Path:
    for name, text in rows.items():
        (root / folder / name).mkdir(parents=True, exist_ok=True)
        (root / folder / name / "2024.csv").write_text(text)
    if model:
        (root / folder / "model.json").write_text(_model(folder, tables))
    return root / folder


def test_lakefeed_reads_model_json_as_the_cdm_sdk_does(tmp_path):
    from cdm.objectmodel import CdmCorpusDefinition
    from cdm.storage import ADLSAdapter, LocalAdapter

    tables = {"account": ACCOUNT, "contact": [("Id", "guid"), ("fullname", "string"), ("birthdate", "date"),
                                              ("score", "double"), ("visits", "int64"), ("versionnumber", "int64")]}
    folder = _folder(tmp_path, "2024-01-01T10.00.00Z", tables, {"account": "", "contact": ""})

    async def sdk():
        corpus = CdmCorpusDefinition()
        corpus.storage.mount("local", LocalAdapter(str(tmp_path)))
        corpus.storage.mount("adls", ADLSAdapter(hostname="orgacct.dfs.core.windows.net", root="/dataverse-org",
                                                 tenant="t", resource="r", client_id="c", secret="s"))
        corpus.storage.default_namespace = "local"
        manifest = await corpus.fetch_object_async("local:/2024-01-01T10.00.00Z/model.json")
        out = {}
        for e in manifest.entities:
            entity = await corpus.fetch_object_async(e.entity_path, manifest)
            out[e.entity_name] = ([(a.name, a.data_format.name) for a in entity.attributes],
                                  [p.location.removeprefix("adls:/") for p in e.data_partitions])
        return out

    formats = {"GUID": pa.string(), "STRING": pa.string(), "DATE_TIME": pa.timestamp("us", tz="UTC"),
               "BOOLEAN": pa.bool_(), "INT64": pa.int64(), "DECIMAL": pa.decimal128(38, 18), "DATE": pa.date32(),
               "DOUBLE": pa.float64()}
    expected = {name: ([(n, formats[f]) for n, f in attributes], partitions)
                for name, (attributes, partitions) in asyncio.run(sdk()).items()}
    ours = {t.name: (list(t.attributes), list(t.partitions)) for t in model_json.tables_of(folder).values()}
    assert ours == expected and set(ours) == {"account", "contact"}
    assert ours["account"][1] == ["2024-01-01T10.00.00Z/account/2024.csv"]  # the URL's path, past the container


def test_cells_are_bound_by_position_with_the_folder_s_own_attributes(tmp_path):
    folder = _folder(tmp_path, "2024-01-01T10.00.00Z", {"account": ACCOUNT}, {"account": (
        'a1,2024-01-01T10:00:00.0000000Z,False,1,"Contoso, Ltd.",1.5\n'  # quoted delimiter
        'a2,2024-01-01T10:00:00Z,False,2,Fabrikam\n'                      # narrower: revenue null, no shift
        'a3,2024-01-01T10:00:00Z,False,3,"multi\nline",2.5\n'
        'a4,2024-01-01T10:00:00Z,False,4,Wide,1,extra\n'                  # wider than model.json: quarantine
        'a5,2024-01-01T10:00:00Z,False,not-a-number,Bad,1\n')})           # a cell that is not its type
    read = read_file(folder / "account" / "2024.csv", config.ModelJsonFormat(kind="model_json"), None)
    rows = read.table.to_pylist()
    assert [r["Id"] for r in rows] == ["a1", "a2", "a3"]
    assert rows[0]["name"] == "Contoso, Ltd." and str(rows[0]["revenue"]) == "1.500000000000000000"
    assert rows[1]["name"] == "Fabrikam" and rows[1]["revenue"] is None and rows[1]["versionnumber"] == 2
    assert rows[2]["name"] == "multi\nline" and rows[2]["IsDelete"] is False
    assert read.table.schema.field("SinkCreatedOn").type == pa.timestamp("us", tz="UTC")
    assert sorted((b.line, b.reason.split(":")[0]) for b in read.bad) == [
        (5, "7 cells, but model.json names 6 attributes"), (6, "column 'versionnumber'")]  # a3 takes 2 lines


def test_files_of_a_folder_wait_for_its_model_json(tmp_path):
    root = tmp_path / "link"
    root.mkdir()
    inbox = Inbox(tmp_path / "inbox")
    source = LocalDirSource("account", root, inbox, reconcile_interval_s=3600, complete_marker="model.json")
    _folder(root, "2024-01-01T09.00.00Z", {"account": ACCOUNT}, {"account": "a0,,False,1,Zero,1\n"})  # complete
    early = _folder(root, "2024-01-01T10.00.00Z", {"account": ACCOUNT}, {"account": "a1,,False,1,One,1\n"},
                    model=False)
    reader = InboxReader(tmp_path / "inbox")
    try:
        source.start()  # the listing takes the complete folder's file only
        assert [Path(r.path).parent.parent.name for r in reader.records(0, reader.refresh())] == [
            "2024-01-01T09.00.00Z"]
        (early / "model.json").write_text("")  # being written: still not complete
        (early / "account" / "2025.csv").write_text("a2,,False,1,Two,1\n")
        assert source.reconcile() == 0
        (early / "model.json").write_text(_model(early.name, {"account": ACCOUNT}))
        wait_for(lambda: reader.refresh() == 3, 10, what="the folder's files once its model.json is whole")
        assert sorted(Path(r.path).name for r in reader.records(1, 3)) == ["2024.csv", "2025.csv"]
    finally:
        source.stop()
        inbox.close()


def test_the_daemon_takes_a_synapse_link_folder_out_of_order_and_twice(tmp_path):
    from tests.test_daemon_process import Daemon

    root = tmp_path / "landing"
    root.mkdir()
    path = write_config(tmp_path, [{"synapse_root": "landing", "tables": ["account"]}])
    assert [e.name for e in config.load(path).entities] == ["account"]
    daemon = Daemon(path, tmp_path / "daemon.log")
    with_email = [*ACCOUNT, ("email", "string")]
    with daemon:
        daemon.start()
        # The later folder first: it has a column more, updates a1 and deletes a2.
        _folder(root, "2024-01-02T10.00.00Z", {"account": with_email}, {"account": (
            "a1,2024-01-02T10:00:00Z,False,3,Contoso,2.0,info@contoso.example\n"
            "a2,2024-01-02T10:00:00Z,True,4,,,\n")})
        table = tmp_path / "lake" / "account" / "table"

        def rows() -> dict:
            try:
                got = DeltaTable(str(table)).to_pyarrow_table().to_pylist()
            except Exception:
                return {}
            return {r["Id"]: (r["versionnumber"], r["name"], r.get("email")) for r in got}

        wait_for(lambda: rows() == {"a1": (3, "Contoso", "info@contoso.example")}, 90, 0.5, "the later folder")
        # The earlier folder arrives late, narrower: its older versions change nothing, a2 stays deleted.
        earlier = _folder(root, "2024-01-01T10.00.00Z", {"account": ACCOUNT}, {"account": (
            "a1,2024-01-01T10:00:00Z,False,1,Contoso old,1.0\n"
            "a2,2024-01-01T10:00:00Z,False,2,Fabrikam,1.0\n"
            "a3,2024-01-01T10:00:00Z,False,2,Northwind,1.0\n")})
        wait_for(lambda: "a3" in rows(), 90, 0.5, "the earlier folder")
        assert rows() == {"a1": (3, "Contoso", "info@contoso.example"), "a3": (2, "Northwind", None)}
        # Delivered twice: the same files again, with new times.
        again = root / "2024-01-01T10.00.00Z" / "account" / "2024.csv"
        committed = daemon.events("batch.committed")
        copy = again.with_name("copy.tmp")
        shutil.copy(again, copy)
        os.replace(copy, again)
        wait_for(lambda: daemon.events("batch.committed") > committed, 90, 0.5, "the second delivery")
        assert rows() == {"a1": (3, "Contoso", "info@contoso.example"), "a3": (2, "Northwind", None)}
        assert earlier.exists()
        daemon.stop(60)


def test_tables_are_found_with_each_model_json_parsed_once_per_version(tmp_path, monkeypatch):
    """A reload (every data-manifest or config edit) reads only the model.json files that are new or changed."""
    from lakefeed.config import synapse

    for day in (1, 2, 3):
        (tmp_path / f"2024-01-0{day}T00.00.00Z").mkdir()
    _folder(tmp_path, "2024-01-01T00.00.00Z", {"account": ACCOUNT}, {})
    assert synapse.found_tables(tmp_path) == {"account"}
    parsed = []
    loads = synapse.json.loads
    monkeypatch.setattr(synapse.json, "loads", lambda text: parsed.append(1) or loads(text))
    assert synapse.found_tables(tmp_path) == {"account"} and parsed == []
    _folder(tmp_path, "2024-01-02T00.00.00Z", {"contact": ACCOUNT}, {})
    assert synapse.found_tables(tmp_path) == {"account", "contact"} and len(parsed) == 1
    _folder(tmp_path, "2024-01-01T00.00.00Z", {"account": ACCOUNT, "lead": ACCOUNT}, {})  # rewritten
    assert synapse.found_tables(tmp_path) == {"account", "contact", "lead"} and len(parsed) == 2
    (tmp_path / "2024-01-03T00.00.00Z" / "model.json").write_text('{"entities": [')  # being written
    assert synapse.found_tables(tmp_path) == {"account", "contact", "lead"}
