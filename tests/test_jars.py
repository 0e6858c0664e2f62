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

# A Spark of its own (the suite's session has no jars): delta-spark appends and MERGEs on local files and on
# s3a:// (moto), and Spark's own Kafka source reads a topic of the test broker.
PROBE = """
import json, sys
from delta.tables import DeltaTable
from pyspark.sql import SparkSession
from lakefeed.ops import jars

args = json.loads(sys.argv[1])
conf = {**jars.conf("delta", "kafka", "s3a"), "spark.ui.enabled": "false", "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1", "spark.hadoop.fs.s3a.endpoint": args["s3"],
        "spark.hadoop.fs.s3a.path.style.access": "true", "spark.hadoop.fs.s3a.access.key": "testing",
        "spark.hadoop.fs.s3a.secret.key": "testing", "spark.hadoop.fs.s3a.endpoint.region": "us-east-1",
        "spark.hadoop.fs.s3a.aws.credentials.provider":
            "org.apache.hadoop.fs.s3a.SimpleAWSCredentialsProvider"}
builder = SparkSession.builder.master("local[1]")
for key, value in conf.items():
    builder = builder.config(key, value)
spark = builder.getOrCreate()
out = {"packages": spark.conf.get("spark.jars.packages", "")}
for name, path in (("local", args["local"]), ("s3a", "s3a://lake/t")):
    spark.createDataFrame([(1, "a"), (2, "b")], "id long, v string").write.format("delta").save(path)
    change = spark.createDataFrame([(2, "B"), (3, "c")], "id long, v string")
    (DeltaTable.forPath(spark, path).alias("t").merge(change.alias("c"), "t.id = c.id")
     .whenMatchedUpdateAll().whenNotMatchedInsertAll().execute())
    out[name] = sorted(tuple(r) for r in spark.read.format("delta").load(path).collect())
topic = spark.read.format("kafka").option("kafka.bootstrap.servers", args["kafka"]) \\
    .option("subscribe", args["topic"]).load()
out["kafka"] = sorted(bytes(r.value).decode() for r in topic.collect())
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def moto():
    with s3_server.running() as server:
        yield server


def test_the_cached_jars_append_merge_on_s3a_and_read_kafka_with_no_resolution(moto, kafka_broker, tmp_path):
    moto.client("s3").create_bucket(Bucket="lake")
    topic = kafka_broker.create_topic(f"jars-{uuid.uuid4().hex[:8]}", 2)
    for n in range(5):  # a batch each: tansu gives a partition's end offset as its last batch's base offset + 1
        kafka_broker.produce(topic, [{"n": n}], partition=n % 2)
    args = {"local": str(tmp_path / "table"), "s3": moto.endpoint, "kafka": kafka_broker.bootstrap, "topic": topic}
    run = subprocess.run([sys.executable, "-c", PROBE, json.dumps(args)], capture_output=True, text=True,
                         timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["packages"] == ""  # loaded from the cache: nothing asks Ivy at start
    merged = [[1, "a"], [2, "B"], [3, "c"]]
    assert out["local"] == merged
    assert out["s3a"] == merged
    assert out["kafka"] == sorted(json.dumps({"n": n}) for n in range(5))
    assert (tmp_path / "table" / "_delta_log").is_dir()


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



# The daemon's own path to a delta-spark table in S3: the config's storage (endpoint, keys) handed to Hadoop's
# s3a for the tables' bucket alone, on a session with no s3a settings of its own; tasks' files committed through
# Delta's transaction; every commit read back by delta-rs.
SINK_PROBE = """
import json, sys
import pyarrow as pa
from deltalake import DeltaTable
from lakefeed.batch.cdc import KIND, MergePlan
from lakefeed.config import model
from lakefeed.connectors.sinks import data_files
from lakefeed.inbox.storage import Storage
from lakefeed.ops import spark, writers
from lakefeed.pipeline.sinks import Sinks

lake = model.load(sys.argv[1])
session = spark.session(lake.spark, packages=writers.spark_packages(lake))
accounts, events = lake.entities
out = {"packages": writers.spark_packages(lake),
       "s3a_conf": sorted(k for k, _ in session.sparkContext.getConf().getAll()
                          if "s3a" in k and any(w in k for w in ("endpoint", "key", "credentials", "bucket")))}
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


def test_the_delta_spark_writer_merges_appends_and_commits_task_files_in_s3(moto, tmp_path):
    from tests.conftest import entity_yaml, write_config

    moto.client("s3").create_bucket(Bucket="lake")
    keyed = entity_yaml("accounts", cdc={"strategy": "upsert", "primary_key": ["id"]})
    config = write_config(tmp_path, [keyed, entity_yaml("events")], lake_dir="s3://lake/tables", writer="delta-spark",
                          storage={"endpoint_override": moto.endpoint, "region": moto.region,
                                   "access_key_id": "AKIDCONFIG", "secret_access_key": "from-the-config"})
    run = subprocess.run([sys.executable, "-c", SINK_PROBE, str(config)], capture_output=True, text=True,
                         timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.splitlines()[-1])
    assert out["packages"] == ["delta", "s3a"] and out["s3a_conf"] == []  # only the writer's session knows the bucket
    assert out["changes"] == [[2, "delete"], [3, "insert"]]
    assert out["accounts"] == [[1, "a"], [3, "c"]] and out["accounts_txn"] == 1
    assert out["events"] == [[1], [2]] and out["events_txn"] == 0
    assert out["accounts_engines"] == out["events_engines"] == ["Delta-Lake"]  # delta-spark wrote every commit
