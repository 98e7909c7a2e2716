"""Starting a SparkSession that can run the ``seqlog`` source, and registering the source.

Python workers must import ``spark_ingest`` (the source class is pickled by reference) and
must run the interpreter that has pyarrow, so ``PYSPARK_PYTHON`` defaults to this interpreter
and the directory holding ``spark_ingest`` goes on ``PYTHONPATH`` before the JVM starts (the
JVM and its workers inherit the environment). Spark binds to 127.0.0.1 unless told otherwise:
on a machine whose hostname resolves to another interface it would pick that one.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from pathlib import Path

from pyspark.sql import SparkSession

from spark_ingest.source import SeqlogDataSource

_PACKAGE_ROOT = str(Path(__file__).resolve().parent.parent)


def register(spark: SparkSession) -> None:
    """``spark.read.format("seqlog")`` and ``spark.readStream.format("seqlog")`` from now on."""
    spark.dataSource.register(SeqlogDataSource)


def prepare_environment() -> None:
    """Environment the JVM and the Python workers inherit; call before a session starts."""
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if _PACKAGE_ROOT not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([_PACKAGE_ROOT, *paths])


def local_session(master: str = "local[*]", *, app_name: str = "seqlog-ingest",
                  conf: Mapping[str, str] | None = None) -> SparkSession:
    """A session on ``master`` (local[N] by default) with the source registered.

    Off by default: the web UI and the console progress bar (the ingest job prints its own
    progress). ``conf`` overrides anything."""
    prepare_environment()
    builder = (SparkSession.builder.master(master).appName(app_name)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.sql.session.timeZone", "UTC"))
    if master.startswith("local"):
        builder = (builder.config("spark.driver.host", "127.0.0.1")
                   .config("spark.driver.bindAddress", "127.0.0.1"))
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    register(spark)
    return spark
