"""Defining, publishing and running tasks (conveyor.tasks.definition, conveyor.tasks.registry, conveyor.tasks.runner).

Publishing goes to `StorePool`, a minimal `Publisher` over real `MemoryStore`s (one per queue).
"""

from __future__ import annotations

import math
import pickle
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

import conveyor
from conveyor.constants import H_CONTENT_TYPE, H_IDEMPOTENCY_KEY, H_RETRY_BACKOFF, H_TASK, H_TIME_LIMIT
from conveyor.errors import (
    DuplicateTaskError,
    NoPublisherError,
    SerializationError,
    TaskArgumentError,
    TaskError,
    TaskOptionError,
    UnknownTaskError,
)
from conveyor.message import Message
from conveyor.storage import MemoryStore
from conveyor.tasks.definition import (
    Args,
    Task,
    TaskFunction,
    TaskHandle,
    backoff_delay,
    default_pool,
    get_default_pool,
    run_message,
    set_default_pool,
    task,
)
from conveyor.tasks.envelope import FunctionCache, FunctionRef, decode_call, decode_error, decode_result
from conveyor.tasks.options import TaskOptions
from conveyor.tasks.policy import DEFAULT_BACKOFF, Backoff, Jitter, backoff_of, time_limit_of
from conveyor.tasks.publish import publish_adhoc
from conveyor.tasks.registry import Registry, registry
from conveyor.worker import QueueConfig


class StorePool:
    """A Publisher over one MemoryStore per queue, with optional queue configs."""

    def __init__(self, *configs: QueueConfig) -> None:
        self.configs = {c.name: c for c in configs}
        self.stores: dict[str, MemoryStore] = {}
        self.clock: Callable[[], float] | None = None  # the stores' clock, for a test to move

    def store(self, queue: str) -> MemoryStore:
        if queue not in self.stores:
            self.stores[queue] = MemoryStore(queue)
            if self.clock is not None:
                self.stores[queue].clock = self.clock
        return self.stores[queue]

    def put(self, queue: str, messages: Sequence[Message]) -> list[int]:
        return self.store(queue).put(messages)

    def queue_config(self, queue: str) -> QueueConfig | None:
        return self.configs.get(queue)

    def take(self, queue: str = "default", n: int = 100) -> list[Message]:
        return self.store(queue).get(n)


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def pool() -> Iterator[StorePool]:
    p = StorePool()
    with default_pool(p):
        yield p


# --- tasks shared by the tests (module level: registered once, as in real code) ---------------------
@task
def add(a: int, b: int = 1) -> int:
    return a + b


@task(queue="io", priority=7, time_limit=30, max_retries=5, retry_backoff=(0.5, 3.0, 60.0), name="custom.name")
def fetch_page(url: str, *, timeout: float = 10.0) -> dict[str, Any]:
    return {"url": url, "timeout": timeout}


@task(max_retries=2, retry_backoff=Backoff(1.0, 2.0, 300.0, Jitter.NONE))
def always_fails(x: int) -> None:
    raise RuntimeError(f"boom {x}")


@task(no_retry=(KeyError,))
def lookup(key: str) -> str:
    return {"a": "A"}[key]


@task
def returns_lock() -> threading.Lock:
    return threading.Lock()


@task
def takes_private(_private: int, **extra: Any) -> tuple[int, dict[str, Any]]:
    return _private, extra


CALLS: list[tuple[str, Any]] = []


class Resize(Task):
    queue = "images"
    max_retries = 1

    def before_run(self, *args: Any, **kwargs: Any) -> None:
        CALLS.append(("before_run", (args, kwargs)))

    def run_task(self, width: int, height: int = 10) -> dict[str, Any]:
        CALLS.append(("run_task", (width, height)))
        if width < 0:
            raise ValueError("negative width")
        return {"area": width * height, "app_data": self.app_data, "task_id": self.task_id}

    def after_run(self, result: Any, *args: Any, **kwargs: Any) -> None:
        CALLS.append(("after_run", result))

    def on_failure(self, exc: Exception, *args: Any, **kwargs: Any) -> None:
        CALLS.append(("on_failure", repr(exc)))

    def cleanup(self, exc: Exception | None) -> None:
        CALLS.append(("cleanup", None if exc is None else repr(exc)))


class BaseJob(Task):  # a shared base: no run_task, so not registered
    queue = "jobs"


class Named(BaseJob, name="jobs.named"):
    def run_task(self) -> str:
        return self.queue


# --- definitions ------------------------------------------------------------------------------
def test_task_functions_stay_callable_and_carry_their_options() -> None:
    assert add(2, 3) == 5 and add.__name__ == "add" and add.__wrapped__ is add.fn
    assert isinstance(add, TaskFunction)
    assert add.task_name == f"{__name__}.add"
    assert add.options == TaskOptions()
    assert fetch_page.task_name == "custom.name"
    o = fetch_page.options
    assert (o.queue, o.priority, o.time_limit, o.max_retries) == ("io", 7, 30.0, 5)
    assert o.retry_backoff == Backoff(0.5, 3.0, 60.0) and o.max_attempts == 6


def test_tasks_register_by_module_and_qualname() -> None:
    assert registry.get(f"{__name__}.add") is add
    assert registry.get("custom.name") is fetch_page
    assert registry.get(f"{__name__}.Resize") is Resize
    assert registry.get("jobs.named") is Named
    assert f"{__name__}.BaseJob" not in registry


def test_registering_a_name_twice_with_different_objects_raises() -> None:
    reg = Registry()

    def f() -> None: ...

    t = task(f, name="dup", registry=reg)
    reg.register("dup", t)  # the same object again: fine
    with pytest.raises(DuplicateTaskError, match="'dup' is already registered"):
        task(name="dup", registry=reg)(lambda: None)
    with pytest.raises(TaskOptionError, match="task name"):
        reg.register("fn:abc", t)


def test_unknown_task_names_what_is_registered() -> None:
    reg = Registry()
    task(lambda: None, name="app.resize", registry=reg)
    task(lambda: None, name="app.crop", registry=reg)
    with pytest.raises(UnknownTaskError) as ei:
        reg.get("app.resiz")
    e = ei.value
    assert e.name == "app.resiz" and e.registered == ["app.crop", "app.resize"]
    assert "did you mean 'app.resize'" in str(e) and "app.crop" in str(e) and "TASK_MODULES" in str(e)
    assert e.retryable is False


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"max_retries": -1}, "max_retries"),
        ({"max_retries": 1.5}, "max_retries"),
        ({"max_retries": 2**16}, "max_retries"),
        ({"priority": True}, "priority"),
        ({"priority": 2**31}, "priority"),
        ({"time_limit": 0}, "time_limit"),
        ({"time_limit": -1.0}, "time_limit"),
        ({"time_limit": math.inf}, "time_limit"),
        ({"queue": ""}, "queue"),
        ({"retry_backoff": -1.0}, "base"),
        ({"retry_backoff": (1.0, 0.5)}, "factor"),
        ({"retry_backoff": (10.0, 2.0, 5.0)}, "cap"),
        ({"retry_backoff": (1.0, 2.0, 5.0, "sideways")}, "jitter"),
        ({"retry_backoff": "1s"}, "retry_backoff"),
        ({"no_retry": (KeyError, "x")}, "no_retry"),
    ],
)
def test_invalid_options_are_rejected_at_definition(options: dict[str, Any], match: str) -> None:
    with pytest.raises(TaskOptionError, match=match):
        task(registry=Registry(), **options)(lambda: None)


def test_invalid_class_options_name_the_class() -> None:
    with pytest.raises(TaskOptionError, match=r"task class .*Bad: max_retries"):

        class Bad(Task, registry=Registry()):
            max_retries = -2

            def run_task(self) -> None: ...


def test_backoff_shorthands() -> None:
    assert Backoff.of(2) == Backoff(2.0)
    assert Backoff.of(500.0) == Backoff(500.0, cap=500.0)
    assert Backoff.of((1.0, 3.0)) == Backoff(1.0, 3.0)
    assert Backoff.of((1.0, 3.0, 9.0, "full")).jitter is Jitter.FULL
    assert Backoff.parse(Backoff(0.25, 1.5, 7.0, Jitter.NONE).header()) == Backoff(0.25, 1.5, 7.0, Jitter.NONE)


# --- publishing ---------------------------------------------------------------------------------
def test_publish_puts_one_message_with_the_task_options(pool: StorePool) -> None:
    h = fetch_page.publish("http://x", timeout=3.5)
    assert h == TaskHandle(h.id, "io", "custom.name")
    (m,) = pool.take("io")
    assert m.id == h.id and m.priority == 7 and m.max_attempts == 6 and m.not_before == 0.0
    assert m.headers[H_TASK] == "custom.name" and m.headers[H_CONTENT_TYPE] == "msgpack"
    assert m.headers[H_TIME_LIMIT] == "30.0" and m.headers[H_RETRY_BACKOFF] == "0.5,3.0,60.0,equal"
    assert time_limit_of(m.headers) == 30.0 and backoff_of(m.headers) == Backoff(0.5, 3.0, 60.0)
    assert H_IDEMPOTENCY_KEY not in m.headers
    assert decode_call(m.payload, m.headers) == conveyor.tasks.envelope.Call("custom.name", ("http://x",), {"timeout": 3.5})


def test_default_options_add_no_optional_headers(pool: StorePool) -> None:
    add.publish(1)
    (m,) = pool.take()
    assert set(m.headers) == {H_CONTENT_TYPE, H_TASK}
    assert time_limit_of(m.headers) is None and backoff_of(m.headers) == DEFAULT_BACKOFF
    assert m.max_attempts == 4 and m.priority == 0


def test_publish_options_delay_priority_and_key(pool: StorePool, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = pool.clock = Clock()  # the store's clock, and the publisher's: move time without sleeping
    monkeypatch.setattr(time, "time", clock)
    h = add.publish(1, _delay=60, _priority=-5, _key="order-17")
    assert pool.take() == [] and pool.store("default").stats().delayed == 1
    clock.now += 59.9
    assert pool.take() == []  # not served before its delay
    clock.now += 0.2
    (m,) = pool.take()
    assert m.id == h.id and m.not_before == pytest.approx(clock.now - 0.1)
    assert m.priority == -5 and m.headers[H_IDEMPOTENCY_KEY] == "order-17"


def test_task_arguments_with_underscores_pass_through(pool: StorePool) -> None:
    takes_private.publish(1, _other=2)
    (m,) = pool.take()
    assert decode_result(run_message(m)) == (1, {"_other": 2})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"_delay": -1}, "_delay"),
        ({"_delay": math.nan}, "_delay"),
        ({"_priority": "high"}, "priority"),
        ({"_priority": 2**40}, "priority"),
        ({"_key": ""}, "_key"),
        ({"_key": 5}, "_key"),
    ],
)
def test_invalid_publish_options_are_rejected(pool: StorePool, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(TaskOptionError, match=match):
        add.publish(1, **kwargs)
    assert pool.store("default").stats().ready == 0


def test_arguments_are_checked_against_the_signature_at_publish(pool: StorePool) -> None:
    with pytest.raises(TaskArgumentError, match=r"add.*missing a required argument: 'a'"):
        add.publish()
    with pytest.raises(TaskArgumentError, match="unexpected keyword argument 'c'"):
        add.publish(1, c=2)
    with pytest.raises(TaskArgumentError, match="too many positional"):
        Resize.publish(None, 1, 2, 3)
    with pytest.raises(TaskArgumentError, match="app_data must be a dict"):
        Resize.publish([1], 1)  # type: ignore[arg-type]
    assert pool.store("default").stats().ready == 0 and pool.store("images").stats().ready == 0


def test_unserializable_arguments_fail_at_publish(pool: StorePool) -> None:
    with pytest.raises(SerializationError, match=rf"{__name__}.add.*args\[1\] \(lock\)"):
        add.publish(1, threading.Lock())
    with pytest.raises(SerializationError, match=r"args\[1\]"):
        add.publish_many([(1, 2), (3, threading.Lock())])
    assert pool.store("default").stats().ready == 0  # nothing put, not even the good first call


def test_time_limit_must_stay_below_the_queues_visibility_timeout() -> None:
    strict = StorePool(QueueConfig("io", visibility_timeout_sec=30))
    with pytest.raises(TaskOptionError, match=r"time_limit 30 s must be below the visibility timeout \(30 s\) of queue 'io'"):
        fetch_page.publish("u", _pool=strict)
    roomy = StorePool(QueueConfig("io", visibility_timeout_sec=31))
    assert fetch_page.publish("u", _pool=roomy).id == 1
    assert strict.store("io").stats().ready == 0


def test_publish_many_puts_one_batch_in_order(pool: StorePool) -> None:
    handles = add.publish_many([(1,), (2, 3), Args(4, b=5)], _priority=3)
    assert [h.id for h in handles] == [1, 2, 3] and {h.task for h in handles} == {add.task_name}
    got = pool.take()
    assert [decode_call(m.payload, m.headers).args for m in got] == [(1,), (2, 3), (4,)]
    assert [decode_result(run_message(m)) for m in got] == [2, 5, 9]
    assert {m.priority for m in got} == {3}
    assert add.publish_many([]) == []
    with pytest.raises(TaskArgumentError, match="item 1 must be a tuple"):
        add.publish_many([(1,), [2]])  # type: ignore[list-item]


def test_without_a_pool_publish_says_how_to_set_one() -> None:
    assert get_default_pool() is None
    with pytest.raises(NoPublisherError, match="set_default_pool"):
        add.publish(1)


def test_default_pool_context_restores_the_previous_one() -> None:
    a, b = StorePool(), StorePool()
    assert set_default_pool(a) is None
    try:
        with default_pool(b):
            add.publish(1)
            add.publish(2, _pool=a)
        add.publish(3)
    finally:
        assert set_default_pool(None) is a
    assert [decode_call(m.payload, m.headers).args for m in a.take()] == [(2,), (3,)]
    assert [decode_call(m.payload, m.headers).args for m in b.take()] == [(1,)]


@given(st.lists(st.integers() | st.text() | st.none() | st.lists(st.floats(allow_nan=False)), max_size=3).map(tuple))
def test_published_arguments_arrive_as_given(args: tuple[Any, ...]) -> None:
    p = StorePool()
    reg = Registry()
    echo = task(lambda *a: a, name="echo", registry=reg)
    echo.publish(*args, _pool=p)
    (m,) = p.take()
    assert decode_result(run_message(m, reg)) == args


def test_a_running_task_sees_its_own_message() -> None:
    """`current_message()` is the delivery being run, in the task's thread only, and None after it."""
    from dataclasses import replace

    from conveyor.tasks.runner import current_message

    p = StorePool()
    reg = Registry()
    seen = task(lambda: (current_message().id, current_message().attempts), name="seen", registry=reg)  # type: ignore[union-attr]
    seen.publish(_pool=p)
    (m,) = p.take()
    assert decode_result(run_message(replace(m, attempts=2), reg)) == (m.id, 2)
    assert current_message() is None


# --- class tasks --------------------------------------------------------------------------------
def test_class_task_hooks_run_in_order_with_app_data(pool: StorePool) -> None:
    CALLS.clear()
    h = Resize.publish({"user": 7}, 3, height=4)
    assert h.queue == "images" and h.task == f"{__name__}.Resize"
    (m,) = pool.take("images")
    assert m.max_attempts == 2
    result = decode_result(run_message(m))
    assert result == {"area": 12, "app_data": {"user": 7}, "task_id": h.id}
    expected = [("before_run", ((3,), {"height": 4})), ("run_task", (3, 4)), ("after_run", result), ("cleanup", None)]
    assert expected == CALLS


def test_class_task_failure_hooks_run_in_order(pool: StorePool) -> None:
    CALLS.clear()
    Resize.publish(None, -1)
    (m,) = pool.take("images")
    with pytest.raises(TaskError) as ei:
        run_message(m)
    err = "ValueError('negative width')"
    expected = [("before_run", ((-1,), {})), ("run_task", (-1, 10)), ("on_failure", err), ("cleanup", err)]
    assert expected == CALLS
    assert ei.value.retryable and decode_error(ei.value.error).message == "negative width"


def test_a_raising_failure_hook_does_not_hide_the_error() -> None:
    class Fragile(Task, registry=Registry()):
        def run_task(self) -> None:
            raise KeyError("original")

        def on_failure(self, exc: Exception, *args: Any, **kwargs: Any) -> None:
            raise RuntimeError("hook broke")

    with pytest.raises(KeyError, match="original") as ei:
        Fragile().run()
    assert any("hook broke" in n for n in getattr(ei.value, "__notes__", []))


def test_shared_bases_are_not_published_or_registered(pool: StorePool) -> None:
    with pytest.raises(TaskOptionError, match="does not implement run_task"):
        BaseJob.publish(None)
    assert Named.publish_many({"a": 1}, [(), ()])[1].id == 2
    assert [decode_result(run_message(m)) for m in pool.take("jobs")] == ["jobs", "jobs"]

    reg = Registry()

    class Abstract(Task, abstract=True, registry=reg):
        def run_task(self) -> None: ...

    assert len(reg) == 0


def test_a_task_instance_runs_directly_for_tests() -> None:
    CALLS.clear()
    assert Resize({"k": 1}).run(2, 2)["app_data"] == {"k": 1}
    assert [c[0] for c in CALLS] == ["before_run", "run_task", "after_run", "cleanup"]


# --- the run side -------------------------------------------------------------------------------
def test_failures_raise_task_error_with_the_error_text(pool: StorePool) -> None:
    always_fails.publish(3)
    (m,) = pool.take()
    with pytest.raises(TaskError) as ei:
        run_message(m)
    e = ei.value
    assert e.task == always_fails.task_name and e.retryable and isinstance(e.cause, RuntimeError)
    info = decode_error(e.error)
    assert info.type == "RuntimeError" and info.message == "boom 3" and "always_fails" in info.traceback
    copy = pickle.loads(pickle.dumps(e))  # crosses process boundaries without its cause
    assert (copy.task, copy.error, copy.retryable, copy.cause) == (e.task, e.error, True, None)


def test_not_retryable_failures(pool: StorePool) -> None:
    lookup.publish("zzz")
    returns_lock.publish()
    m1, m2 = pool.take()
    with pytest.raises(TaskError) as ei:
        run_message(m1)
    assert not ei.value.retryable and isinstance(ei.value.cause, KeyError)  # listed in no_retry
    with pytest.raises(TaskError) as ei:
        run_message(m2)
    assert not ei.value.retryable and isinstance(ei.value.cause, SerializationError)  # the result


def test_unknown_tasks_and_damaged_payloads_are_not_retryable(pool: StorePool) -> None:
    task(lambda: 1, name="elsewhere.only", registry=Registry()).publish()
    (m,) = pool.take()
    with pytest.raises(TaskError) as ei:
        run_message(m)
    assert ei.value.task == "elsewhere.only" and not ei.value.retryable
    assert isinstance(ei.value.cause, UnknownTaskError)
    damaged = Message(id=9, payload=b"\xc1", headers={H_CONTENT_TYPE: "msgpack", H_TASK: "x.y"})
    with pytest.raises(TaskError) as ei:
        run_message(damaged)
    assert ei.value.task == "x.y" and not ei.value.retryable and isinstance(ei.value.cause, SerializationError)


def test_adhoc_calls_carry_a_digest_and_resolve_through_fetch() -> None:
    scale = 3
    pool, stored = StorePool(), list[FunctionRef]()
    opts = TaskOptions(queue="adhoc", max_retries=0)
    [h] = publish_adhoc(lambda x, y=0: x * scale + y, [((2,), {"y": 1})], opts, None, None, None, pool, stored.append)
    [ref] = stored  # the function's bytes, stored before its message was put
    [msg] = pool.take("adhoc")
    assert ref.data not in msg.payload and msg.headers[H_TASK] == f"fn:{ref.digest}" == h.task
    assert msg.queue == "adhoc" and msg.max_attempts == 1
    mid = h.id
    blobs = {ref.digest: ref.data}
    cache = FunctionCache()
    assert decode_result(run_message(msg, function_cache=cache, fetch=blobs.__getitem__)) == 7
    assert ref.digest in cache
    with pytest.raises(TaskError, match="no `fetch`") as ei:
        run_message(msg)
    assert ei.value.retryable
    assert mid == 1


def test_task_functions_pickle_by_name() -> None:
    assert pickle.loads(pickle.dumps(add)) is add


# --- retries: the pieces a consumer puts together -----------------------------------------------
def test_backoff_delays_grow_are_capped_and_reproducible() -> None:
    none = Backoff(1.0, 2.0, 10.0, Jitter.NONE)
    assert [backoff_delay(n, none) for n in range(1, 7)] == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert backoff_delay(100_000, none) == 10.0  # no overflow
    equal = [backoff_delay(n, Backoff(1.0, 2.0, 10.0), random.Random(5)) for n in range(1, 7)]
    assert all(c / 2 <= d <= c for d, c in zip(equal, [1, 2, 4, 8, 10, 10], strict=True))
    assert equal == [backoff_delay(n, Backoff(1.0, 2.0, 10.0), random.Random(5)) for n in range(1, 7)]
    full = [backoff_delay(4, (1.0, 2.0, 10.0, "full"), random.Random(i)) for i in range(200)]
    assert min(full) < 1.0 and max(full) <= 8.0


def test_retries_are_counted_spaced_and_end_in_the_dead_letters(pool: StorePool, monkeypatch: pytest.MonkeyPatch) -> None:
    """A consumer's loop over the real store: nack with backoff_delay until the dead letters."""
    clock = pool.clock = Clock()  # the store's clock: let the test move time, no sleeping
    monkeypatch.setattr(time, "time", clock)
    h = always_fails.publish(5)
    store = pool.store("default")
    delays: list[float] = []
    while True:
        got = store.get(1)
        if not got:
            break
        (m,) = got
        with pytest.raises(TaskError) as ei:
            run_message(m)
        delay = backoff_delay(m.attempts, backoff_of(m.headers), random.Random(0))
        store.nack(m.id, ei.value.error, delay)
        if store.stats().failed:
            break
        delays.append(delay)
        clock.now += delay - 0.01
        assert store.get(1) == []  # spaced: not served before its delay
        clock.now += 0.01
    assert m.attempts == 3 and delays == [1.0, 2.0]  # max_retries=2: three attempts, two spaced retries
    (dead,) = store.dead_letters()
    assert dead.message.id == h.id
    info = decode_error(dead.error)
    assert info.type == "RuntimeError" and info.message == "boom 5"


def _sig_cases() -> list[Any]:
    def f1(a, b=1): ...  # type: ignore[no-untyped-def]
    def f2(a, /, b): ...  # type: ignore[no-untyped-def]
    def f3(*a): ...  # type: ignore[no-untyped-def]
    def f4(a, *, k): ...  # type: ignore[no-untyped-def]
    def f5(a, *, k=1): ...  # type: ignore[no-untyped-def]
    def f6(**kw): ...  # type: ignore[no-untyped-def]
    def f7(): ...  # type: ignore[no-untyped-def]
    def f8(a, b=2, *rest, k=3, **kw): ...  # type: ignore[no-untyped-def]

    return [f1, f2, f3, f4, f5, f6, f7, f8]


@pytest.mark.parametrize("fn", _sig_cases(), ids=lambda f: f.__name__)
def test_the_argument_check_agrees_with_signature_bind(fn: Any) -> None:
    import inspect

    t = task(fn, name="sig", registry=Registry())
    for n in range(5):
        args = tuple(range(n))
        for kwargs in ({}, {"k": 1}, {"b": 1}):
            try:
                inspect.signature(fn).bind(*args, **kwargs)
                fits = True
            except TypeError:
                fits = False
            p = StorePool()
            if fits:
                t.publish(*args, _pool=p, **kwargs)
            else:
                with pytest.raises(TaskArgumentError):
                    t.publish(*args, _pool=p, **kwargs)


def test_a_batch_is_built_with_the_collector_paused_and_then_as_it_was(pool: StorePool) -> None:
    import gc

    from conveyor.gc_policy import gc_paused

    seen: list[bool] = []

    def items() -> Iterator[tuple[Any, ...]]:
        for x in (1, {2}, 3):  # a set is not plain data: that message is pickled, its neighbours are not
            seen.append(gc.isenabled())
            yield (x,)

    assert gc.isenabled()
    add.publish_many(items())
    assert seen == [False] * 3 and gc.isenabled()
    got = sorted(pool.take(), key=lambda m: m.id)
    assert [m.headers[H_CONTENT_TYPE] for m in got] == ["msgpack", "pickle", "msgpack"]
    assert [decode_call(m.payload, m.headers).args for m in got] == [(1,), ({2},), (3,)]
    gc.disable()  # a process that turned it off itself keeps it off
    try:
        add.publish(4)
        assert not gc.isenabled()
    finally:
        gc.enable()
    # threads publishing at once: the collector comes back once the last is done, whatever the order
    inside, leave = threading.Barrier(2), threading.Event()

    def publisher() -> None:
        with gc_paused():
            inside.wait(10)
            leave.wait(10)

    t = threading.Thread(target=publisher)
    t.start()
    with gc_paused():
        inside.wait(10)
    assert not gc.isenabled()  # the other is still inside
    leave.set()
    t.join(10)
    assert gc.isenabled()


def test_a_process_forked_during_a_pause_has_its_collector_back() -> None:
    import gc
    import multiprocessing

    from conveyor.gc_policy import gc_paused

    ctx = multiprocessing.get_context("fork")
    said: Any = ctx.SimpleQueue()
    with gc_paused():
        child = ctx.Process(target=lambda: said.put(gc.isenabled()))
        child.start()
        child.join(30)
    assert child.exitcode == 0 and said.get() is True and gc.isenabled()
