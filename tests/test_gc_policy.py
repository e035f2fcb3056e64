"""gc_tuned: a Spark task's collector settings, run in a child process (the freeze it leaves is process-wide)."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.timeout(60)

CHILD = textwrap.dedent(
    """
    import gc, weakref
    from conveyor.gc_policy import GC_THRESHOLDS, gc_tuned

    class Model:
        pass

    before = gc.get_threshold()
    kept = [object() for _ in range(10)]  # alive before the task
    with gc_tuned():
        assert gc.get_threshold() == GC_THRESHOLDS and gc.get_freeze_count() > 0
        model = Model()
        model.me = model  # a reference cycle, as a model's are
        gone = weakref.ref(model)
        left = [Model() for _ in range(1000)]  # alive after the task
        del model
    # the task's cycle collected on the way out, its thresholds put back
    assert gone() is None and gc.get_threshold() == before
    # what is alive stays frozen: a collection after the task (as PySpark's daemon runs) walks none of it
    frozen = gc.get_freeze_count()
    assert frozen >= len(left) + len(kept), frozen
    assert sum(gc.get_count()) < 100 and all(len(gc.get_objects(g)) < 1000 for g in range(3))
    print("ok")
    """
)


def test_a_spark_task_collects_its_cycles_and_leaves_the_worker_frozen() -> None:
    out = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, timeout=50)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
