"""Pre-flight: before any work starts on a cluster, check that every executor can do it.

One small Spark job (a task per task slot: on an idle cluster every executor runs one; best effort on
a busy one, or under dynamic allocation before executors are granted) asks each
executor's Python: is conveyor importable, and the driver's version? Are the task modules
importable? Does every queue server answer (TLS certificate accepted, token right)? Every problem
comes back in one `PreflightError` that names each host (its name and the address it reaches the
driver from) and says what to do, instead of a task failing four times with a raw traceback.

The probe is compiled here from source so that it travels to the executors by value: it must run
where conveyor itself cannot be imported, to say so. A success is remembered for PREFLIGHT_TTL_S
per Spark application, servers and task modules, so back-to-back maps pay for it once.
"""

from __future__ import annotations

import logging
import pickle
import time
import uuid
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from conveyor import __version__
from conveyor.constants import DEFAULT_UNREACHABLE_S
from conveyor.errors import ConveyorError, PreflightError
from conveyor.spark.session import conf, task_slots
from conveyor.spark.watch import START_TIMEOUT_S, JobGroup, JobWatch

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from conveyor.client.sharded import ShardedQueues

log = logging.getLogger("conveyor.spark")

PROBE_TIMEOUT_S = 3.0  # an executor's wait for each queue server's answer
PREFLIGHT_TTL_S = 300.0  # a passed check is trusted this long (executors may come and go)
PREFLIGHT_DDL = "host string, python string, problems string"  # problems: one per line (plain columns: a first job
# with an array column costs the executors' JVMs ~1 s of warming up)
REMEDY = {
    "conveyor": "install conveyor on the executors: ship a packed venv with spark.archives (venv-pack; "
    "spark.archives=conveyor-env.tar.gz#env and spark.pyspark.python=./env/bin/python), or put it on a path every "
    "executor sees with spark.executorEnv.PYTHONPATH",
    "module": "ship the task code: sc.addPyFile('tasks.py') (or a .zip of the package), spark.archives with a packed "
    "venv that has it, or spark.executorEnv.PYTHONPATH",
    "server": "the executors must reach the queue servers: check the address (spark.driver.host for servers beside "
    "the driver), firewalls between the hosts, the token and the TLS certificate",
}

_PROBE_SOURCE = """
def make_probe(version, modules, pool_bytes, driver_host, timeout_s):
    def probe(batches):
        import importlib, pickle, socket, struct, sys
        import pyarrow as pa
        for _ in batches:
            pass
        problems = []
        def why(e):  # one line: the problems travel one per line
            return " ".join(f"{type(e).__name__}: {e}".split())
        try:
            import conveyor
        except Exception as e:
            conveyor = None
            problems.append(f"conveyor: conveyor is not importable ({why(e)})")
        if conveyor is not None and getattr(conveyor, "__version__", None) != version:
            problems.append(f"conveyor: conveyor {getattr(conveyor, '__version__', '?')} here, {version} on the driver")
        for name in modules:
            try:
                importlib.import_module(name)
            except Exception as e:
                problems.append(f"module: task module {name!r} is not importable ({why(e)})")
        if conveyor is not None and pool_bytes:
            try:
                clients = pickle.loads(pool_bytes).clients
            except Exception as e:
                clients = []
                problems.append(f"server: the pool could not be read here ({why(e)})")
            for c in clients:
                c.connect_timeout = c.timeout = timeout_s
                try:
                    c.ping()
                except Exception as e:
                    problems.append(f"server: queue server {c.address} does not answer ({why(e)})")
                finally:
                    c.close()
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
                s.connect((driver_host, 9))  # no packet is sent: only the route is looked up
                here = s.getsockname()[0]
        except OSError:
            here = "?"
        host = f"{socket.gethostname()} ({here})"
        # columns from buffers: converting Python objects makes pyarrow import pandas (~0.5 s on a first job)
        def column(text):
            data = text.encode()
            return pa.StringArray.from_buffers(1, pa.py_buffer(struct.pack("<ii", 0, len(data))), pa.py_buffer(data))
        values = [column(host), column(sys.executable), column("\\n".join(problems))]
        yield pa.RecordBatch.from_arrays(values, names=["host", "python", "problems"])
    return probe
"""


_PASSED: dict[tuple[str, tuple[str, ...], tuple[str, ...]], float] = {}


def preflight(
    spark: SparkSession,
    pool: ShardedQueues,
    task_modules: Sequence[str] = (),
    *,
    unreachable_s: float = DEFAULT_UNREACHABLE_S,
    start_timeout_s: float = START_TIMEOUT_S,
) -> None:
    """Check every executor (see the module docstring); raises PreflightError naming each host and what to do.

    The job is watched as a map's: no slot within `start_timeout_s` is a NoSlotsError, a server out
    of the driver's reach for `unreachable_s` a ServerUnreachableError. On local masters the workers
    share this machine (`check_workers_python` covers them); it runs there too.
    """
    app = _app_id(spark)
    key = (app, tuple(pool.addresses), tuple(task_modules))
    if time.monotonic() - _PASSED.get(key, -PREFLIGHT_TTL_S) < PREFLIGHT_TTL_S:
        return
    started = time.monotonic()
    namespace: dict[str, Any] = {"__name__": "conveyor_preflight_probe"}  # not importable: pickled by value
    exec(compile(_PROBE_SOURCE, "<conveyor preflight>", "exec"), namespace)
    host = conf(spark, "spark.driver.host", "127.0.0.1")
    probe = namespace["make_probe"](__version__, list(task_modules), pickle.dumps(pool), host, PROBE_TIMEOUT_S)
    n = max(task_slots(spark), 1)
    group = f"conveyor-preflight-{uuid.uuid4().hex[:12]}"
    try:
        with (
            JobGroup(spark, group, f"conveyor pre-flight: {n} task(s)"),
            JobWatch(spark, pool, group, [], unreachable_s=unreachable_s, start_timeout_s=start_timeout_s),
        ):
            rows = spark.range(n, numPartitions=n).mapInArrow(probe, PREFLIGHT_DDL).collect()
    except ConveyorError:  # the watch's reason: no slot, a server out of reach
        raise
    except Exception as e:
        raise PreflightError(
            f"conveyor pre-flight: the check could not run on the executors: {_first_line(e)}. "
            "Check that Spark's Python workers start there (spark.pyspark.python, PYSPARK_PYTHON)",
            {},
        ) from e
    problems: dict[str, list[str]] = {}
    for r in rows:
        for p in filter(None, r["problems"].split("\n")):
            line = f"{p.partition(': ')[2] or p} [python {r['python']}]"
            if line not in problems.setdefault(r["host"], []):
                problems[r["host"]].append(line)
        problems.setdefault(r["host"], [])
    bad = {h: ps for h, ps in problems.items() if ps}
    if bad:
        kinds = {p.partition(": ")[0] for r in rows for p in filter(None, r["problems"].split("\n"))}
        lines = [f"  - {h}: {'; '.join(ps)}" for h, ps in sorted(bad.items())]
        todo = [f"  * {REMEDY[k]}" for k in ("conveyor", "module", "server") if k in kinds]
        raise PreflightError(
            f"conveyor pre-flight: {len(bad)} of {len(problems)} executor host(s) cannot do the work:\n"
            + "\n".join(lines)
            + "\nWhat to do:\n"
            + "\n".join(todo),
            bad,
        )
    _PASSED[key] = time.monotonic()
    log.info("pre-flight passed on %d host(s) in %.1f s", len(problems), time.monotonic() - started)


def _app_id(spark: SparkSession) -> str:
    try:
        return str(spark.sparkContext.applicationId)
    except Exception:  # Spark Connect
        return str(id(spark))


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[0][:500] if text else type(e).__name__
