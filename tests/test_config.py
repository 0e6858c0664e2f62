from __future__ import annotations

import json
from pathlib import Path

import pytest

from lakefeed.config import model as config
from lakefeed.errors import ConfigError
from lakefeed.ops import cli
from tests.conftest import entity_yaml, write_config

REPO = Path(__file__).resolve().parents[1]


def test_embedded_default_config_is_valid_and_resolves_under_var():
    cfg = config.load(REPO / "config" / "lakefeed.yaml")
    assert cfg.lake_dir == REPO / "var" / "lake"
    sales = cfg.entity("sales")
    assert sales.source.path == REPO / "var" / "landing"
    assert sales.table == REPO / "var" / "lake" / "sales" / "table"
    assert sales.checkpoint == REPO / "var" / "state" / "sales" / "checkpoint"


def test_config_is_frozen(tmp_path):
    cfg = config.load(write_config(tmp_path))
    with pytest.raises(Exception, match="frozen"):
        cfg.entities[0].name = "other"  # type: ignore[misc]


def test_every_problem_is_reported_with_file_line_and_field(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text(
        "lake_dir: lake\n"                       # 1
        "spark:\n"                               # 2
        "  trigger_interval_s: -1\n"             # 3
        "entities:\n"                            # 4
        "  - name: sales\n"                      # 5
        "    source:\n"                          # 6
        "      path: landing\n"                  # 7
        "    format:\n"                          # 8
        "      kind: csv\n"                      # 9
        "      delimiter: ';;'\n"                # 10
        "    patterns:\n"                        # 11
        "      - name: p\n"                      # 12
        "        regular_expression: '(['\n"     # 13
        "    colour: blue\n"                     # 14
        "    compaction: {every: -1}\n",         # 15
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        config.load(path)
    problems = info.value.problems
    assert f"{path}:3: spark.trigger_interval_s: Input should be greater than 0" in problems
    assert any(p.startswith(f"{path}:10: entities.0.format.csv.delimiter:") for p in problems), problems
    assert any(p.startswith(f"{path}:12: entities.0.patterns.0:") and "does not compile" in p for p in problems)
    assert any(p.startswith(f"{path}:14: entities.0.colour: Extra inputs are not permitted") for p in problems)
    assert f"{path}:15: entities.0.compaction.every: Input should be greater than or equal to 0" in problems
    assert len(problems) == 5


def test_yaml_syntax_error_names_the_line(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("entities:\n  - name: a\n  bad: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError) as info:
        config.load(path)
    assert info.value.problems[0].startswith(f"{path}:")
    assert "(yaml)" in info.value.problems[0]


def test_landing_folder_must_be_inside_the_cdm_folder(tmp_path):
    path = write_config(tmp_path, [entity_yaml(manifest="elsewhere/default.manifest.cdm.json")])
    with pytest.raises(ConfigError, match="must be the manifest's folder"):
        config.load(path)


def test_the_writer_is_set_lake_wide_or_per_entity_and_picks_the_session_jars(tmp_path):
    from lakefeed.ops.writers import spark_packages

    path = write_config(tmp_path, [entity_yaml(), entity_yaml("other", writer="delta-rs")], writer="delta-spark")
    lake = config.load(path)
    assert [e.writer for e in lake.entities] == ["delta-spark", "delta-rs"]
    assert spark_packages(lake) == ("delta",)
    in_s3 = config.load(write_config(tmp_path, [entity_yaml(writer="delta-spark", table="s3://bucket/sales")]))
    assert spark_packages(in_s3) == ("delta", "s3a")  # hadoop-aws for its s3a:// table
    assert spark_packages(config.load(write_config(tmp_path, [entity_yaml(table="s3://bucket/sales")]))) == ()


def test_duplicate_entity_names_are_rejected(tmp_path):
    with pytest.raises(ConfigError, match="unique: sales"):
        config.load(write_config(tmp_path, [entity_yaml(), entity_yaml()]))


def test_a_keyed_entity_without_primary_key_takes_the_attributes_its_schema_document_marks_as_key(tmp_path):
    from lakefeed.batch.schema import from_entity_document

    landing = tmp_path / "landing"
    (landing / "schemas").mkdir(parents=True)
    manifest = {"manifestName": "default", "entities": [
        {"type": "LocalEntity", "entityName": "account", "entityPath": "schemas/account.cdm.json/account"}]}
    (landing / "default.manifest.cdm.json").write_text(json.dumps(manifest))
    document = landing / "schemas" / "account.cdm.json"
    document.write_text(json.dumps({"definitions": [{"entityName": "account", "hasAttributes": [
        {"name": "accountid", "dataType": "entityId", "purpose": "identifiedBy"},
        {"attributeGroupReference": {"members": [
            {"name": "region", "dataFormat": "String", "purpose": {"purposeReference": "identifiedBy"}},
            {"name": "name", "dataFormat": "String", "purpose": "hasA"}]}}]}]}))

    def load(cdc):
        return config.load(write_config(tmp_path, [entity_yaml("account", cdc=cdc)])).entities[0].cdc

    assert load({"strategy": "upsert"}).primary_key == ("accountid", "region")
    assert load({"strategy": "upsert", "primary_key": ["name"]}).primary_key == ("name",)  # the config's wins
    assert load({}).primary_key == ()  # an append entity has no key
    assert from_entity_document(document, "account").names == ["accountid", "region", "name"]
    document.write_text(json.dumps({"definitions": [{"entityName": "account", "hasAttributes": [{"name": "name"}]}]}))
    with pytest.raises(ConfigError, match="needs primary_key .*marks no attribute `purpose: identifiedBy`"):
        load({"strategy": "upsert"})


def test_validate_command_prints_problems_and_exits_non_zero(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text("entities: []\n", encoding="utf-8")
    assert cli.main(["validate", str(path)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{path}:1: entities:")
    assert cli.main(["validate", str(write_config(tmp_path))]) == 0


def test_config_schema_command_prints_json_schema(capsys):
    assert cli.main(["config", "schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["title"] == "LakefeedConfig"
    assert "entities" in schema["properties"]


def test_shipped_example_configs_are_valid_and_their_manifests_drive_discovery():
    from lakefeed.batch.discovery import Discovery
    from lakefeed.batch.schema import from_entity_document
    from lakefeed.connectors.sinks import cdm_manifest
    from lakefeed.manifests.cdm import schema_document

    cfg = config.load(REPO / "config" / "examples" / "dataverse.yaml")
    account = cfg.entity("account")
    entity = cdm_manifest.find_entity(cdm_manifest.load(account.manifest), "account")
    d = Discovery.from_entity(entity)
    assert d.match("account/2024-03-01/Upserts/7.csv").incremental_type == "Upsert"
    assert d.match("account/2024-03-01/Deletes/1.csv").incremental_type == "Delete"
    assert d.match("account/full/2023.csv").arguments == {"year": ["2023"]}
    schema = from_entity_document(schema_document(account.manifest.parent, entity), "account")
    assert schema.names == ["Id", "name", "revenue", "versionnumber", "SinkModifiedOn", "IsDelete"]


@pytest.mark.parametrize("example", sorted((REPO / "config" / "examples").glob("*.yaml")), ids=lambda p: p.name)
def test_every_example_config_validates(example):
    assert config.load(example).entities


def test_push_sources_store_token_hashes_and_need_a_usable_event_time(tmp_path):
    path = tmp_path / "push.yaml"
    path.write_text(
        "entities:\n"                            # 1
        "  - name: events\n"                     # 2
        "    push:\n"                            # 3
        "      - name: api\n"                    # 4
        "        tokens_sha256: [secret]\n"      # 5
        "  - name: clicks\n"                     # 6
        "    event_time: {source: path, path_pattern: '(x)'}\n"  # 7
        "    push:\n"                            # 8
        "      - name: api\n"                    # 9
        "        tokens_sha256: [" + "a" * 64 + "]\n"  # 10
        "  - name: empty\n",                     # 11
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as info:
        config.load(path)
    problems = info.value.problems
    assert any(p.startswith(f"{path}:5: entities.0.push.0.tokens_sha256:") and "not a token" in p for p in problems)
    assert any(p.startswith(f"{path}:6: entities.1:") and "needs files" in p for p in problems), problems
    assert any(p.startswith(f"{path}:11: entities.2:") and "give the entity a source" in p for p in problems)


def test_default_config_pushes_on_loopback_with_the_documented_dev_token():
    from lakefeed.intake.push_api import token_hash

    cfg = config.load(REPO / "config" / "lakefeed.yaml")
    assert cfg.http.host == "127.0.0.1"
    assert cfg.entity("sales").push[0].tokens_sha256 == (token_hash("dev-token-change-me"),)
    assert "dev-token-change-me" in (REPO / "README.md").read_text()


def test_kafka_sources_take_topics_or_a_pattern(tmp_path):
    kafka = {"name": "t", "bootstrap_servers": "127.0.0.1:9092"}
    entity = {"name": "orders", "kafka": [{**kafka, "topics": ["a"], "pattern": "a.*"}, {**kafka, "name": "u"},
                                          {**kafka, "name": "v", "pattern": "(["},
                                          {**kafka, "name": "w", "topics": ["a"], "min_partitions": 0}]}
    with pytest.raises(ConfigError) as info:
        config.load(write_config(tmp_path, [entity]))
    problems = "\n".join(info.value.problems)
    assert problems.count("give exactly one of topics and pattern") == 2 and "pattern does not compile" in problems
    assert "min_partitions: Input should be greater than 0" in problems
    ok = config.load(write_config(tmp_path, [{"name": "orders", "kafka": [{**kafka, "topics": ["a", "b"]}]}]))
    assert ok.entities[0].streams() == ["t"] and ok.entities[0].source is None
