"""ConsumerOptions: declared once, taken by every entry point under the same names, checked as it is made."""

from __future__ import annotations

import dataclasses
import inspect
import math
import sys
import typing
from collections.abc import Callable
from typing import Any

import click
import pytest

import conveyor
import conveyor.spark
from conveyor.cli.worker import worker
from conveyor.client.in_process import InProcessQueues
from conveyor.constants import DEFAULT_SHUTDOWN_TIMEOUT_S
from conveyor.errors import ConfigError
from conveyor.spark.consumers import SparkConsumerPool
from conveyor.worker.consumer import Consumer
from conveyor.worker.consumer_pool import ConsumerPool
from conveyor.worker.options import ConsumerKeywords, ConsumerOptions, options_of, process_shutdown_timeout
from conveyor.worker.runtime import run_worker
from conveyor.worker.selectors import ReducedLottery

FIELDS = {f.name: f for f in dataclasses.fields(ConsumerOptions)}
ENTRY_POINTS: dict[str, Callable[..., Any]] = {
    "Consumer": Consumer,
    "ConsumerPool": ConsumerPool,
    "SparkConsumerPool": SparkConsumerPool,
    "conveyor.spark.map": conveyor.spark.map,
    "conveyor.spark.map_batches": conveyor.spark.map_batches,
    "run_worker": run_worker,
}
# the command line cannot give Python objects
NOT_ON_THE_COMMAND_LINE = {"middleware"}


def test_the_keywords_are_the_fields_with_their_types() -> None:
    assert typing.get_type_hints(ConsumerKeywords) == {name: typing.get_type_hints(ConsumerOptions)[name] for name in FIELDS}


@pytest.mark.parametrize("name", ENTRY_POINTS)
def test_every_entry_point_takes_the_options_and_declares_none_of_its_own(name: str) -> None:
    """Each takes `options=` and `**keywords: Unpack[ConsumerKeywords]`; no parameter of its own repeats an option."""
    sig = inspect.signature(ENTRY_POINTS[name])
    params = sig.parameters
    assert "options" in params and params["options"].default is None
    keywords = [p for p in params.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
    assert len(keywords) == 1 and keywords[0].annotation == "Unpack[ConsumerKeywords]"
    named = {p.name for p in params.values() if p.kind is not inspect.Parameter.POSITIONAL_ONLY}
    assert not named & FIELDS.keys(), f"{name} declares {sorted(named & FIELDS.keys())} itself: they are ConsumerOptions'"


@pytest.mark.skipif(sys.version_info < (3, 11), reason="typing.get_overloads is 3.11+")
@pytest.mark.parametrize("entry", [conveyor.spark.map, conveyor.spark.map_batches], ids=["map", "map_batches"])
def test_the_overloads_of_map_take_them_too(entry: Callable[..., Any]) -> None:
    for overload in typing.get_overloads(entry):
        params = inspect.signature(overload).parameters
        assert "options" in params and not params.keys() & FIELDS.keys()
        assert any(
            p.kind is inspect.Parameter.VAR_KEYWORD and p.annotation == "Unpack[ConsumerKeywords]" for p in params.values()
        )


def test_the_worker_command_has_an_option_for_each_with_the_same_default() -> None:
    params = {p.name: p for p in worker.params if isinstance(p, click.Option)}
    missing = FIELDS.keys() - NOT_ON_THE_COMMAND_LINE - params.keys()
    assert not missing, f"conveyor worker has no option for {sorted(missing)}"
    for name in FIELDS.keys() - NOT_ON_THE_COMMAND_LINE:
        default = params[name].get_default(click.Context(worker))
        if name == "selector":  # None: the settings module's QUEUE_SELECTOR, itself ReducedLottery by default
            assert default is None
        elif name == "shutdown_timeout":  # None: 30 s where the process ends with its consumers, as a worker's does
            assert default == DEFAULT_SHUTDOWN_TIMEOUT_S
        else:
            assert default == FIELDS[name].default, name
    # named after the fields, with Celery's short flags beside
    assert params["concurrency"].opts == ["-c", "--concurrency"] and params["pool"].opts == ["-P", "--pool"]


@pytest.mark.parametrize(
    ("given", "error"),
    [
        ({"concurrency": 0}, r"concurrency must be an integer >= 1"),
        ({"concurrency": "8"}, r"concurrency must be an integer >= 1"),
        ({"pool": "fibers"}, r"pool must be 'thread', 'process' or 'async', where tasks run, got 'fibers'"),
        ({"pool": object()}, r"or queue_pool= for map and SparkConsumerPool"),
        ({"batch_size": 0}, r"batch_size must be an integer >= 1"),
        ({"task_modules": "myapp.tasks"}, r"task_modules must be a list of module names"),
        ({"middleware": [object()]}, r"middleware must be a list of Middleware instances"),
        ({"pin_core": "yes"}, r"pin_core must be True or False \(or None\)"),
        ({"pin_core": True, "pool": "process"}, r"pin_core is for pool='thread'"),
        ({"early_ack": 1}, r"early_ack must be True or False"),
        ({"shutdown_timeout": -1}, r"shutdown_timeout must be a number of seconds >= 0"),
    ],
)
def test_a_bad_value_is_refused_naming_the_option(given: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        ConsumerOptions(**given)


def test_an_unknown_selector_is_refused_as_the_options_are_made() -> None:
    with pytest.raises(ConfigError, match="unknown queue selector 'Fastest'"):
        ConsumerOptions(selector="Fastest")


def test_lists_become_tuples_and_the_options_are_frozen() -> None:
    o = ConsumerOptions(task_modules=["a.tasks"], middleware=[])
    assert o.task_modules == ("a.tasks",) and o.middleware == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        o.concurrency = 4  # type: ignore[misc]


def test_a_misspelt_or_old_keyword_is_a_type_error_naming_it() -> None:
    """The old names are gone, not aliased: `max_concurrency` is a TypeError as any unknown keyword."""
    with pytest.raises(TypeError, match=r"ConsumerPool\(\) got an unexpected keyword argument 'max_concurrency'"):
        options_of("ConsumerPool", None, {"max_concurrency": 4})  # type: ignore[typeddict-unknown-key]
    with pytest.raises(TypeError, match=r"Consumer\(\) got an unexpected keyword argument 'concurency'"):
        Consumer(None, ["jobs"], concurency=4)  # type: ignore[arg-type, call-arg]  # refused before the pool is used


def test_keywords_beside_options_take_their_place() -> None:
    base = ConsumerOptions(concurrency=4, batch_size=2)
    assert options_of("x", base, {}) is base
    assert options_of("x", base, {"concurrency": 8}) == ConsumerOptions(concurrency=8, batch_size=2)
    with pytest.raises(ValueError, match="concurrency must be"):
        options_of("x", base, {"concurrency": 0})


def test_the_shutdown_timeout_is_30_s_only_where_the_process_ends_with_its_consumers() -> None:
    """Left out, a Consumer (or Spark's) waits for its running tasks: a task thread handed back would run twice."""
    assert ConsumerOptions().shutdown_timeout is None
    assert process_shutdown_timeout(None) == DEFAULT_SHUTDOWN_TIMEOUT_S
    assert process_shutdown_timeout(math.inf) == math.inf and process_shutdown_timeout(0) == 0


def test_old_meaning_of_concurrency_gets_a_hint() -> None:
    with pytest.raises(ValueError, match="where tasks run is pool="):
        ConsumerOptions(concurrency="process")  # type: ignore[arg-type]


def test_a_selector_instance_is_refused_where_each_consumer_would_get_a_copy() -> None:
    with pytest.raises(ValueError, match="not an instance"):
        ConsumerPool(InProcessQueues(), 1, selector=ReducedLottery())
    with pytest.raises(ValueError, match="not an instance"):  # refused before Spark is asked for anything
        SparkConsumerPool(None, selector=ReducedLottery())  # type: ignore[arg-type]


def test_spark_consumers_refuse_early_acks() -> None:
    with pytest.raises(ValueError, match="early_ack is for ConsumerPool"):
        SparkConsumerPool(None, early_ack=True)  # type: ignore[arg-type]


def test_a_spark_entry_point_refuses_a_selector_instance_in_its_own_name() -> None:
    from conveyor.spark.job import JobSettings

    with pytest.raises(ValueError, match=r"^map: selector must be a name or a QueueSelector class"):
        JobSettings("map", ConsumerOptions(selector=ReducedLottery()))


def test_spark_consumers_refuse_in_the_name_of_the_entry_point_that_runs_them() -> None:
    with pytest.raises(ValueError, match=r"^map: selector must be a name or a QueueSelector class"):
        SparkConsumerPool(None, where="map", selector=ReducedLottery())  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"^map: early_ack is for ConsumerPool"):
        SparkConsumerPool(None, where="map", early_ack=True)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^map\(\) got an unexpected keyword argument 'lease'"):
        SparkConsumerPool(None, where="map", lease=3)  # type: ignore[arg-type,call-arg]


def test_a_consumer_built_alone_pins_only_when_asked() -> None:
    with InProcessQueues() as b:
        assert Consumer(b, ["jobs"]).pin_core is False
        assert Consumer(b, ["jobs"], pin_core=True).pin_core is True
