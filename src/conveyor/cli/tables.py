"""Tables the command line prints (servers, queue stats, consumers, dead letters), and the console they go to."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from conveyor.client.pool import QueuePool
from conveyor.client.sharded import format_id
from conveyor.message import printable
from conveyor.protocol.report import FIGURES, SEEN, ConsumerReport, Shown
from conveyor.protocol.requests import QueueStats, ServerStats

PIPE_WIDTH = 100_000  # columns of a console into a file or a pipe: more than any line needs


def stdout_console() -> Console:
    """A console for stdout that, into a file or a pipe, is as wide as what it prints.

    Into a file or a pipe rich would print 80 columns; here a table fits its content, and no queue or
    consumer name is cut or folded.
    """
    console = Console()
    if not console.is_terminal:
        console.width = PIPE_WIDTH
    return console


Answers = Sequence[ServerStats | Exception]  # each server's stats reply, or the error it gave (shard order)


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError


def servers_table(addresses: Sequence[str], got: Answers) -> Table:
    """A row per server: UP with what it holds, or DOWN with the error it gave.

    The other tables then show the servers that answered.
    """
    down = sum(isinstance(g, Exception) for g in got)
    t = Table(title=f"Servers: {len(got) - down} up" + (f", [bold red]{down} down[/]" if down else ""))
    for col in ("server", "state", "queues", "consumers", "error"):
        t.add_column(col, overflow="fold")
    for address, g in zip(addresses, got, strict=True):
        if isinstance(g, Exception):
            t.add_row(address, "[bold red]DOWN[/]", "", "", escape(str(g) or type(g).__name__))
        else:
            t.add_row(address, "[green]UP[/]", f"{len(g.queues):,}", f"{len(g.workers):,}", "")
    return t


def stats_table(addresses: Sequence[str], got: Answers, queue: str | None = None, per_shard: bool = False) -> Table:
    """Each queue's counts and rates, summed over the servers that answered (or one row per server)."""
    up = [(s, g) for s, g in enumerate(got) if not isinstance(g, Exception)]
    t = Table(title=f"Queues on {len(up)} of {len(got)} server(s)" if len(up) < len(got) else f"Queues on {len(got)} server(s)")
    for col in (
        "queue",
        *(["shard"] if per_shard else []),
        "ready",
        "delivered",
        "delayed",
        "acked",
        "failed",
        "put/s",
        "ack/s",
        "on disk",
    ):
        named = col in ("queue", "shard")  # a name is folded, never cut
        t.add_column(col, justify="left" if named else "right", overflow="fold" if named else "ellipsis")
    rows: list[tuple[int | None, QueueStats]] = [(s, st) for s, g in up for q, st in g.queues.items() if queue in (None, q)]
    if not per_shard:
        summed: dict[str, QueueStats] = {}
        for _, st in rows:
            summed[st.queue] = summed[st.queue] + st if st.queue in summed else st
        rows = [(None, st) for st in summed.values()]
    for shard, st in sorted(rows, key=lambda r: (r[1].queue, r[0] or 0)):
        t.add_row(
            st.queue,
            *([addresses[shard]] if shard is not None else []),
            f"{st.ready:,}",
            f"{st.delivered:,}",
            f"{st.delayed:,}",
            f"{st.acked:,}",
            f"[red]{st.failed:,}[/]" if st.failed else "0",
            f"{st.put_rate:,.0f}",
            f"{st.ack_rate:,.0f}",
            _size(st.bytes_on_disk),
        )
    if not rows:
        t.caption = "no queues yet" if queue is None else f"no queue named {queue!r}"
    return t


def _preview(payload: bytes, width: int = 40) -> str:
    """Payloads are opaque bytes: show their size and a printable prefix, never decode them."""
    return f"{len(payload):,} B  {printable(payload, width)}"


def dead_letter_table(pool: QueuePool, queue: str, limit: int) -> Table:
    dls = pool.dead_letters(queue)
    t = Table(title=f"Dead letters of {queue!r}: {len(dls):,}" + (f" (first {limit:,} shown)" if len(dls) > limit else ""))
    for col in ("id", "attempts", "failed at", "error", "payload"):
        t.add_column(col, overflow="fold")
    for d in dls[:limit]:
        when = datetime.datetime.fromtimestamp(d.failed_at).isoformat(sep=" ", timespec="seconds")
        error = d.error.strip().splitlines()[-1] if d.error.strip() else ""
        t.add_row(format_id(d.message.id), str(d.message.attempts), when, escape(error), escape(_preview(d.message.payload)))
    return t


_SHOWN = (Shown.TOTAL, Shown.NOW)  # the figures of a consumer's report in its row


def workers_table(got: Answers) -> Table | None:
    """The consumers the servers heard from within WORKER_GONE_S, with their host and counts (None when there are none).

    A consumer reports to every server: the latest report is shown, with every figure of the report
    but which process it is (`conveyor.protocol.report`).
    """
    workers: dict[str, ConsumerReport] = {}
    for g in got:
        if isinstance(g, Exception):
            continue
        for name, c in g.workers.items():
            r = ConsumerReport.from_counts(name, c)
            if name not in workers or r.seen < workers[name].seen:
                workers[name] = r
    if not workers:
        return None
    t = Table(title=f"Consumers: {len(workers)}")
    for col in ("consumer", "host"):
        t.add_column(col, justify="left", overflow="fold")
    for col in [*(name for name, f in FIGURES.items() if f.shown in _SHOWN), SEEN]:
        t.add_column(col, justify="right", overflow="ellipsis")
    for _, r in sorted(workers.items()):
        figures = r.figures(*_SHOWN).values()
        t.add_row(escape(r.consumer), escape(r.host), *(f"{n:,}" for n in figures), f"{r.seen:.0f} s ago")
    return t
