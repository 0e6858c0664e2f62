"""Spark's jars from Maven Central, resolved at set-up (`make test` ran `lakefeed jars fetch`), loaded offline."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid

import pytest
from delta.pip_utils import configure_spark_with_delta_pip
from pyspark.sql import SparkSession

from lakefeed.errors import TerminalError
from lakefeed.ops import jars
from tests import kafka_broker as broker_fixtures
from tests import s3_server

kafka_broker = broker_fixtures.kafka_broker  # the module-scoped broker fixture, visible to pytest here


@pytest.fixture(scope="module")
def moto():
    with s3_server.running() as server:
        yield server


def test_the_delta_coordinate_is_the_one_delta_pip_utils_names():
    builder = configure_spark_with_delta_pip(SparkSession.builder)
    assert builder._options["spark.jars.packages"] == jars.packages()["delta"]


def test_a_jar_missing_from_the_cache_is_one_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEFEED_JARS_DIR", str(tmp_path))
    with pytest.raises(TerminalError, match=r"io\.delta:delta-spark_4\.\d+_2\.13:\S+ is not in .*lakefeed jars fetch"):
        jars.conf("delta")
    # A listing whose jar was deleted since is no cache either.
    coordinate = jars.packages()["kafka"]
    (tmp_path / "kafka").mkdir()
    (tmp_path / "kafka" / "present.jar").write_bytes(b"PK")
    (tmp_path / "kafka.jars").write_text(f"{coordinate}\nkafka/present.jar\nkafka/gone.jar\n")
    with pytest.raises(TerminalError, match=r"spark-sql-kafka.* is not in"):
        jars.conf("kafka")
    (tmp_path / "kafka.jars").write_text(f"{coordinate}\nkafka/present.jar\n")
    assert jars.conf("kafka") == {"spark.jars": str(tmp_path / "kafka" / "present.jar")}



# One Spark of its own (the suite's session has no jars), started as the daemon starts its session, with every
# package: from the cache alone, delta-spark appends and MERGEs a local table, and Spark's own Kafka source reads
# a topic of the test broker. Then the daemon's own path to delta-spark tables in S3: the config's storage
# (endpoint, keys) handed to Hadoop's s3a for the tables' bucket alone, on a session with no s3a settings of its
# own; tasks' files committed through Delta's transaction; every commit read back by delta-rs.
PROBE = """
import json, sys
import pyarrow as pa
from deltalake import DeltaTable
from lakefeed.batch.cdc import KIND, MergePlan
from lakefeed.config import model
from lakefeed.connectors.sinks import data_files
from lakefeed.inbox.storage import Storage
from lakefeed.ops import spark, writers
from lakefeed.pipeline.sinks import Sinks

args = json.loads(sys.argv[1])
lake = model.load(args["config"])
session = spark.session(lake.spark, packages=(*writers.spark_packages(lake), "kafka"))
out = {"packages": writers.spark_packages(lake), "ivy": session.conf.get("spark.jars.packages", ""),
       "s3a_conf": sorted(k for k, _ in session.sparkContext.getConf().getAll()
                          if "s3a" in k and any(w in k for w in ("endpoint", "key", "credentials", "bucket")))}

from delta.tables import DeltaTable as SparkDeltaTable
session.createDataFrame([(1, "a"), (2, "b")], "id long, v string").write.format("delta").save(args["local"])
change = session.createDataFrame([(2, "B"), (3, "c")], "id long, v string")
(SparkDeltaTable.forPath(session, args["local"]).alias("t").merge(change.alias("c"), "t.id = c.id")
 .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
out["local"] = sorted(tuple(r) for r in session.read.format("delta").load(args["local"]).collect())
topic = session.read.format("kafka").option("kafka.bootstrap.servers", args["kafka"]) \\
    .option("subscribe", args["topic"]).load()
out["kafka"] = sorted(bytes(r.value).decode() for r in topic.collect())

accounts, events = lake.entities
keyed = Sinks.of(accounts, session)
plan = MergePlan(keys=("id",), sequence=(), compare=("v",), snapshot=False, insert_updates_of_absent=False)
keyed.table.merge(pa.table({"id": [1, 2], "v": ["a", "b"], KIND: ["upsert", "upsert"]}), plan, "app", 0, {"n": "0"})
version = keyed.table.merge(pa.table({"id": [2, 3], "v": ["B", "c"], KIND: ["delete", "upsert"]}), plan, "app", 1,
                            {"n": "1"})
out["changes"] = sorted((r["id"], r["_change_type"]) for r in keyed.table.changes(version).to_pylist())
appended = Sinks.of(events, session)
storage = Storage(events.storage)
fs, root = storage.fs_of(events.table)
first = pa.table({"id": [1, 2]})
appended.table.commit_files(data_files.write(fs, root, first, "part-b0-"), first.schema, "app", 0, {})
appended.changelog.append(pa.table({"offset": [0, 1], "id": [1, 2]}), "app", 0, {"lakefeed.batch_id": "0"})
for name, cfg in (("accounts", accounts), ("events", events)):
    table = DeltaTable(str(cfg.table), storage_options=storage.delta_options(cfg.table))
    out[name] = sorted(tuple(r.values()) for r in table.to_pyarrow_table().to_pylist())
    out[name + "_engines"] = sorted({c.get("engineInfo", "").split(" ")[-1].split("/")[0] for c in table.history()})
    out[name + "_txn"] = table.transaction_version("app")
print(json.dumps(out))
"""


def test_the_cached_jars_load_offline_and_the_delta_spark_writer_works_in_s3(moto, kafka_broker, tmp_path):
    from tests.conftest import entity_yaml, write_config

    moto.client("s3").create_bucket(Bucket="lake")
    topic = kafka_broker.create_topic(f"jars-{uuid.uuid4().hex[:8]}", 2)
    for n in range(5):  # a batch each: tansu gives a partition's end offset as its last batch's base offset + 1
        kafka_broker.produce(topic, [{"n": n}], partition=n % 2)
    keyed = entity_yaml("accounts", cdc={"strategy": "upsert", "primary_key": ["id"]})
    config = write_config(tmp_path, [keyed, entity_yaml("events")], lake_dir="s3://lake/tables", writer="delta-spark",
                          storage={"endpoint_override": moto.endpoint, "region": moto.region,
                                   "access_key_id": "AKIDCONFIG", "secret_access_key": "from-the-config"})
    args = {"config": str(config), "local": str(tmp_path / "table"), "kafka": kafka_broker.bootstrap, "topic": topic}
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True,
                         timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["ivy"] == ""  # loaded from the cache: nothing asks Ivy at start
    assert out["local"] == [[1, "a"], [2, "B"], [3, "c"]]
    assert (tmp_path / "table" / "_delta_log").is_dir()
    assert out["kafka"] == sorted(json.dumps({"n": n}) for n in range(5))
    assert out["packages"] == ["delta", "s3a"] and out["s3a_conf"] == []  # only the writer's session knows the bucket
    assert out["changes"] == [[2, "delete"], [3, "insert"]]
    assert out["accounts"] == [[1, "a"], [3, "c"]] and out["accounts_txn"] == 1
    assert out["events"] == [[1], [2]] and out["events_txn"] == 0
    assert out["accounts_engines"] == out["events_engines"] == ["Delta-Lake"]  # delta-spark wrote every commit
