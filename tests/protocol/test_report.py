"""The consumer report, declared once (`conveyor.protocol.report`), and every reader of it.

A report with a distinct value in every field goes through a real server; each reader (server
metrics, `conveyor stats`, the dashboard, Spark's consumer stats) must show every figure the
declaration says it shows, with its value. A figure added to the declaration is checked here with
no change to this file. And no module but the declaration spells the report's wire layout.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from rich.console import Console

from conveyor import constants
from conveyor.cli.tables import workers_table
from conveyor.client.pool import QueuePool
from conveyor.constants import TASK_SECONDS_BUCKETS
from conveyor.dashboard.state import PoolWatch
from conveyor.protocol import requests as calls
from conveyor.protocol.histograms import Histogram
from conveyor.protocol.report import FIGURES, ConsumerReport, Rows, Shown
from conveyor.spark.consumers import STATS_DDL, ConsumerRow

from ..server.test_metrics import scrape, value
from ..support.servers import ThreadServer, thread_server, wait_for

pytestmark = pytest.mark.timeout(60)

SRC = Path(__file__).resolve().parents[2] / "src" / "conveyor"


def _sample() -> ConsumerReport:
    """A report whose every figure has a value of its own (1001, 1002, ...), so a reader showing one for another is caught."""
    h = Histogram(TASK_SECONDS_BUCKETS)
    for v in (0.002, 0.3, 7.0):
        h.observe(v)
    return ConsumerReport(
        "spark:box:job:3:4242",
        "box.example",
        **{name: 1001 + i for i, name in enumerate(FIGURES)},
        serves=("a", "b"),
        rows={"map-x": Rows(5, 500)},
        task_seconds=h,
    )


@pytest.fixture
def reported(tmp_path: Path) -> Iterator[tuple[ThreadServer, QueuePool, ConsumerReport]]:
    r = _sample()
    with thread_server(data_dir=tmp_path / "data", metrics_port=0) as s, QueuePool.connect([s.address]) as pool:
        pool.queues.report(r.consumer, r.to_counts())
        yield s, pool, r


def _shown(*shown: Shown) -> list[str]:
    return [name for name, f in FIGURES.items() if f.shown in shown]


def test_the_declaration_has_figures_of_every_kind() -> None:
    """The readers' checks below would pass vacuously on a kind with no figure."""
    assert {f.shown for f in FIGURES.values()} == set(Shown)
    assert all(f.help.strip() for f in FIGURES.values())


def test_a_report_comes_back_from_a_server_as_it_was_sent(reported: tuple[ThreadServer, QueuePool, ConsumerReport]) -> None:
    _, pool, sent = reported
    [(name, counts)] = pool.queues.workers().items()
    back = ConsumerReport.from_counts(name, counts)
    assert 0 <= back.seen < 10  # set by the server: seconds since it heard the report
    assert back.task_seconds is not None and sent.task_seconds is not None
    assert (back.task_seconds.counts, back.task_seconds.sum) == (sent.task_seconds.counts, sent.task_seconds.sum)
    unchanged = {f.name for f in dataclasses.fields(ConsumerReport)} - {"seen", "task_seconds"}
    assert {k: getattr(back, k) for k in unchanged} == {k: getattr(sent, k) for k in unchanged}


def test_a_report_missing_figures_or_carrying_unknown_ones_reads_as_zeros() -> None:
    """A consumer of another version: what it leaves out reads as 0, what it adds is ignored."""
    r = ConsumerReport.from_counts("old", {"host": 7, "unknown": 3, "processed": float("nan")})
    assert (r.host, r.serves, r.rows, r.task_seconds) == ("", (), {}, None)
    assert set(r.figures().values()) == {0}


def test_a_last_report_says_the_consumer_ended_and_one_without_the_word_did_not() -> None:
    """`ended` travels as 1 in the last report only; a report that leaves it out (an older consumer) did not end."""
    last = ConsumerReport("c", "h", processed=3, ended=True)
    assert last.to_counts()["ended"] == 1 and "ended" not in dataclasses.replace(last, ended=False).to_counts()
    assert ConsumerReport.from_counts("c", last.to_counts()).ended
    assert not ConsumerReport.from_counts("c", {"host": "h", "processed": 3}).ended
    assert not ConsumerReport.from_counts("c", {"ended": float("nan")}).ended


def test_the_metrics_show_every_total_and_current_figure(reported: tuple[ThreadServer, QueuePool, ConsumerReport]) -> None:
    s, _, r = reported
    samples = scrape(s.server.metrics_address or "")
    at = {"consumer": r.consumer, "host": r.host}
    for name in _shown(Shown.TOTAL):
        assert value(samples, f"conveyor_consumer_{name}_total", **at) == r.figures()[name], name
    for name in _shown(Shown.NOW):
        assert value(samples, f"conveyor_consumer_{name}", **at) == r.figures()[name], name
    assert value(samples, "conveyor_consumer_task_duration_seconds_count", **at) == 3


def test_conveyor_stats_shows_every_total_and_current_figure(reported: tuple[ThreadServer, QueuePool, ConsumerReport]) -> None:
    _, pool, r = reported
    table = workers_table(pool.queues.on_every_server(calls.server_stats()))
    assert table is not None
    console = Console(width=400, record=True)
    console.print(table)
    lines = console.export_text().splitlines()
    [header] = [ln for ln in lines if "consumer" in ln and "host" in ln]
    [row] = [ln for ln in lines if r.consumer in ln]
    names = _shown(Shown.TOTAL, Shown.NOW)
    assert _cells(header)[: 2 + len(names)] == ["consumer", "host", *names]
    assert _cells(row)[: 2 + len(names)] == [r.consumer, r.host, *(f"{r.figures()[n]:,}" for n in names)]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in re.split("[┃│]", line) if c.strip()]


def test_the_dashboard_shows_every_figure(reported: tuple[ThreadServer, QueuePool, ConsumerReport]) -> None:
    _, pool, r = reported
    watch = PoolWatch(pool)
    try:
        consumers = wait_for(lambda: watch.overview()["consumers"], what="the dashboard to hear of the consumer")
    finally:
        watch.close()
    [c] = consumers
    assert (c["name"], c["host"]) == (r.consumer, r.host)
    assert {k: c[k] for k in FIGURES} == r.figures()


def test_spark_consumer_stats_have_a_column_for_every_total_and_process_figure() -> None:
    r = _sample()
    typed = ConsumerRow.of(3, r, 1.0, 2.0, 10)
    row = typed.as_dict()
    assert ConsumerRow.from_dict(row) == typed  # as it comes back from Spark
    columns = [c.split()[0] for c in STATS_DDL.split(", ")]
    assert list(row) == columns  # the row as the DDL declares it, in its order
    # the columns of SparkConsumerPool.dataframe() keep their order: a figure added comes among them
    first = [
        "consumer",
        "host",
        "pid",
        "started",
        "finished",
        "processed",
        "failed",
        "retried",
        "dead",
        "timed_out",
        "stolen",
        "rows",
    ]
    assert [c for c in columns if c in first] == first
    for name in _shown(Shown.TOTAL, Shown.WHO):
        assert row[name] == r.figures()[name], name
    assert row["host"] == r.host


# what a reader may import of the report's wire layout: nothing but the declaration (and the
# histogram, whose encoding it is) uses these.
_LAYOUT = [n for n in dir(constants) if n.startswith("COUNT_")]
_MAY_SPELL_LAYOUT = {"protocol/report.py", "protocol/histograms.py", "constants.py"}


def test_only_the_declaration_spells_the_reports_wire_layout() -> None:
    assert _LAYOUT, "the report's prefixed keys moved out of conveyor.constants: update this test"
    offenders = []
    for path in sorted(SRC.rglob("*.py")):
        rel = path.relative_to(SRC).as_posix()
        if rel in _MAY_SPELL_LAYOUT:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
            if name in _LAYOUT:
                offenders.append(f"{rel}:{node.lineno} {name}")
            elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in _prefixes():
                offenders.append(f"{rel}:{node.lineno} {node.value!r}")
    assert not offenders, f"read reports through conveyor.protocol.report.ConsumerReport: {offenders}"


def _prefixes() -> set[str]:
    return {getattr(constants, n) for n in _LAYOUT}
