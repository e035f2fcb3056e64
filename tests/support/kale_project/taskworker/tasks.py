"""ndkale-style tasks: only the import line differs from ndkale's (`from kale import task`)."""

import json
import os
import time

from conveyor.compat.kale import task
from taskworker import state

OUT = os.environ.get("KALE_TEST_OUT", "")


def record(name, **fields):
    with open(os.path.join(OUT, name), "a") as f:
        f.write(json.dumps(fields) + "\n")


def recorded(name):
    """What `record` wrote to `name` so far (a task counting its own deliveries)."""
    path = os.path.join(OUT, name)
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f]


class Point:
    """Non-dict app_data: any picklable object."""

    def __init__(self, x, y):
        self.x, self.y = x, y


class FibonacciTask(task.Task):
    max_retries = 3
    time_limit = 5
    queue = "default"

    @staticmethod
    def fibonacci(n):
        return n if n < 2 else FibonacciTask.fibonacci(n - 1) + FibonacciTask.fibonacci(n - 2)

    def _pre_run(self, *args, **kwargs):
        super()._pre_run(*args, **kwargs)
        self.pre_ran = True

    def run_task(self, n, *args, **kwargs):
        app = self.app_data
        app = [app.x, app.y] if isinstance(app, Point) else app
        record(
            f"fib-{n}",
            value=self.fibonacci(n),
            app_data=app,
            kwargs=kwargs,
            task_id=self.task_id,
            pre_ran=self.pre_ran,
            at=time.time(),
        )

    def _post_run(self, *args, **kwargs):
        super()._post_run(*args, **kwargs)
        record(f"post-{args[0]}")


class FlakyTask(task.Task):
    """Always fails: retried max_retries times, handle_failure sees each failure."""

    max_retries = 2
    queue = "default"

    def run_task(self, tag, **kwargs):
        raise ValueError(f"flaky {tag}")

    @classmethod
    def handle_failure(cls, message, raised_exception):
        retried = super().handle_failure(message, raised_exception)
        record(
            "flaky-failures",
            retry_num=message.task_retry_num,
            retried=retried,
            error=str(raised_exception),
            task_id=message.task_id,
        )
        return retried

    @staticmethod
    def _clean_task_environment(task_id=None, task_name=None, exc=None):
        record("flaky-cleanup", task_name=task_name, exc=repr(exc))


class BlacklistedTask(task.Task):
    """Raises an EXCEPTION_LIST exception: never retried whatever max_retries says."""

    max_retries = 5
    queue = "default"

    def run_task(self, **kwargs):
        raise KeyError("missing")

    @classmethod
    def handle_failure(cls, message, raised_exception):
        retried = super().handle_failure(message, raised_exception)
        record("blacklisted-failures", retry_num=message.task_retry_num, retried=retried)
        return retried


class HangTask(task.Task):
    """Hangs past its time_limit: TimeoutException inside the task, then handle_failure."""

    max_retries = None
    time_limit = 1
    queue = "default"

    def run_task(self, **kwargs):
        record("hang-started")
        time.sleep(120)

    def _kill_runtime_exceeded(self, *args, **kwargs):
        record("hang-killed")

    @classmethod
    def handle_failure(cls, message, raised_exception):
        retried = super().handle_failure(message, raised_exception)
        record("hang-failures", error=type(raised_exception).__name__, retried=retried)
        return retried


class NoLimitHangTask(task.Task):
    """No time limit at all: its queue's visibility timeout (the batch SLA) bounds it."""

    max_retries = None
    time_limit = None
    queue = "sla"

    def run_task(self, **kwargs):
        record("nolimit-started", at=time.time())
        time.sleep(120)


class AfterHangTask(task.Task):
    queue = "sla"
    time_limit = 2

    def run_task(self, **kwargs):
        record("after-hang", at=time.time())


class StartupTask(task.Task):
    """Sees what ON_WORKER_STARTUP set up in the process that runs it."""

    queue = "default"

    def run_task(self, **kwargs):
        record("startup-task", ready=state.READY, pid=os.getpid())


class DelayOverrideTask(task.Task):
    """Overrides ndkale's retry-delay hook: the worker asks it for each retry's delay."""

    max_retries = 1
    queue = "default"

    @classmethod
    def _get_delay_sec_for_retry(cls, current_retry_num):
        record("delay-asked", retry_num=current_retry_num)
        return 1.5  # the settings' backoff would retry after 0.2 s

    def run_task(self, **kwargs):
        record("delay-attempts", at=time.time())
        raise ValueError("transient")


class GiveUpTask(task.Task):
    """handle_failure says no retry (a validation error, say) although max_retries allows 3."""

    max_retries = 3
    queue = "default"

    def run_task(self, **kwargs):
        record("giveup-attempts", at=time.time())
        raise ValueError("bad input")

    @classmethod
    def handle_failure(cls, message, raised_exception):
        super().handle_failure(message, raised_exception)
        return False


class SlowFailureTask(task.Task):
    """Fails within its time_limit; its handle_failure runs well past it.

    ndkale's limit has ended by then, and no bound from outside but the queue's visibility timeout
    applies.
    """

    max_retries = None
    time_limit = 1
    queue = "default"

    def run_task(self, **kwargs):
        time.sleep(0.7)
        raise ValueError("failed in time")

    @classmethod
    def handle_failure(cls, message, raised_exception):
        time.sleep(3.0)  # to 3.7 s from the start: past time_limit + the 2 s grace
        record("slowfailure-handled", error=type(raised_exception).__name__)
        return super().handle_failure(message, raised_exception)


class SlowTask(task.Task):
    """Runs a while: a worker stopping meanwhile lets it finish."""

    queue = "default"
    time_limit = 10

    def run_task(self, **kwargs):
        record("slow-started", pid=os.getpid())
        time.sleep(1.5)
        record("slow-done")


class SharedBase(task.Task):
    """A shared base without run_task: not registered, cannot be published."""

    queue = "default"


# --- ndkale 2.2.4: failure counts, should_run_task, the exception given to the clean-up -----------------
class CountedFailuresTask(task.Task):
    """Failures that should not count (a dependency down) are retried without counting towards max_retries.

    ndkale 2.2.4's `handle_failure(..., increment_failure_num=False)`: retries are decided on
    `task_failure_num`, delays on `task_retry_num`.
    """

    max_retries = 1
    queue = "default"

    def run_task(self, **kwargs):
        n = len(recorded("counted-attempts"))
        record("counted-attempts", at=time.time())
        if n < 2:
            raise ConnectionError("the database is down")
        raise ValueError("bad row")

    @classmethod
    def handle_failure(cls, message, raised_exception, increment_failure_num=True):
        counts = not isinstance(raised_exception, ConnectionError)
        retried = super().handle_failure(message, raised_exception, increment_failure_num=counts)
        record(
            "counted-failures",
            retry_num=message.task_retry_num,
            failure_num=message.task_failure_num,
            retried=retried,
            error=type(raised_exception).__name__,
            message_id=message.id,
            task_id=message.task_id,
        )
        return retried


class PutOffTask(task.Task):
    """Puts its first delivery off (`should_run_task` False): re-published, and run the next time."""

    queue = "default"

    def should_run_task(self, tag, **kwargs):
        first = not recorded("putoff-asked")
        record("putoff-asked", at=time.time())
        return not first

    def run_task(self, tag, **kwargs):
        record("putoff-ran", tag=tag, at=time.time())

    @classmethod
    def republish(cls, message, failure_count):
        record("putoff-republished", retry_num=message.task_retry_num, failure_num=failure_count, args=message.task_args)
        super().republish(message, failure_count)


class CleanupTask(task.Task):
    """Records what `_clean_task_environment` is given, and when `handle_failure` runs."""

    max_retries = None
    queue = "default"

    def run_task(self, fail, **kwargs):
        if fail:
            raise LookupError("no such row")

    @staticmethod
    def _clean_task_environment(**kwargs):
        exc = kwargs.get("exc")
        record("cleanup-calls", hook="clean", keys=sorted(kwargs), exc=None if exc is None else [type(exc).__name__, str(exc)])

    @classmethod
    def handle_failure(cls, message, raised_exception, increment_failure_num=True):
        record("cleanup-calls", hook="handle_failure")
        return super().handle_failure(message, raised_exception, increment_failure_num)


class NoRepublishTask(task.Task):
    """handle_failure says retry without re-publishing (as written before ndkale 2.x): Conveyor retries the delivery."""

    max_retries = 2
    queue = "default"

    def run_task(self, **kwargs):
        raise ValueError("transient")

    @classmethod
    def handle_failure(cls, message, raised_exception, increment_failure_num=True):
        record("norepublish-failures", retry_num=message.task_retry_num, failure_num=message.task_failure_num, id=message.id)
        return True
