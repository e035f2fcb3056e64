"""Tables the command line prints: queue stats and dead letters."""

from __future__ import annotations

import datetime

from rich.table import Table

from conveyor.client.pool import QueuePool


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1024
    raise AssertionError


def stats_table(pool: QueuePool, queue: str | None = None, per_shard: bool = False) -> Table:
    t = Table(title=f"Queues on {len(pool)} server(s)")
    for col in ("queue", *(["shard"] if per_shard else []), "ready", "delivered", "delayed", "acked", "failed",
                "put/s", "ack/s", "on disk"):  # fmt: skip
        t.add_column(col, justify="left" if col in ("queue", "shard") else "right")
    rows = [(s, st) for s, per in enumerate(pool.shard_stats(queue)) for st in per.values()] if per_shard \
        else [(None, st) for st in pool.stats(queue).values()]  # fmt: skip
    for shard, st in sorted(rows, key=lambda r: (r[1].queue, r[0] or 0)):
        t.add_row(st.queue, *([pool.addresses[shard]] if shard is not None else []), f"{st.ready:,}",
                  f"{st.delivered:,}", f"{st.delayed:,}", f"{st.acked:,}",
                  f"[red]{st.failed:,}[/]" if st.failed else "0", f"{st.put_rate:,.0f}", f"{st.ack_rate:,.0f}",
                  _size(st.bytes_on_disk))  # fmt: skip
    if not rows:
        t.caption = "no queues yet"
    return t


def _preview(payload: bytes, width: int = 40) -> str:
    """Payloads are opaque bytes: show their size and a printable prefix, never decode them."""
    text = "".join(chr(b) if 32 <= b < 127 else "." for b in payload[:width])
    return f"{len(payload):,} B  {text}{'…' if len(payload) > width else ''}"


def dead_letter_table(pool: QueuePool, queue: str, limit: int) -> Table:
    dls = pool.dead_letters(queue)
    t = Table(title=f"Dead letters of {queue!r}: {len(dls):,}" + (f" (first {limit:,} shown)" if len(dls) > limit else ""))
    for col in ("id", "shard", "attempts", "failed at", "error", "payload"):
        t.add_column(col, overflow="fold")
    for d in dls[:limit]:
        shard, local = pool.split_id(d.message.id)
        when = datetime.datetime.fromtimestamp(d.failed_at).isoformat(sep=" ", timespec="seconds")
        error = d.error.strip().splitlines()[-1] if d.error.strip() else ""
        t.add_row(str(local), str(shard), str(d.message.attempts), when, error, _preview(d.message.payload))
    return t


def workers_table(pool: QueuePool) -> Table | None:
    """The consumers heard from in the last minute, with their counts (None when there are none)."""
    workers = pool.workers()
    if not workers:
        return None
    t = Table(title=f"Consumers: {len(workers)}")
    for col in ("consumer", "processed", "failed", "retried", "dead", "running", "stolen", "seen"):
        t.add_column(col, justify="left" if col == "consumer" else "right")
    for name, c in sorted(workers.items()):
        t.add_row(name, *(f"{int(c.get(k, 0)):,}" for k in ("processed", "failed", "retried", "dead", "running", "stolen")),
                  f"{c['seen']:.0f} s ago")  # fmt: skip
    return t
