"""A SPARK_HOME whose Python is compiled, made once at set-up: the Python processes Spark starts import pyspark from
it without compiling pyspark's source each time.

Every Python process that Spark starts (the worker daemon and each worker it forks, each streaming source's runner,
each planner of a Python data source) has `$SPARK_HOME/python/lib/pyspark.zip` first on its path, put there by
Spark's JVM. pip's pyspark ships that zip with sources only, and Python cannot cache bytecode inside a zip: each such
process compiled what it imported of pyspark again, 0.6-0.8 s of CPU per process on the 2 cores measured (importing
pyspark's worker modules took 0.97-1.15 s from the zip, 0.35-0.39 s from the installed package), several times at
every start of the daemon and at every new worker.

This home links pip's pyspark `bin/`, `jars/` and `sbin/` and holds the two zips of `python/lib/` again, with the
bytecode of each module beside its source (unchecked hash-based .pyc files, which Python's zip importer reads;
made by the interpreter that runs lakefeed, which is the one Spark's Python processes run, PYSPARK_PYTHON). A session
uses it when SPARK_HOME is not set already; where it is missing, Spark runs from pip's pyspark as before.
"""

from __future__ import annotations

import compileall
import hashlib
import os
import py_compile
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

import pyspark

from lakefeed import log
from lakefeed.ops import jars

_log = log.get(__name__)
_LINKED = ("bin", "jars", "sbin")


def pip_home() -> Path:
    """Where pip put pyspark: the SPARK_HOME pyspark finds by itself."""
    return Path(pyspark.__file__).parent


def path() -> Path:
    """This pyspark's and this interpreter's home (the bytecode is for one Python version)."""
    key = hashlib.sha256("\n".join([pyspark.__version__, sys.implementation.cache_tag, str(pip_home())]).encode())
    return jars.cache_dir() / "spark-home" / key.hexdigest()[:16]


def installed() -> Path | None:
    home = path()
    return home if (home / "python" / "lib" / "pyspark.zip").is_file() else None


def use() -> None:
    """Point this process's Spark at the compiled home, unless SPARK_HOME is set already or it was not made."""
    if "SPARK_HOME" not in os.environ and (home := installed()) is not None:
        os.environ["SPARK_HOME"] = str(home)


def effective() -> str:
    """The SPARK_HOME this process's next session runs from (after `use`)."""
    return os.environ.get("SPARK_HOME") or str(installed() or pip_home())


def make() -> Path | None:
    """Make the home unless it is there, and remove those of other pyspark or Python versions; None if it could not
    be made, which only leaves Spark's Python processes as slow to start as without it."""
    target = path()
    if installed() is not None:
        _log.info("spark.home_cached", home=str(target))
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        _make(target)
    except (OSError, RuntimeError, zipfile.BadZipFile) as exc:
        _log.warning("spark.home_failed", error=str(exc), effect="Spark's Python processes compile pyspark at start")
        return None
    _log.info("spark.home_made", home=str(target))
    for stale in target.parent.iterdir():  # another pyspark's or Python's: nothing starts from it any more
        if stale != target and not stale.name.startswith("tmp"):
            shutil.rmtree(stale, ignore_errors=True)
            _log.info("spark.home_removed", home=str(stale), reason="made for another pyspark or Python")
    return target


def _make(target: Path) -> None:
    with tempfile.TemporaryDirectory(dir=target.parent) as work:
        home = Path(work) / "home"
        home.mkdir()
        for name in _LINKED:
            (home / name).symlink_to(pip_home() / name, target_is_directory=True)
        (home / "python" / "lib").mkdir(parents=True)
        for source in sorted((pip_home() / "python" / "lib").glob("*.zip")):
            _compiled_zip(source, home / "python" / "lib" / source.name, Path(work) / source.stem)
        shutil.rmtree(target, ignore_errors=True)  # a half-made one
        home.rename(target)


def _compiled_zip(source: Path, target: Path, scratch: Path) -> None:
    """`source`'s members, and beside each module its bytecode (`name.pyc`, where the zip importer looks)."""
    with zipfile.ZipFile(source) as zipped:
        zipped.extractall(scratch)
    if not compileall.compile_dir(scratch, quiet=2, legacy=True, workers=1,
                                  invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH):
        raise RuntimeError(f"compiling the modules of {source} failed")
    with zipfile.ZipFile(target, "w", zipfile.ZIP_STORED) as out:
        for file in sorted(scratch.rglob("*")):
            if file.is_file():
                out.write(file, file.relative_to(scratch).as_posix())
