"""A task module that the executors of one host cannot import (tests/test_multihost.py: the pre-flight must name that host).

Every namespace of the bed sees the same files, so the module is "missing" on the host whose
SPARK_LOCAL_IP is CONVEYOR_TEST_NO_TASKS_ON (set through spark.executorEnv) by raising what a
missing module raises.
"""

from __future__ import annotations

import os
from typing import Any

if os.environ.get("SPARK_LOCAL_IP") and os.environ.get("SPARK_LOCAL_IP") == os.environ.get("CONVEYOR_TEST_NO_TASKS_ON"):
    raise ModuleNotFoundError("No module named 'preflight_tasks'", name="preflight_tasks")


def double(row: dict[str, Any]) -> dict[str, Any]:
    return {"id": row["id"], "host": "", "rerun_t": None, "started": 0.0}
