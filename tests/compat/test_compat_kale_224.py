"""conveyor.compat.kale follows ndkale 2.2.4: failure counts, re-published retries, should_run_task, QueueInfoBase.

Against real queue servers and real kale worker processes running tests/support/kale_project
(see test_compat_kale.py), and in this process for what needs no worker: `handle_failure`'s
re-publishes read back from a server, the selectors over queue information of a project's own,
`KaleMessage`, the settings set as attributes, and the `test_utils`, `utils` and `timeout` modules.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from conveyor.client.pool import QueuePool
from conveyor.compat.kale import (
    exceptions,
    message,
    publisher,
    queue_info,
    queue_selector,
    settings,
    test_utils,
    timeout,
    utils,
)
from conveyor.constants import H_TASK
from conveyor.tasks.envelope import decode_call
from conveyor.tasks.registry import registry
from conveyor.worker import selectors

from ..support.servers import wait_for
from .test_compat_kale import PROJECT, Project, lines, publish, running_worker, stays

pytestmark = pytest.mark.timeout(90)


def entry_of(msg: Any) -> publisher.KaleEntry:
    """The kale entry (task id, counts) a Conveyor message carries."""
    entry = publisher.KaleEntry.unpack(decode_call(msg.payload, msg.headers).app_data)
    assert entry is not None, "not a kale task's message"
    return entry


def dead_task_ids(pool: QueuePool, queue: str, task_name: str) -> list[Any]:
    """The kale task ids of `queue`'s dead letters of `task_name`."""
    return [entry_of(d.message).task_id for d in pool.dead_letters(queue) if d.message.headers.get(H_TASK) == task_name]


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    with running_worker(tmp_path_factory.mktemp("kale224-out")) as p:
        yield p


# --- with a worker --------------------------------------------------------------------------------
def test_retries_are_decided_on_task_failure_num_and_delayed_on_task_retry_num(project: Project) -> None:
    """Two failures that do not count, then one that does, then the one past max_retries (1): four runs.

    Each retry is a new message (ndkale re-published the task) with the same task id; only the
    last delivery, refused by handle_failure, is a dead letter.
    """
    (task_id,) = publish(project.env, "CountedFailuresTask")
    got = project.wait(lambda: (f := lines(project.out / "counted-failures")) and len(f) >= 4 and f, 20, "4 failures")
    assert [(f["retry_num"], f["failure_num"], f["retried"], f["error"]) for f in got] == [
        (0, 0, True, "ConnectionError"),
        (1, 0, True, "ConnectionError"),
        (2, 0, True, "ValueError"),
        (3, 1, False, "ValueError"),  # failure_num reached max_retries: no retry, whatever retry_num says
    ]
    assert {f["task_id"] for f in got} == {task_id}
    assert len({f["message_id"] for f in got}) == 4  # a new message each retry
    at = [a["at"] for a in lines(project.out / "counted-attempts")]
    waits = [b - a for a, b in itertools.pairwise(at)]
    assert all(w >= d for w, d in zip(waits, [0.2, 0.4, 0.8], strict=True)), waits  # (1 << retry_num) * 0.2 s
    name = "taskworker.tasks.CountedFailuresTask"
    assert project.wait(lambda: dead_task_ids(project.pool, "default", name), 10, "the dead letter") == [task_id]
    assert len(lines(project.out / "counted-failures")) == 4


def test_should_run_task_false_republishes_and_acks(project: Project) -> None:
    publish(project.env, "putoff")
    ran = project.wait(lambda: lines(project.out / "putoff-ran"), 15, "PutOffTask's run")
    asked = lines(project.out / "putoff-asked")
    assert [r["tag"] for r in ran] == ["p1"] and len(asked) == 2
    # re-published as ndkale's worker did: retry_num counts, failure_num does not
    assert lines(project.out / "putoff-republished") == [{"retry_num": 0, "failure_num": 0, "args": ["p1"]}]
    assert ran[0]["at"] - asked[0]["at"] >= 0.2  # _get_delay_sec_for_retry(0)
    assert not dead_task_ids(project.pool, "default", "taskworker.tasks.PutOffTask")


def test_clean_task_environment_is_given_the_exception_before_handle_failure(project: Project) -> None:
    publish(project.env, "cleanup")  # CleanupTask(fail=False), then CleanupTask(fail=True)
    calls = project.wait(lambda: (c := lines(project.out / "cleanup-calls")) and len(c) >= 3 and c, 15, "3 calls")
    assert calls == [
        {"hook": "clean", "keys": ["task_id", "task_name"], "exc": None},  # after a success: no exc, as ndkale
        {"hook": "clean", "keys": ["exc", "task_id", "task_name"], "exc": ["LookupError", "no such row"]},
        {"hook": "handle_failure"},  # ndkale's worker asks handle_failure after the run's clean-up
    ]


def test_handle_failure_retrying_without_republishing_is_retried_by_conveyor(project: Project) -> None:
    """True without a re-publish (written before ndkale 2.x): the same message comes back, its counts rising."""
    (task_id,) = publish(project.env, "NoRepublishTask")
    name = "taskworker.tasks.NoRepublishTask"
    assert project.wait(lambda: dead_task_ids(project.pool, "default", name), 20, "the dead letter") == [task_id]
    got = lines(project.out / "norepublish-failures")
    assert [(f["retry_num"], f["failure_num"]) for f in got] == [(0, 0), (1, 1), (2, 2)]  # max_retries = 2: 3 attempts
    assert len({f["id"] for f in got}) == 1


def test_a_worker_serves_queue_class_names_chosen_over_queue_info_of_the_projects_own(tmp_path: Path) -> None:
    """QUEUE_CLASS names the queues (`_decorate_name`); a selector over a QueueInfoBase subclass picks them.

    The project's selector (HighestPriorityFirst over its own ListedQueues) serves "sla" only: a task
    on "default" waits.
    """
    with running_worker(tmp_path, "taskworker.settings_release") as p:
        publish(p.env, "AfterHangTask")  # queue "sla"
        publish(p.env, "StartupTask")  # queue "default"
        p.wait(lambda: lines(tmp_path / "after-hang"), 15, "the task on the listed queue")
        stays(lambda: not lines(tmp_path / "startup-task"), 1.5, "the task on the unlisted queue waits")
        stats = p.pool.stats()
        assert stats["r7-sla"].acked == 1 and stats["r7-default"].ready == 1
        assert "sla" not in stats and "default" not in stats


# --- in this process --------------------------------------------------------------------------------
@pytest.fixture
def in_project(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.chdir(PROJECT)
    monkeypatch.syspath_prepend(str(PROJECT))
    settings.reload({"KALE_SETTINGS_MODULE": "taskworker.settings"})
    yield
    publisher.reset_pool()
    settings.reload({})


def test_handle_failure_republishes_with_ndkale_counts(in_project: None) -> None:
    from taskworker import tasks

    with QueuePool.local(n_servers=1, durable=False) as pool:
        settings.MESSAGE_QUEUE_ENDPOINT_URL = pool.queues.clients[0].address  # set as on ndkale's settings object
        inst = test_utils.new_mock_task(tasks.FibonacciTask)

        def failed(retry_num: int, failure_num: int) -> message.KaleMessage:
            return test_utils.MockMessage(inst, task_args=[5], app_data={"k": 1}, retry_num=retry_num, failure_num=failure_num)

        cls = tasks.FibonacciTask  # max_retries = 3
        assert cls.handle_failure(failed(2, 1), ValueError("x")) is True
        assert cls.handle_failure(failed(0, 1), ValueError("x"), increment_failure_num=False) is True
        assert cls.handle_failure(failed(5, 3), ValueError("x")) is False  # failure_num at max_retries
        assert cls.handle_failure(failed(0, 0), KeyError("x")) is False  # EXCEPTION_LIST
        got = []
        deadline = time.monotonic() + 10
        while len(got) < 2 and time.monotonic() < deadline:
            got += pool.queues.get("default", 2, wait_s=1.0)
        assert len(got) == 2 and not pool.queues.get("default", 1)  # the refusals published nothing
        by_retry = {entry_of(m).retry_num: m for m in got}
        assert sorted(by_retry) == [1, 3]
        for retry_num, failure_num, delay in [(3, 2, 0.8), (1, 1, 0.2)]:  # (1 << previous retry_num) * 0.2 s
            m = by_retry[retry_num]
            entry, call = entry_of(m), decode_call(m.payload, m.headers)
            assert (entry.failure_num, entry.task_id, entry.app_data) == (failure_num, inst.task_id, {"k": 1})
            # not_before is the publisher's clock + the delay; enqueued_at the server's, a round trip later
            assert call.args == (5,) and delay - 0.5 < m.not_before - m.enqueued_at <= delay + 0.01
        del settings.MESSAGE_QUEUE_ENDPOINT_URL  # as mock.patch leaves: the setting the module had
        assert settings.current().MESSAGE_QUEUE_ENDPOINT_URL == ""


def test_settings_set_on_the_module_are_the_current_settings(in_project: None) -> None:
    assert settings.current().QUEUE_CONFIG == "taskworker/queue_config.yaml"
    with mock.patch.object(settings, "QUEUE_CONFIG", "elsewhere.yaml"):
        assert settings.QUEUE_CONFIG == settings.current().QUEUE_CONFIG == "elsewhere.yaml"
        with pytest.raises(exceptions.ImproperlyConfiguredException, match=r"elsewhere\.yaml"):
            queue_info.QueueInfo()
    assert settings.current().QUEUE_CONFIG == "taskworker/queue_config.yaml"
    settings.MY_FLAG = 1  # a setting of the project's own
    assert settings.current().MY_FLAG == 1
    del settings.MY_FLAG
    with pytest.raises(AttributeError):
        settings.current().MY_FLAG  # noqa: B018 (the read is the test)
    assert settings.ENVIRONMENT_VARIABLE == "KALE_SETTINGS_MODULE"  # the module's own names stay its own


class _StaticInfo(queue_info.QueueInfoBase):
    """Queue information of a project's own: fixed queues, and which have work."""

    def __init__(self, priorities: dict[str, int], with_work: set[str]) -> None:
        self.queues = [queue_info.TaskQueue(name=n, priority=p) for n, p in priorities.items()]
        self.with_work = with_work
        self.probed: list[str] = []

    def get_queues(self) -> list[queue_info.TaskQueue]:
        return list(self.queues)

    def is_queue_empty(self, queue: queue_info.TaskQueue) -> bool:
        self.probed.append(queue.name)
        return queue.name not in self.with_work

    def does_queue_need_work(self, queue: queue_info.TaskQueue) -> bool:
        return not self.is_queue_empty(queue)

    def get_highest_priority_queue_that_needs_work(self) -> queue_info.TaskQueue | None:
        return next((q for q in selectors.by_priority(self.queues) if self.does_queue_need_work(q)), None)


def test_ndkale_selectors_ask_queue_information_of_a_projects_own() -> None:
    base = queue_info.QueueInfoBase()
    for ask in (base.get_queues, base.get_highest_priority_queue_that_needs_work):
        with pytest.raises(NotImplementedError):
            ask()
    with pytest.raises(NotImplementedError):
        queue_selector.SelectQueueBase(base).get_queue()
    prios = {"high": 90, "mid": 50, "low": 5}
    name: Callable[[queue_selector.SelectQueueBase], str | None] = lambda s: getattr(s.get_queue(), "name", None)  # noqa: E731
    assert name(queue_selector.HighestPriorityFirst(_StaticInfo(prios, {"mid", "low"}))) == "mid"
    assert name(queue_selector.HighestPriorityFirst(_StaticInfo(prios, set()))) == "high"  # none has work
    info = _StaticInfo(prios, {"low"})
    # drawn by lottery: the queue with work is found, each queue probed at most once, it the last
    assert name(queue_selector.ReducedLottery(info)) == "low" and info.probed[-1] == "low"
    assert len(info.probed) == len(set(info.probed)) and set(info.probed) <= set(prios)
    assert name(queue_selector.LotteryLottery(_StaticInfo({"only": 10}, {"only"}))) == "only"
    assert name(queue_selector.HighestPriorityLottery(_StaticInfo(prios, {"low"}))) == "low"
    assert name(queue_selector.Random(_StaticInfo({"only": 10}, set()))) == "only"
    assert queue_selector.Lottery._run_lottery(_StaticInfo({"parked": 0, "bad": 101}, set()).get_queues()) is None
    # the worker runs one of the six as Conveyor's own; a subclass of yours through the adapter
    assert type(queue_selector.make_selector(queue_selector.ReducedLottery)) is selectors.ReducedLottery


def test_a_subclass_of_an_ndkale_selector_runs_through_the_adapter(in_project: None) -> None:
    class Drawn(queue_selector.ReducedLottery):
        @staticmethod
        def _run_lottery(queues: Any) -> queue_info.TaskQueue | None:
            return max(queues, key=lambda q: q.name) if queues else None  # "sla" before "default"

    sel = queue_selector.make_selector(Drawn)
    assert isinstance(sel, queue_selector.KaleSelector)
    configs = queue_info.served_configs()
    assert sel.get_queue(configs, {"default"}).name == "default"  # type: ignore[union-attr]
    assert sel.get_queue(configs, {"sla", "default"}).name == "sla"  # type: ignore[union-attr]


def test_queue_class_decorates_the_served_names(in_project: None) -> None:
    from taskworker import queues

    with mock.patch.object(settings, "QUEUE_CLASS", "taskworker.queues.ReleaseQueue"):
        assert queue_info.queue_class() is queues.ReleaseQueue
        assert [c.name for c in queue_info.served_configs()] == ["r7-default", "r7-sla"]
        q = queue_info.QueueInfo().get_queue("sla")
        assert (q.simple_name, q.name, q.dlq_name) == ("sla", "r7-sla", "r7-dlq-sla")
    assert queue_info.queue_class() is queue_info.TaskQueue  # ndkale's default, kale.queue_info.TaskQueue
    with (
        mock.patch.object(settings, "QUEUE_CLASS", "taskworker.queues.NoSuchQueue"),
        pytest.raises(exceptions.ImproperlyConfiguredException, match="QUEUE_CLASS: cannot load"),
    ):
        queue_info.served_configs()


def test_kale_message_as_ndkale_builds_it(in_project: None, monkeypatch: pytest.MonkeyPatch) -> None:
    from taskworker import tasks

    monkeypatch.setattr(message, "_get_current_timestamp", lambda: 123.0)
    msg = message.KaleMessage(task_class=tasks.FibonacciTask, task_id="t1", payload={"args": [3], "kwargs": {}})
    assert (msg.task_name, msg.task_retry_num, msg.task_failure_num, msg._enqueued_time) == (
        "taskworker.tasks.FibonacciTask",
        0,
        0,
        123.0,
    )
    with pytest.raises(AssertionError, match="'args' and 'kwargs'"):
        message.KaleMessage(task_id="t1", payload={"args": []})
    settings.reload({"KALE_SETTINGS_MODULE": "taskworker.settings_tasks"})  # TASK_MAPPER: old.name.Fibonacci
    deleted: list[bool] = []
    body = {"args": [3], "kwargs": {}, "app_data": "a"}
    msg = message.KaleMessage(
        task_name="old.name.Fibonacci",
        task_id="t2",
        payload=body,
        instantiate_task=True,
        delete_func=lambda: deleted.append(True),
    )
    assert isinstance(msg.task_inst, tasks.FibonacciTask) and (msg.task_inst.task_id, msg.task_inst.app_data) == ("t2", "a")
    msg.delete()
    assert deleted == [True]


def test_task_run_and_test_utils_as_ndkale(in_project: None) -> None:
    cleaned: list[dict[str, Any]] = []

    class Recording(test_utils.FailTask):
        @staticmethod
        def _clean_task_environment(**kwargs: Any) -> None:
            cleaned.append(kwargs)

    inst = test_utils.new_mock_task(Recording)
    inst._start_time = 1  # as ndkale's tests: a start long ago
    with pytest.raises(exceptions.TaskException) as e:
        inst.run(1, "a")
    assert cleaned == [{"task_id": "fail_task", "task_name": Recording.task_name, "exc": e.value}]
    assert inst._end_time is not None and inst._task_latency_sec > 0
    alerted: list[bool] = []

    class Slow(test_utils.SlowButNotTooSlowTask):
        def _alert_runtime_exceeded(self, *args: Any, **kwargs: Any) -> None:
            alerted.append(True)

    test_utils.new_mock_task(Slow).run()
    assert alerted == [True]
    assert (
        test_utils.FailTaskNoRetries.handle_failure(test_utils.new_mock_message(test_utils.FailTaskNoRetries), ValueError())
        is False
    )
    assert test_utils.new_mock_message().task_id == "mock_task"
    assert test_utils.TestQueueSelector(queue_info.QueueInfo()).get_queue().simple_name == "default"  # type: ignore[union-attr]
    for cls in (Recording, Slow):
        registry.unregister(cls.task_name)


def test_utils_and_time_limit(in_project: None) -> None:
    assert utils.class_import_from_path("taskworker.tasks.FibonacciTask").__name__ == "FibonacciTask"
    assert utils.class_import_from_path("conveyor.compat.kale.queue_info.TaskQueue._decorate_name").__name__ == "_decorate_name"
    with pytest.raises(AttributeError, match="no_such_module"):  # as ndkale's: its package has no such attribute
        utils.class_import_from_path("taskworker.no_such_module.Class")
    with pytest.raises(ModuleNotFoundError):
        utils.class_import_from_path("no_such_package.Class")
    assert utils.ru_maxrss_mb() > 1
    # in a main thread TimeoutException is raised inside the block, and a timer running before goes on
    fired: list[int] = []
    before = signal.signal(signal.SIGALRM, lambda *a: fired.append(1))
    outer = signal.setitimer(signal.ITIMER_REAL, 0.6)
    try:
        with pytest.raises(exceptions.TimeoutException, match="too slow"), timeout.time_limit(0.1, "too slow"):
            time.sleep(2)
        assert signal.getitimer(signal.ITIMER_REAL)[0] > 0  # the outer timer is running again
        wait_for(lambda: fired, 5, "the outer timer to fire")
        assert fired == [1]
    finally:
        signal.setitimer(signal.ITIMER_REAL, *outer)
        signal.signal(signal.SIGALRM, before)
    # elsewhere it is not armed (the worker bounds thread slots from outside)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        assert ex.submit(lambda: timeout.Alarm(0.1).armed).result(5) is False
