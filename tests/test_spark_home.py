"""The SPARK_HOME of compiled Python (daemon/ops/spark_home.py): made at set-up, used by the Python processes a
session's Spark starts, left out where SPARK_HOME is the user's."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile

from lakefeed.ops import spark_home

# A session's Python worker and a Python data source's planner: where each imported pyspark from.
PROBE = """
import os
from pyspark.sql.datasource import DataSource, DataSourceReader
from lakefeed.config.model import SparkConfig
from lakefeed.ops import spark

class Where(DataSource):
    @classmethod
    def name(cls):
        return "where"
    def schema(self):
        import pyspark
        return "planned_from string"
    def reader(self, schema):
        return Reader()

class Reader(DataSourceReader):
    def read(self, partition):
        import pyspark
        yield (pyspark.__file__,)

session = spark.session(SparkConfig())
session.dataSource.register(Where)
worker = session.sparkContext.parallelize([0], 1).map(lambda _: __import__("pyspark").__file__).collect()[0]
print(os.environ["SPARK_HOME"])
print(worker)
print(session.read.format("where").load().collect()[0][0])
"""


def _probe(env: dict[str, str]) -> list[str]:
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, check=False,
                         env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    return run.stdout.split()


def test_set_up_made_the_home_with_bytecode_beside_every_module():
    home = spark_home.installed()
    assert home is not None and home == spark_home.path()  # `lakefeed jars fetch` made it
    for name in ("bin", "jars", "sbin"):
        assert (home / name).resolve() == (spark_home.pip_home() / name).resolve()
    for zipped in ("pyspark.zip", "py4j-0.10.9.9-src.zip"):
        with zipfile.ZipFile(home / "python" / "lib" / zipped) as z:
            names = set(z.namelist())
        modules = {n for n in names if n.endswith(".py")}
        assert modules and {m + "c" for m in modules} <= names, zipped


def test_a_new_home_replaces_those_of_other_versions(tmp_path, monkeypatch):
    monkeypatch.setenv("LAKEFEED_JARS_DIR", str(tmp_path))
    stale = tmp_path / "spark-home" / "0123456789abcdef"  # an earlier pyspark's
    (stale / "python" / "lib").mkdir(parents=True)
    (stale / "python" / "lib" / "pyspark.zip").write_bytes(b"old")
    made = spark_home.make()
    assert made == spark_home.path() and made.parent == tmp_path / "spark-home"
    assert spark_home.installed() == made
    assert sorted(p.name for p in made.parent.iterdir()) == [made.name]
    assert spark_home.make() == made  # made once: the second call finds it


def test_spark_python_processes_import_pyspark_compiled_from_it():
    env = {k: v for k, v in os.environ.items() if k != "SPARK_HOME"}
    home, worker, read = _probe(env)
    assert home == str(spark_home.path())
    zipped = f"{home}/python/lib/pyspark.zip/pyspark/__init__.pyc"
    assert worker == read == zipped  # the bytecode, not the source compiled again


def test_a_spark_home_of_the_users_own_is_left_as_it_is():
    pip_home = str(spark_home.pip_home())
    home, worker, read = _probe({**os.environ, "SPARK_HOME": pip_home})
    assert home == pip_home
    assert worker == read == f"{pip_home}/python/lib/pyspark.zip/pyspark/__init__.py"
