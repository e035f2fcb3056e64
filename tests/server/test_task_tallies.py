"""The metrics' task label: at most N task names labelled, the rest `other`, and no counter ever going down.

`conveyor.server.task_tallies`, driven through many rounds of runs of changing task names, read as
a scrape reads them after each round.
"""

from __future__ import annotations

import random

import pytest

from conveyor.constants import TASK_LABEL_OTHER
from conveyor.protocol.task_pages import TaskState
from conveyor.server.task_tallies import COUNTED, TaskTallies


def test_no_series_goes_down_while_the_labels_change_hands() -> None:
    rng = random.Random(7)
    tallies = TaskTallies(labels=3, tracked=20)
    names = [f"task-{i}" for i in range(30)]  # more than are tracked: the last ones count as other for good
    last: dict[tuple[str, str], float] = {}
    changes = 0
    labelled_before: set[str] = set()
    total = 0
    for _ in range(300):
        for _ in range(rng.randrange(1, 20)):
            # a drifting favourite: now one name runs most, now another
            name = names[min(len(names) - 1, int(rng.expovariate(0.3)) + rng.randrange(0, 25))]
            state = rng.choice((*COUNTED, TaskState.RELEASED))  # a release is no run: not counted
            tallies.count(name, state, rng.random(), n := rng.randrange(1, 4))
            total += n if state is not TaskState.RELEASED else 0
        shown = tallies.labelled()
        assert TASK_LABEL_OTHER in shown and len(shown) <= 4
        labelled = set(shown) - {TASK_LABEL_OTHER}
        changes += labelled != labelled_before
        labelled_before = labelled
        for name, t in shown.items():
            series = {(name, s.value): float(n) for s, n in zip(COUNTED, t.runs, strict=True)}
            series[(name, "seconds_count")] = float(t.seconds.count)
            series[(name, "seconds_sum")] = t.seconds.sum
            for key, v in series.items():
                assert v >= 0 and v >= last.get(key, 0.0) - 1e-9, key  # a name's series restarts only after a gap
                last[key] = v
        for name in {k for k, _ in last} - set(shown):  # a series gone: it may come back from its own count
            for key in [k for k in last if k[0] == name]:
                del last[key]
    assert changes > 3  # the labels did change hands
    # every run is counted once in a series shown now, or was counted in `other` while its name had no label
    shown = tallies.labelled()
    assert sum(sum(t.runs) for t in shown.values()) >= total


def test_a_name_is_labelled_from_its_first_run_while_there_is_room() -> None:
    tallies = TaskTallies(labels=2)
    tallies.count("a", TaskState.ACKED, 0.1)
    tallies.count("b", TaskState.ACKED, 0.1)
    tallies.count("c", TaskState.ACKED, 0.1)
    shown = tallies.labelled()
    assert set(shown) == {"a", "b", TASK_LABEL_OTHER} and shown[TASK_LABEL_OTHER].runs[0] == 1
    assert set(TaskTallies(labels=0).labelled()) == {TASK_LABEL_OTHER}
    tallies.count(TASK_LABEL_OTHER, TaskState.ACKED, 0.1, 50)  # a task named "other" has no label of its own
    assert set(tallies.labelled()) == {"a", "b", TASK_LABEL_OTHER}
    with pytest.raises(ValueError, match="task labels"):
        TaskTallies(labels=-1)
