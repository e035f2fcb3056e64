"""`conveyor call`: publish a task by its name, as `celery call` does, and with --wait print its result.

The task's module is not imported: a message names its task (the envelope and the `task` header),
and a worker that runs it looks the name up. A name no worker knows ends in the dead letters, with
the worker's error saying so (shown by --wait).
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from conveyor.cli.connecting import Connection, connect_options, open_pool
from conveyor.client.sharded import format_id
from conveyor.constants import DEFAULT_QUEUE, MAX_DELAY_S, PRIORITY_MAX, PRIORITY_MIN
from conveyor.errors import ConveyorError, TaskFailedError
from conveyor.tasks.options import TaskOptions
from conveyor.tasks.publish import publish_calls

EXIT_TIMEOUT = 124  # --wait: no result within --timeout (as timeout(1) exits)


def _argument(text: str) -> Any:
    """An argument as given: its JSON value, or the text itself when it is not JSON (`hello`, `a.png`)."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _keywords(ctx: click.Context, param: click.Parameter, value: str | None) -> dict[str, Any]:
    if value is None:
        return {}
    try:
        kwargs = json.loads(value)
    except ValueError as e:
        raise click.BadParameter(f"not JSON: {e}") from None
    if not isinstance(kwargs, dict):
        raise click.BadParameter(f'a JSON object of argument names to values, such as {{"size": 3}}, not {value}')
    return kwargs


def _shown(value: object) -> str:
    """A result as JSON where it is JSON's, else as Python writes it."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


@click.command()
@connect_options
@click.argument("task")
@click.argument("args", nargs=-1)
@click.option(
    "--kwargs",
    callback=_keywords,
    metavar="JSON",
    help="Keyword arguments, as a JSON object: --kwargs '{\"size\": 3}'.",
)
@click.option("-Q", "--queue", default=DEFAULT_QUEUE, show_default=True, help="The queue to put it on (its task's queue).")
@click.option(
    "--priority",
    type=click.IntRange(PRIORITY_MIN, PRIORITY_MAX),
    default=None,
    help="Its priority within the queue (higher first) [default: 0].",
)
@click.option(
    "--countdown",
    "--delay",
    "countdown",
    type=click.FloatRange(0, MAX_DELAY_S),
    default=None,
    help="Run it no sooner than this many seconds from now.",
)
@click.option("--wait", is_flag=True, help="Wait for its result and print it (its error, and exit status 1, if it failed).")
@click.option(
    "--timeout",
    default=60.0,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help=f"With --wait: give up after this many seconds (exit status {EXIT_TIMEOUT}); the task stays queued.",
)
def call(
    conn: Connection,
    task: str,
    args: tuple[str, ...],
    kwargs: dict[str, Any],
    queue: str,
    priority: int | None,
    countdown: float | None,
    wait: bool,
    timeout: float,
) -> None:
    """Publish a call of TASK (its registered name, such as myapp.tasks.resize) and print its message id.

    Each of ARGS is a JSON value (3, 2.5, true, null, "text", [1, 2], {"k": 1}), or, when it is not
    JSON, the text as given. The task's module is not imported here: the worker that runs it looks
    TASK up, and a name it does not know goes to the dead letters with its error (--wait shows it).

    With --wait, print its result as JSON (as Python writes it when it is not JSON's) once a worker
    has run it; exit status 1 with its error on stderr if it failed, 124 if no result came within
    --timeout.
    """
    call_args = tuple(_argument(a) for a in args)
    ctx = click.get_current_context()
    with open_pool(conn) as pool:
        try:
            options = TaskOptions(queue=queue)
            [handle] = publish_calls(task, options, None, [(call_args, kwargs, None)], countdown, priority, None, pool)
        except ConveyorError as e:
            raise click.ClickException(str(e)) from None
        click.echo(format_id(handle.id))
        if not wait:
            return
        sys.stdout.flush()  # the id first, whatever the wait brings
        try:
            [result] = pool.gather([handle], timeout=timeout)
        except TaskFailedError as e:
            click.echo(f"{format_id(handle.id)} failed: {e.error}", err=True)
            ctx.exit(1)
        except TimeoutError:
            click.echo(f"{format_id(handle.id)}: no result within {timeout:g} s (it stays queued)", err=True)
            ctx.exit(EXIT_TIMEOUT)
        except ConveyorError as e:
            raise click.ClickException(str(e)) from None
    click.echo(_shown(result))
