"""`conveyor inspect`: what each consumer runs now and since when, across the servers of a pool."""

from __future__ import annotations

import json

import click
from rich.markup import escape
from rich.table import Table

from conveyor.cli.connecting import Connection, connect_options, open_pool
from conveyor.cli.stats import EXIT_SERVER_DOWN
from conveyor.cli.tables import stdout_console
from conveyor.client.sharded import format_id
from conveyor.constants import TASK_PAGE_MAX
from conveyor.errors import ConveyorError
from conveyor.protocol.task_pages import TaskPage, TaskRecord, TaskState

UNNAMED = "(unnamed)"  # a delivery to a client that gave no consumer name


@click.command()
@connect_options
@click.option("-Q", "--queue", default=None, help="Only this queue.")
@click.option("--task", "task_name", default=None, help="Only this task name.")
@click.option("--consumer", default=None, help="Only this consumer.")
@click.option(
    "--limit",
    default=TASK_PAGE_MAX,
    show_default=True,
    type=click.IntRange(1, TASK_PAGE_MAX),
    help="Show at most this many tasks, those running longest first.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON: each running task, and the servers that did not answer.")
@click.option(
    "--timeout",
    "timeout_s",
    default=3.0,
    show_default=True,
    type=click.FloatRange(0, min_open=True),
    help="Seconds to wait for a server (to connect, then to answer) before leaving it out.",
)
def inspect(
    conn: Connection,
    queue: str | None,
    task_name: str | None,
    consumer: str | None,
    limit: int,
    as_json: bool,
    timeout_s: float,
) -> None:
    """Show what each consumer runs now, and since when.

    One row per task delivered and not yet settled, from the servers' records: the consumer that
    holds it, its queue, task name, message id, attempt, and how long it has run.

    Exit status: 0 when every server answered; 3 when one did not (after showing the others); 1 on
    other errors, such as a --queue no server has.
    """
    with open_pool(conn, connect_timeout=timeout_s, timeout=timeout_s) as pool:
        try:
            page = pool.queues.tasks(queue, task=task_name, state=TaskState.RUNNING, limit=TASK_PAGE_MAX)
        except ConveyorError as e:
            raise click.ClickException(str(e)) from None
    rows = [r for r in page.running if consumer is None or r.consumer == consumer]
    rows = sorted(rows, key=lambda r: r.delivered_at)[:limit]
    if as_json:
        click.echo(json.dumps(_as_json(page, rows), indent=2))
    else:
        stdout_console().print(_table(page, rows))
        for address, error in page.unreachable.items():
            click.echo(f"{address} did not answer: {error}", err=True)
    if page.unreachable:
        click.get_current_context().exit(EXIT_SERVER_DOWN)


def _table(page: TaskPage, rows: list[TaskRecord]) -> Table:
    consumers = len({r.consumer for r in rows})
    title = f"Running: {len(rows):,} task(s) on {consumers:,} consumer(s)"
    if page.running_total > len(page.running):
        title += f" ({len(page.running):,} of {page.running_total:,} shown: the servers answer at most {TASK_PAGE_MAX:,} each)"
    t = Table(title=title)
    for col in ("consumer", "queue", "task"):
        t.add_column(col, overflow="fold")
    for col in ("id", "attempt", "running for"):
        t.add_column(col, justify="right")
    for r in sorted(rows, key=lambda r: (r.consumer, r.delivered_at)):
        t.add_row(
            escape(r.consumer or UNNAMED), escape(r.queue), escape(r.task), format_id(r.id), str(r.attempt), duration(r.runtime_s)
        )
    return t


def _as_json(page: TaskPage, rows: list[TaskRecord]) -> dict[str, object]:
    return {
        "running": [
            {
                "consumer": r.consumer,
                "queue": r.queue,
                "task": r.task,
                "id": format_id(r.id),
                "attempt": r.attempt,
                "delivered_at": r.delivered_at,
                "running_s": round(r.runtime_s, 3),
            }
            for r in rows
        ],
        "running_total": page.running_total,
        "unreachable": page.unreachable,
    }


def duration(seconds: float) -> str:
    """A time span as a person reads it: "850 ms", "12.5 s", "3 min 20 s", "2 h 05 min"."""
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, s = divmod(int(seconds), 60)
    if minutes < 60:
        return f"{minutes} min {s:02d} s"
    return f"{minutes // 60} h {minutes % 60:02d} min"
