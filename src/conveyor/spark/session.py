"""The embedded Spark session: one local session, loopback only, quiet, Arrow on.

Every Spark-backed part of Conveyor asks `get_or_create_session` for its session, so a process
holds one JVM whatever mix of features it uses.
"""

from __future__ import annotations

import os
import re
import socket
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from conveyor.errors import ConveyorError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOCK = threading.Lock()

# Settings every embedded session gets. Loopback addresses because the host name may resolve to an
# unreachable address here; Arrow because every Python stage of Conveyor exchanges Arrow batches.
LOCAL_CONF: dict[str, str] = {
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.session.timeZone": "UTC",
    # local mode runs few, large partitions: 200 shuffle partitions would mean 200 tiny tasks
    "spark.sql.shuffle.partitions": "8",
    "spark.python.worker.reuse": "true",
    "spark.log.level": "ERROR",  # quiet from the start (setLogLevel only acts once the JVM is up)
    # The JVM talks to its Python workers over a Unix socket where there are such: over loopback
    # TCP each Python task waited ~40 ms on the exchanges that start and end it (8 tasks that do
    # nothing: 0.26 s on 2 cores; 0.09 s over a Unix socket), paid by every Python task Conveyor runs.
    **({"spark.python.unix.domain.socket.enabled": "true"} if hasattr(socket, "AF_UNIX") else {}),
}

# The driver JVM's default option (not the extra ones: a user's spark.driver.extraJavaOptions
# still apply, after it): the parallel collector, not G1, whose concurrent marking took 0.3-1.1 s
# of CPU per 10 s job on 2 cores (plain Spark's and map's alike; with this, under 0.03 s). Only
# when nothing the JVM's launch reads chooses a collector: two chosen stop it from starting. The
# JIT compilers stay as the JVM has them: with the quick one only, Spark's own work ran up to
# twice as slow (predict_batch_udf 1.3x, TPC-H 1 in Spark SQL 2.2x) for at most 4% on a map.
COLLECTOR_OPTION = "-XX:+UseParallelGC"
_COLLECTOR = re.compile(r"-XX:[+-]Use\w+GC\b")
# where a launch of spark-submit finds JVM options besides the session's settings
_OPTION_ENVS = ("PYSPARK_SUBMIT_ARGS", "SPARK_SUBMIT_OPTS", "JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")
_OPTION_FILES = ("spark-defaults.conf", "java-opts", "spark-env.sh")  # in Spark's conf directory
_SETS_DEFAULT_OPTIONS = re.compile(r"^\s*spark\.driver\.defaultJavaOptions[\s=]", re.M)


def get_or_create_session(
    master: str | None = None,
    app_name: str = "conveyor",
    conf: dict[str, str] | None = None,
) -> SparkSession:
    """Return the active Spark session, or start an embedded local one.

    `master` defaults to `local[*]`. An already active session is returned as is (its master and
    settings are not changed), so a user's own session always wins over the embedded defaults.
    """
    from pyspark.sql import SparkSession

    with _LOCK:
        active = SparkSession.getActiveSession()
        if active is not None:
            return active
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # the Python workers must run the interpreter (and venv) of the driver
        os.environ.setdefault("PYSPARK_PYTHON", _python())
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", _python())
        builder = SparkSession.builder.master(master or "local[*]").appName(app_name)
        conf = conf or {}
        options = driver_java_options(conf)
        settings = {**LOCAL_CONF, **({} if options is None else {"spark.driver.defaultJavaOptions": options}), **conf}
        for key, value in settings.items():
            builder = builder.config(key, value)
        session = builder.getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        return session


def driver_java_options(conf: dict[str, Any]) -> str | None:
    """The embedded driver JVM's default options: `COLLECTOR_OPTION`, or None.

    None where what the launch reads chooses a collector (the session's settings, `_OPTION_ENVS`,
    the files of Spark's conf directory, a --properties-file), or where one of those files sets
    the default options itself: a setting here would override it.
    """
    conf_dir = Path(os.environ.get("SPARK_CONF_DIR") or Path(os.environ.get("SPARK_HOME") or _pyspark_home()) / "conf")
    props = re.findall(r"--properties-file[= ](\S+)", os.environ.get("PYSPARK_SUBMIT_ARGS", ""))
    texts = [_text(f) for f in [*(conf_dir / name for name in _OPTION_FILES), *map(Path, props)]]
    if any(_SETS_DEFAULT_OPTIONS.search(t) for t in texts):
        return None
    seen = " ".join([*texts, *map(str, conf.values()), *(os.environ.get(k, "") for k in _OPTION_ENVS)])
    return None if _COLLECTOR.search(seen) else COLLECTOR_OPTION


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _pyspark_home() -> str:
    import pyspark  # imported already by whoever starts a session

    return os.path.dirname(pyspark.__file__)


def _python() -> str:
    import sys

    return sys.executable


_CHECKED: set[str] = set()


def check_workers_python(spark: SparkSession) -> None:
    """Fail early, with the remedy, when a local session's Python workers cannot import conveyor.

    Spark starts its Python workers with PYSPARK_PYTHON (default `python3` on the PATH), not the
    driver's interpreter: with a venv that is not activated, every task would fail with a wall of
    ModuleNotFoundError traces. Only local masters are checked: there the workers are children of
    this machine's JVM, which has this process's environment. `conveyor.local()` sets it right.
    """
    try:
        master = spark.sparkContext.master
        exe = spark.sparkContext.pythonExec
    except Exception:  # Spark Connect: no SparkContext, and the workers are elsewhere
        return
    assert master is not None  # a SparkContext refuses to start without spark.master
    if master.startswith("local") and exe not in _CHECKED:
        error = workers_python_error(exe)
        if error:
            raise ConveyorError(error)
        _CHECKED.add(exe)


def workers_python_error(exe: str) -> str | None:
    """Why Python workers started as `exe` could not run conveyor's tasks; None if they can."""
    import subprocess

    if os.path.realpath(_which(exe)) == os.path.realpath(_python()):
        return None
    try:
        probe = subprocess.run([exe, "-c", "import conveyor"], capture_output=True, text=True, timeout=60)
        why = None if probe.returncode == 0 else (probe.stderr.strip().splitlines() or ["it did not start"])[-1]
    except OSError as e:
        why = str(e)
    if why is None:
        return None
    return (
        f"Spark's Python workers run {exe!r}, which cannot import conveyor ({why}). Set PYSPARK_PYTHON={_python()} "
        "before the Spark session is created, or use conveyor.local()"
    )


def _which(exe: str) -> str:
    import shutil

    return shutil.which(exe) or exe


def conf(spark: SparkSession, key: str, default: str = "") -> str:
    """A Spark setting, or `default` when it is unset, empty or cannot be read.

    It cannot be read when the session is stopped, or from a Spark Connect server that refuses the
    key. Callers only ever use settings to choose defaults.
    """
    try:
        return str(spark.conf.get(key, default) or default)
    except Exception:
        return default


def task_slots(spark: SparkSession) -> int:
    """The Spark tasks that can run at once now: executors x cores / spark.task.cpus (0: no executor yet).

    Not `defaultParallelism`, which is a setting (Spark's tuning guide suggests 2-3 tasks per core)
    and may promise slots that do not exist. Spark Connect: the setting, or 2.
    """
    try:
        sc: Any = spark.sparkContext._jsc.sc()
        return int(sc.maxNumConcurrentTasks(sc.resourceProfileManager().defaultResourceProfile()))
    except Exception:
        return int(conf(spark, "spark.default.parallelism", "2"))
