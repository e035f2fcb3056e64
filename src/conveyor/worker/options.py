"""`ConsumerOptions`: how a consumer fetches and runs tasks, declared once for every way to start one.

`Consumer`, `ConsumerPool`, `SparkConsumerPool`, `conveyor.spark.map`, `run_worker` and
`conveyor worker` all take these options, and only these: one name, one type and one default each,
checked once (here, in `__post_init__`). The words are Celery's: `concurrency` is how many tasks one
consumer runs at once, `pool` is where they run (threads, child processes, or coroutines on one event
loop); on the command line `--concurrency N` and `--pool thread|process|async`.

What belongs to an entry point instead is how long its run lasts and who it is: `until_empty`,
`unreachable_s` (when to give up on a server out of reach: a consumer's own check, `join`'s, the Spark
job's watch), the consumer's index among `n_consumers`, a `ConsumerPool`'s `restart` and `hooks`, a
map's retries and lease.

How the options reach an entry point: as a `ConsumerOptions` (`options=`), as keywords of the same
names, or both (the keywords then take the place of the given options' values). The keywords are
typed by `ConsumerKeywords` (`**keywords: Unpack[ConsumerKeywords]`), so mypy checks each call's
names and types as it would plain parameters, while the names and defaults stay declared here only;
at run time a name that is not an option is a `TypeError` naming it, never swallowed (`options_of`).
Plain keyword parameters on each entry point would repeat the 9 names and defaults 6 times over;
`**kwargs: Any` would lose both the type check and the typo's error. `ConsumerKeywords` repeats the
names and types (a TypedDict cannot be derived from a dataclass for mypy), and
`tests/worker/test_consumer_options.py` checks that it, every entry point and the CLI agree with the fields.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, TypedDict

from conveyor.constants import DEFAULT_SELECTOR, DEFAULT_SHUTDOWN_TIMEOUT_S
from conveyor.worker.affinity import check_pin
from conveyor.worker.middleware import Middleware
from conveyor.worker.selectors import QueueSelector, selector_class

Pool = Literal["thread", "process", "async"]  # where a consumer's tasks run
POOLS: tuple[Pool, ...] = ("thread", "process", "async")


@dataclass(frozen=True, slots=True)
class ConsumerOptions:
    """How each consumer fetches and runs tasks (see the module docstring); checked as it is made."""

    # tasks one consumer runs at once (its slots); None: 8 threads (grown, up to 128, while its tasks wait), or child
    # processes for its share of the cores plus one, and it may fetch quick tasks beyond its slots (read-ahead); given,
    # it also bounds the messages a consumer holds
    concurrency: int | None = None
    # where tasks run: "thread", or "process" (child processes: CPU-bound work; a task over its time limit is killed),
    # or "async" (coroutines on one event loop: I/O-bound work, `concurrency` calls in flight, by default 256)
    pool: Pool = "thread"
    # most messages one fetch takes; None: each queue's own batch_size
    batch_size: int | None = None
    # how a consumer picks the queue to fetch from: a name in SELECTORS, a dotted path, a QueueSelector class or instance
    selector: str | type[QueueSelector] | QueueSelector = DEFAULT_SELECTOR
    # modules each consumer imports before it starts, so their tasks register
    task_modules: Sequence[str] = ()
    # around each task, in order; None: Retries and TimeLimits (conveyor.worker.middleware)
    middleware: Sequence[Middleware] | None = None
    # (pool "thread") each consumer on a core of its own while one is free; None: when there are as many consumers as
    # cores (ConsumerPool, Spark, conveyor worker: they know how many share the host), never for a Consumer built alone
    pin_core: bool | None = None
    # ack each message as it is delivered, before it runs: at most once (a crash loses it), no read-ahead, no lease extended
    early_ack: bool = False
    # after a graceful stop, tasks still running this long (seconds) are handed back, the attempt not counted; None: 30 s
    # (DEFAULT_SHUTDOWN_TIMEOUT_S) where the consumer's process ends with it (ConsumerPool, run_worker, conveyor worker),
    # no limit in-process (Consumer, Spark), where a task thread cannot be stopped and, handed back, would run twice;
    # math.inf: no limit anywhere
    shutdown_timeout: float | None = None

    def __post_init__(self) -> None:
        """Refuse a bad value with the option's name and what it may be; lists become tuples."""
        for name in ("concurrency", "batch_size"):
            v = getattr(self, name)
            if v is not None and (type(v) is not int or v < 1):
                where = " (where tasks run is pool=; concurrency is a count)" if v in POOLS else ""
                raise ValueError(f"{name} must be an integer >= 1 (or None for the default), got {v!r}{where}")
        if self.pool not in POOLS:
            servers = (
                ""
                if isinstance(self.pool, str)
                else " (the queue servers are the first argument, or queue_pool= for map and SparkConsumerPool)"
            )
            raise ValueError(f"pool must be 'thread', 'process' or 'async', where tasks run, got {self.pool!r}{servers}")
        if not isinstance(self.selector, QueueSelector):
            selector_class(self.selector)  # a ConfigError names an unknown selector, or one that does not import
        if isinstance(self.task_modules, str) or not all(type(m) is str for m in self.task_modules):
            raise ValueError(f"task_modules must be a list of module names, got {self.task_modules!r}")
        object.__setattr__(self, "task_modules", tuple(self.task_modules))
        if self.middleware is not None:
            if not all(isinstance(m, Middleware) for m in self.middleware):
                raise ValueError(f"middleware must be a list of Middleware instances (or None), got {self.middleware!r}")
            object.__setattr__(self, "middleware", tuple(self.middleware))
        for name in ("pin_core", "early_ack"):
            v = getattr(self, name)
            if not (type(v) is bool or (v is None and name == "pin_core")):
                raise ValueError(f"{name} must be True or False{' (or None)' if name == 'pin_core' else ''}, got {v!r}")
        check_pin(self.pin_core, self.pool)
        t = self.shutdown_timeout
        if t is not None and (type(t) not in (int, float) or not t >= 0):
            raise ValueError(f"shutdown_timeout must be a number of seconds >= 0 (math.inf: no limit; or None), got {t!r}")


def process_shutdown_timeout(timeout: float | None) -> float:
    """The shutdown timeout of consumers whose process ends with them (ConsumerPool, run_worker): None is 30 s.

    There a task thread still running when the time is up ends with the process, so handing its task
    back cannot run it twice.
    """
    return DEFAULT_SHUTDOWN_TIMEOUT_S if timeout is None else timeout


class ConsumerKeywords(TypedDict, total=False):
    """`ConsumerOptions`' fields as keywords of an entry point: the same names and types (checked by a test)."""

    concurrency: int | None
    pool: Pool
    batch_size: int | None
    selector: str | type[QueueSelector] | QueueSelector
    task_modules: Sequence[str]
    middleware: Sequence[Middleware] | None
    pin_core: bool | None
    early_ack: bool
    shutdown_timeout: float | None


OPTION_NAMES = tuple(f.name for f in dataclasses.fields(ConsumerOptions))


def options_of(where: str, options: ConsumerOptions | None, keywords: ConsumerKeywords) -> ConsumerOptions:
    """The options an entry point was given: `options` (default: the defaults), with the `keywords` given in their place.

    A keyword that is not an option is a TypeError naming it, as for any function.
    """
    unknown = sorted(keywords.keys() - set(OPTION_NAMES))
    if unknown:
        raise TypeError(
            f"{where}() got an unexpected keyword argument {unknown[0]!r} (the consumer options are: {', '.join(OPTION_NAMES)})"
        )
    if options is None:
        return ConsumerOptions(**keywords)
    if not isinstance(options, ConsumerOptions):
        raise TypeError(f"{where}(): options must be a ConsumerOptions, got {type(options).__name__}")
    return dataclasses.replace(options, **keywords) if keywords else options


def refuse_shared_selector(where: str, options: ConsumerOptions) -> None:
    """Refuse a selector instance where it would be copied to each consumer (with the same random state).

    Copies made by pickling draw the same lottery numbers, so the consumers would pick queues in
    lockstep; a name or a class lets each consumer make its own.
    """
    if isinstance(options.selector, QueueSelector):
        raise ValueError(
            f"{where}: selector must be a name or a QueueSelector class, not an instance: "
            "each consumer makes its own (copies of one instance draw the same numbers)"
        )
