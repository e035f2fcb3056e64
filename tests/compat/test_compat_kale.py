"""conveyor.compat.kale: an ndkale-style project run with only its import lines changed.

The project is tests/support/kale_project (taskworker/ tasks, settings, queue YAML; publisher.py,
worker.py), run against real queue servers and a real worker process.

ndkale's `Task` is `conveyor.compat.kale.task`; what its `handle_failure` is given,
`conveyor.compat.kale.message`.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import pickle
import platform
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conveyor.client.pool import QueuePool
from conveyor.compat.kale import exceptions, publisher, queue_info, queue_selector, settings, worker
from conveyor.errors import ConfigError, TaskError, TaskOptionError, UnknownTaskError
from conveyor.tasks.publish import build_message
from conveyor.tasks.registry import Registry, registry
from conveyor.tasks.runner import run_message

from ..support.servers import wait_for

pytestmark = pytest.mark.timeout(90)

PROJECT = Path(__file__).parents[1] / "support" / "kale_project"


def env_for(endpoint: str, out: Path, settings_module: str = "taskworker.settings") -> dict[str, str]:
    src = str(Path(__file__).parents[2] / "src")
    return {
        **os.environ,
        "KALE_SETTINGS_MODULE": settings_module,
        "KALE_TEST_ENDPOINT": endpoint,
        "KALE_TEST_OUT": str(out),
        "PYTHONPATH": os.pathsep.join([str(PROJECT), src]),
    }


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def stays(cond: Callable[[], bool], seconds: float, what: str) -> None:
    """Assert `cond` holds throughout the next `seconds` (polled until the deadline)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        assert cond(), what
        time.sleep(0.05)
    assert cond(), what


@dataclass
class Project:
    env: dict[str, str]
    out: Path
    proc: subprocess.Popen[bytes]
    pool: QueuePool

    def wait(self, cond: Callable[[], Any], timeout: float, what: str) -> Any:
        """`wait_for` the worker's output, failing at once with its exit status and output if it has ended."""
        got = wait_for(lambda: cond() or self.proc.poll() is not None, timeout, what)
        status = self.proc.poll()
        if status is not None and not cond():
            log = (self.out / "worker.log").read_text(errors="replace")
            raise AssertionError(f"the worker ended (status {status}) before {what}; its output:\n{log}")
        return got


@contextlib.contextmanager
def running_worker(out: Path, settings_module: str = "taskworker.settings") -> Iterator[Project]:
    """One server and one kale worker process, stopped by SIGTERM to its whole group.

    The worker is `python worker.py` in the project directory, in a process group of its own; the
    SIGTERM to its whole group is how systemd stops a service.
    """
    with QueuePool.local(n_servers=1) as pool, open(out / "worker.log", "wb") as log:
        env = env_for(",".join(c.address for c in pool.queues.clients), out, settings_module)
        proc = subprocess.Popen(
            [sys.executable, "worker.py"], cwd=PROJECT, env=env, start_new_session=True, stdout=log, stderr=subprocess.STDOUT
        )
        try:
            wait_for(lambda: (out / "worker-started").exists() or proc.poll() is not None, 30, "the worker to start")
            assert proc.poll() is None, "the worker exited as it started"
            yield Project(env, out, proc, pool)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)  # graceful: running tasks finish, ON_WORKER_SHUTDOWN runs
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Project]:
    out = tmp_path_factory.mktemp("kale-out")
    with running_worker(out) as p:
        yield p
    assert lines(out / "worker-stopped")  # ON_WORKER_SHUTDOWN ran (in the task process)


def publish(env: dict[str, str], what: str) -> list[str]:
    done = subprocess.run(
        [sys.executable, "publisher.py", what], cwd=PROJECT, env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


def test_tasks_run_with_any_app_data_and_delay_sec_delays(project: Project) -> None:
    env, out = project.env, project.out
    published = time.time()
    ids = publish(env, "fib")
    assert ids[0].startswith("FibonacciTask_uuid_")
    first = project.wait(lambda: lines(out / "fib-10"), 15, "fib(10)")[0]
    assert first["value"] == 55 and first["app_data"] == [3, 4] and first["task_id"] == ids[0] and first["pre_ran"]
    assert project.wait(lambda: lines(out / "post-10"), 5, "_post_run")  # the hook after run_task
    delayed = project.wait(lambda: lines(out / "fib-7"), 15, "fib(7)")[0]
    assert delayed["value"] == 13 and delayed["app_data"] == "a string"
    assert delayed["kwargs"] == {"delay_sec": 2}  # run_task takes **kwargs: it sees delay_sec, as in ndkale
    assert delayed["at"] - published >= 2  # the delay is honoured
    assert first["at"] < delayed["at"]


def test_failures_retry_per_max_retries_and_exception_list(project: Project) -> None:
    env, out = project.env, project.out
    ids = publish(env, "flaky")
    got = project.wait(lambda: (f := lines(out / "flaky-failures")) and len(f) >= 3 and f, 20, "3 attempts of FlakyTask")
    assert [(f["retry_num"], f["retried"]) for f in got] == [(0, True), (1, True), (2, False)]  # max_retries = 2
    assert {f["task_id"] for f in got} == {ids[0]} and got[0]["error"] == "flaky f1"
    cleaned = project.wait(lambda: (c := lines(out / "flaky-cleanup")) and len(c) >= 3 and c, 10, "3 cleanups of FlakyTask")
    assert len(cleaned) == 3 and "ValueError" in cleaned[0]["exc"] and cleaned[0]["task_name"] == "taskworker.tasks.FlakyTask"
    black = project.wait(lambda: lines(out / "blacklisted-failures"), 10, "BlacklistedTask's failure")
    assert black == [{"retry_num": 0, "retried": False}]  # KeyError is in EXCEPTION_LIST: never retried
    # past the next backoff ((1 << 2) * 0.2 s), still no 4th attempt
    stays(
        lambda: len(lines(out / "flaky-failures")) == 3 and len(lines(out / "blacklisted-failures")) == 1,
        1.5,
        "no attempt past max_retries or EXCEPTION_LIST",
    )


def test_handle_failure_returning_false_fails_at_once(project: Project) -> None:
    env, out = project.env, project.out
    publish(env, "GiveUpTask")  # max_retries = 3, but handle_failure says no
    project.wait(lambda: lines(out / "giveup-attempts"), 15, "GiveUpTask's attempt")
    stays(lambda: len(lines(out / "giveup-attempts")) == 1, 1.5, "one attempt only (a retry would come after 0.2 s)")


def test_retry_delay_is_the_task_classes_get_delay_sec_for_retry(project: Project) -> None:
    env, out = project.env, project.out
    publish(env, "DelayOverrideTask")
    got = project.wait(lambda: (a := lines(out / "delay-attempts")) and len(a) >= 2 and a, 15, "DelayOverrideTask's retry")
    assert lines(out / "delay-asked") == [{"retry_num": 0}]  # asked once: the retry (max_retries = 1)
    assert got[1]["at"] - got[0]["at"] >= 1.5  # its delay, not the settings' (1 << 0) * 0.2 s


def test_on_worker_startup_runs_in_the_process_that_runs_tasks(project: Project) -> None:
    env, out = project.env, project.out
    publish(env, "StartupTask")
    ran = project.wait(lambda: lines(out / "startup-task"), 15, "StartupTask")[0]
    assert ran["ready"] is True  # what ON_WORKER_STARTUP set up (django.setup(), a database pool) is there
    # it ran in the task process (which then ran the task), and in the worker's own process
    assert {"pid": ran["pid"], "worker": False} in lines(out / "worker-started") and ran["pid"] != project.proc.pid
    assert {"pid": project.proc.pid, "worker": True} in lines(out / "worker-started")


def test_time_limit_ends_before_handle_failure(project: Project) -> None:
    env, out = project.env, project.out
    publish(env, "SlowFailureTask")  # fails at 0.7 s of its 1 s limit; handle_failure takes 3 s more
    assert project.wait(lambda: lines(out / "slowfailure-handled"), 15, "handle_failure to finish") == [{"error": "ValueError"}]
    stays(lambda: len(lines(out / "slowfailure-handled")) == 1, 2.0, "one attempt: not stopped from outside, not retried")


def test_hung_tasks_are_bounded_by_time_limit_and_queue_sla(project: Project) -> None:
    env, out = project.env, project.out
    publish(env, "hang")
    fail = project.wait(lambda: lines(out / "hang-failures"), 15, "HangTask's timeout")
    assert fail == [{"error": "TimeoutException", "retried": False}]  # max_retries = None: no retry
    assert lines(out / "hang-killed") == [{}] and len(lines(out / "hang-started")) == 1
    # time_limit = None: the "sla" queue's visibility timeout (3 s) stops it; the next task on the queue runs
    after = project.wait(lambda: lines(out / "after-hang"), 20, "the task behind the hung one")[0]
    started = lines(out / "nolimit-started")
    assert len(started) == 1 and 2.5 <= after["at"] - started[0]["at"] < 10


@pytest.mark.skipif(platform.system() != "Linux", reason="the peak carried across exec is Linux's")
def test_a_worker_started_by_a_large_process_measures_its_own_memory(tmp_path: Path) -> None:
    """DIE_ON_RESIDENT_SET_SIZE_MB compares the worker's resident memory now, not the peak it inherits.

    Linux keeps `ru_maxrss` across `exec`: a worker started by a test runner or supervisor holding
    400 MB would begin over ndkale's default 256 MB, and exit 1 before running a task.
    """
    measure = (
        "import resource; from conveyor.compat.kale.worker import resident_kb; "
        "print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, resident_kb())"
    )
    big_parent = (
        "import os, sys; ballast = b'x' * (400 << 20); "  # resident, unlike a calloc'd bytearray
        f"os.execv(sys.executable, [sys.executable, '-c', {measure!r}])"
    )
    done = subprocess.run(
        [sys.executable, "-c", big_parent], env=env_for("", tmp_path), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    peak_kb, now_kb = map(int, done.stdout.split())
    assert peak_kb > 400 * 1024  # the inherited peak this test is about
    assert now_kb < settings.DEFAULTS["DIE_ON_RESIDENT_SET_SIZE_MB"] * 1024


# --- bad input: clear errors ----------------------------------------------------------------------
@pytest.fixture
def in_project(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.chdir(PROJECT)
    monkeypatch.syspath_prepend(str(PROJECT))
    yield
    publisher.reset_pool()
    settings.reload({})


def test_unknown_task_names_the_registered_ones(in_project: None) -> None:
    settings.reload({"KALE_SETTINGS_MODULE": "taskworker.settings"})
    found = registry.get("taskworker.tasks.FibonacciTask")  # resolved by importing its module, as ndkale does
    assert found.task_name == "taskworker.tasks.FibonacciTask"
    with pytest.raises(UnknownTaskError, match="FibonacciTask"):
        registry.get("taskworker.tasks.FibonaciTask")


def test_bad_settings_are_clear_errors(in_project: None) -> None:
    with pytest.raises(exceptions.ImproperlyConfiguredException, match=r"cannot import settings module 'taskworker\.no_such"):
        settings.reload({"KALE_SETTINGS_MODULE": "taskworker.no_such_settings"})
    assert issubclass(exceptions.ImproperlyConfiguredException, ConfigError)
    s = settings.reload({})
    assert s.QUEUE_CONFIG == "queue_config.yaml" and s.RETRY_DELAY_MULTIPLE_SEC == 60 and not s.PROPERLY_CONFIGURED
    with pytest.raises(exceptions.ImproperlyConfiguredException, match="MESSAGE_QUEUE_ENDPOINT_URL is not set"):
        publisher.get_pool()
    with pytest.raises(exceptions.ImproperlyConfiguredException, match="not a Conveyor server address"):
        publisher.endpoints("http://localhost:9324")
    assert publisher.endpoints("tcp://127.0.0.1:7700, 127.0.0.1:7701") == ["127.0.0.1:7700", "127.0.0.1:7701"]


def test_a_settings_module_that_raises_is_a_clear_error_naming_it(
    in_project: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ndkale's settings module raising as it runs is the compat layer's configuration error, naming it.

    A settings module raising as it runs (a missing secret, say) is not a raw RuntimeError, but the
    compat layer's configuration error, naming the variable, the module and its file, the original
    error chained.
    """
    (tmp_path / "raising_kale_settings.py").write_text("raise RuntimeError('SECRET_KEY is not set')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(exceptions.ImproperlyConfiguredException) as e:
        settings.reload({"KALE_SETTINGS_MODULE": "raising_kale_settings"})
    said = str(e.value)
    assert said.startswith("KALE_SETTINGS_MODULE='raising_kale_settings': settings module 'raising_kale_settings' (")
    assert str(tmp_path / "raising_kale_settings.py") in said
    assert "raised RuntimeError as it was imported: SECRET_KEY is not set" in said
    assert isinstance(e.value.__cause__, RuntimeError)


def test_missing_queue_config_and_bad_time_limit(in_project: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.reload({"KALE_SETTINGS_MODULE": "taskworker.settings"})
    monkeypatch.chdir(tmp_path)  # QUEUE_CONFIG is relative to the working directory
    with pytest.raises(exceptions.ImproperlyConfiguredException, match=r"no queue configuration at .*taskworker/queue_config"):
        worker.Worker()
    monkeypatch.chdir(PROJECT)
    from taskworker import tasks

    class TooSlow(tasks.FibonacciTask):
        time_limit = 120  # the default queue's visibility timeout is 120: ndkale refuses it

    with QueuePool.local(n_servers=1, durable=False) as pool:
        monkeypatch.setattr(settings.current(), "MESSAGE_QUEUE_ENDPOINT_URL", pool.queues.clients[0].address)
        with pytest.raises(exceptions.InvalidTimeLimitTaskException, match="120 >= 120"):
            TooSlow.publish(None, 3)
        with pytest.raises(exceptions.InvalidTaskDelayException):
            tasks.FibonacciTask.publish(None, 3, delay_sec=-1)
    registry.unregister(TooSlow.task_name)


def test_a_signal_to_the_process_group_lets_running_tasks_finish(tmp_path: Path) -> None:
    out = tmp_path
    with running_worker(out) as p:
        publish(p.env, "SlowTask")
        started = p.wait(lambda: lines(out / "slow-started"), 15, "SlowTask to start")[0]
        os.killpg(p.proc.pid, signal.SIGTERM)  # to the worker and its task processes, as systemd's KillMode=control-group
        assert p.proc.wait(20) == 0
    assert lines(out / "slow-done") == [{}]  # the running task finished
    assert {"pid": started["pid"], "ready": True} in lines(out / "worker-stopped")  # ON_WORKER_SHUTDOWN where it ran


# --- without a worker -------------------------------------------------------------------------------
def run_python(code: str, settings_module: str) -> subprocess.CompletedProcess[str]:
    env = {**env_for("", PROJECT), "KALE_SETTINGS_MODULE": settings_module}
    return subprocess.run([sys.executable, "-c", code], cwd=PROJECT, env=env, capture_output=True, text=True, timeout=30)


def test_settings_are_read_on_first_use_never_at_class_definition() -> None:
    # a settings module that imports the tasks (whose classes read no settings): no deadlock
    done = run_python("from conveyor.compat.kale import settings; print(settings.TASK_MAPPER)", "taskworker.settings_tasks")
    assert done.returncode == 0, done.stderr
    assert "'old.name.Fibonacci': 'taskworker.tasks.FibonacciTask'" in done.stdout
    # the tasks import whatever the settings: the error comes where they are used
    code = "import conveyor.compat.kale.worker\nfrom taskworker import tasks\nprint('imported')\ntasks.StartupTask.publish(None)"
    done = run_python(code, "taskworker.no_such_settings")  # the worker's task processes import these modules too
    assert done.returncode == 1 and done.stdout == "imported\n" and "cannot import settings module" in done.stderr


def test_a_worker_started_from_elsewhere_says_where_it_looked(tmp_path: Path) -> None:
    env = {**env_for("tcp://127.0.0.1:1", tmp_path)}
    done = subprocess.run(
        [sys.executable, str(PROJECT / "worker.py")], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 1 and "QUEUE_CONFIG: no queue configuration at" in done.stderr and str(tmp_path) in done.stderr


def test_a_settings_module_reading_the_settings_is_a_clear_error(in_project: None) -> None:
    with pytest.raises(exceptions.ImproperlyConfiguredException, match="circular import"):
        settings.reload({"KALE_SETTINGS_MODULE": "taskworker.settings_circular"})


def test_ndkale_settings_and_retry_delay_defaults(in_project: None) -> None:
    s = settings.reload({})
    assert s.PICKLE_PROTOCOL == pickle.DEFAULT_PROTOCOL and s.PUBLISHER_STR_FUNC() == f"{platform.node()}[{os.getpid()}]"
    from taskworker import tasks

    assert tasks.FlakyTask._retry_delay_multiple == 60  # RETRY_DELAY_MULTIPLE_SEC, as in ndkale
    assert tasks.FlakyTask._get_delay_sec_for_retry(1) == 120 and tasks.FlakyTask._get_delay_sec_for_retry(9) == 900
    settings.reload({"KALE_SETTINGS_MODULE": "taskworker.settings"})
    assert tasks.FlakyTask._retry_delay_multiple == 0.2 and tasks.FlakyTask._get_delay_sec_for_retry(2) == 0.8

    class Slower(tasks.FlakyTask):
        _retry_delay_multiple = 5

    assert Slower._get_delay_sec_for_retry(1) == 10
    registry.unregister(Slower.task_name)


def test_shared_bases_are_not_registered(in_project: None) -> None:
    from taskworker import tasks

    assert tasks.SharedBase.task_name not in registry and tasks.FlakyTask.task_name in registry
    with pytest.raises(TaskOptionError, match="does not implement run_task"):
        tasks.SharedBase.publish(None)
    with pytest.raises(UnknownTaskError):
        registry.get(tasks.SharedBase.task_name)  # not resolved by importing its module either


def test_ndkale_queue_selectors(in_project: None) -> None:
    settings.reload({"KALE_SETTINGS_MODULE": "taskworker.settings"})
    sel = queue_selector.make_selector(settings.current().QUEUE_SELECTOR)
    assert isinstance(sel, queue_selector.KaleSelector)
    queues = queue_info.load_configs()
    probed: list[str] = []

    def has_work(names: set[str]) -> Callable[[Any], bool]:
        return lambda q: probed.append(q.name) or q.name in names

    assert sel.get_queue(queues, has_work({"sla"})).name == "sla"  # type: ignore[union-attr]
    assert probed == ["default", "sla"]  # probed in priority order, as ndkale's queue_info does
    assert sel.get_queue(queues, has_work({"default", "sla"})).name == "default"  # type: ignore[union-attr]
    assert sel.get_queue(queues, has_work(set())) in queues
    assert type(queue_selector.make_selector("kale.queue_selector.ReducedLottery")).__name__ == "ReducedLottery"
    with pytest.raises(exceptions.ImproperlyConfiguredException, match="cannot load queue selector"):
        queue_selector.make_selector("taskworker.selector.NoSuchSelector")


def test_handle_failure_decides_retries_without_marking_the_exception(
    in_project: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings.reload({"KALE_SETTINGS_MODULE": "taskworker.settings"})
    from taskworker import tasks

    monkeypatch.setattr(tasks, "OUT", str(tmp_path))  # what the tasks record

    def run(cls: Any) -> TaskError:
        msg = build_message(cls.task_name, cls.options, (), {}, {publisher.APP_DATA_KEY: ["id-1", None]})
        with pytest.raises(TaskError) as e:
            run_message(msg)
        return e.value

    with concurrent.futures.ThreadPoolExecutor(1) as ex:  # not the main thread: no time-limit alarm
        gave_up, flaky = ex.submit(run, tasks.GiveUpTask).result(10), ex.submit(run, tasks.FlakyTask).result(10)
    assert not gave_up.retryable and "retryable" not in vars(gave_up.cause)  # handle_failure said no
    assert len(lines(tmp_path / "giveup-attempts")) == 1 and len(lines(tmp_path / "flaky-failures")) == 1
    assert flaky.retryable  # the next run is not marked by the last one's decision


def test_an_unknown_task_stays_not_retryable_when_resolving_fails(in_project: None, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> settings.Settings:
        raise exceptions.ImproperlyConfiguredException("no settings")

    monkeypatch.setattr(settings, "current", broken)  # the kale resolver cannot read TASK_MAPPER
    with pytest.raises(UnknownTaskError, match="ImproperlyConfiguredException: no settings"):
        registry.get("taskworker.tasks.NoSuchTask")
    r = Registry()
    r.add_resolver(lambda name: 1 // 0)  # type: ignore[arg-type,return-value]
    with pytest.raises(UnknownTaskError, match="ZeroDivisionError"):
        r.get("a.b")
