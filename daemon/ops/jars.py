"""Spark's jars from Maven Central: delta-spark, Spark's own Kafka source and hadoop-aws (s3a://).

They are resolved once, at set-up (`lakefeed jars fetch`, run by `make run` / `make test`), by Spark's own Ivy,
as `spark.jars.packages` would at every start, into a cache beside the venv. A session loads them from that
cache with `spark.jars`: no start resolves anything, so the project works offline after set-up. The
coordinates follow the pip-installed pyspark and delta-spark, as delta's `configure_spark_with_delta_pip` does.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shutil
import sys
from pathlib import Path

import pyspark

from lakefeed import log
from lakefeed.errors import TerminalError

# What a session that writes Delta through delta-spark needs besides the jar (Delta's own quickstart).
DELTA_CONF = {
    "spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension",
    "spark.sql.catalog.spark_catalog": "org.apache.spark.sql.delta.catalog.DeltaCatalog",
}
FETCH = "`lakefeed jars fetch` (.venv/bin/lakefeed in a checkout; it needs Maven Central once)"


def packages() -> dict[str, str]:
    """Each package lakefeed may load, by name: its Maven coordinate for the installed pyspark."""
    spark = pyspark.__version__
    major_minor = ".".join(spark.split(".")[:2])
    return {
        "delta": f"io.delta:delta-spark_{major_minor}_2.13:{importlib.metadata.version('delta-spark')}",
        "kafka": f"org.apache.spark:spark-sql-kafka-0-10_2.13:{spark}",
        "s3a": f"org.apache.hadoop:hadoop-aws:{_hadoop_version()}",
    }


def cache_dir() -> Path:
    return Path(os.environ.get("LAKEFEED_JARS_DIR") or Path(sys.prefix) / "spark-jars")


def fetch() -> None:
    """Resolve every package not yet in the cache (with its dependencies, as Spark's Ivy resolves them)."""
    for name, coordinate in packages().items():
        resolve(name, coordinate)


def resolve(name: str, coordinate: str) -> list[Path]:
    """The jars of one Maven package, from the cache, resolved by Spark's Ivy into it first if not there yet."""
    from pyspark import SparkConf
    from pyspark.java_gateway import launch_gateway

    if (cached := _cached(name, coordinate)) is not None:
        log.get("lakefeed.jars").info("jars.cached", package=coordinate)
        return cached
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    ivy = cache_dir() / name
    gateway = launch_gateway(SparkConf().set("spark.jars.packages", coordinate).set("spark.jars.ivy", str(ivy)))
    try:
        urls = gateway.jvm.System.getProperty("spark.jars") or ""
    finally:
        gateway.shutdown()
        gateway.proc.stdin.close()
        gateway.proc.wait(timeout=60)
    resolved = [Path(url.removeprefix("file://")) for url in urls.split(",") if url]
    if not resolved:
        raise TerminalError(f"Spark's Ivy resolved no jar for {coordinate}; its messages above say why")
    # Ivy names a jar <org>_<artifact>-<version>.jar; pyspark's own copy of one (hadoop-client-*, ...) is
    # loaded first anyway, so it is not shipped twice.
    own = own_jars()
    jars = [jar for jar in resolved if jar.name.partition("_")[2] not in own]
    for unused in set(resolved) - set(jars):
        unused.unlink()
    shutil.rmtree(ivy / "cache", ignore_errors=True)  # Ivy's download cache: the jars are copied out of it
    _listing(name).write_text("\n".join([coordinate, *(str(jar.relative_to(cache_dir())) for jar in jars)]) + "\n")
    log.get("lakefeed.jars").info("jars.fetched", package=coordinate, jars=len(jars))
    return jars


def own_jars() -> dict[str, Path]:
    """The jars pyspark ships, by file name."""
    return {jar.name: jar for jar in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}


def conf(*names: str) -> dict[str, str]:
    """The Spark conf that loads these packages from the cache; one clear error if one is not there."""
    wanted = packages()
    jars: list[str] = []
    for name in names:
        cached = _cached(name, wanted[name])
        if cached is None:
            raise TerminalError(f"Spark jar {wanted[name]} is not in {cache_dir()}: fetch it with {FETCH}")
        jars += [str(jar) for jar in cached]
    extra = DELTA_CONF if "delta" in names else {}
    return {"spark.jars": ",".join(jars), **extra}


def _cached(name: str, coordinate: str) -> list[Path] | None:
    """The package's jars when the cache holds all of them for this very coordinate, else None."""
    listing = _listing(name)
    if not listing.is_file():
        return None
    first, *rest = listing.read_text().split()
    jars = [cache_dir() / jar for jar in rest]
    return jars if first == coordinate and jars and all(jar.is_file() for jar in jars) else None


def _listing(name: str) -> Path:
    return cache_dir() / f"{name}.jars"


def _hadoop_version() -> str:
    """hadoop-aws must be the version of the Hadoop client inside pyspark's own jars."""
    for name in own_jars():
        if match := re.fullmatch(r"hadoop-client-api-(.+)\.jar", name):
            return match.group(1)
    raise TerminalError("pyspark's jars hold no hadoop-client-api: reinstall pyspark (`make setup`)")
