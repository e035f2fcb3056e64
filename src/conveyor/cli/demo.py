"""`conveyor demo`: the seed problem, scene by scene, on the embedded default.

A synthetic corpus of documents (1-200 pages each, heavy-tailed, per-page cost varying widely,
listed by size as batches of scans often arrive) is processed page by page, in each scene twice on
the same local Spark session and input DataFrame: through `conveyor.spark.map` (pages go through
the queue to consumers running as Spark tasks) and with plain Spark (`mapInPandas` over the input's
static partitions). The scenes (`conveyor.cli.scenes`):

  a. skewed documents: a few damaged pages raise; both handle them; conveyor balances the load;
  b. pages that crash the process running them: plain Spark retries the task, then aborts the job;
     the map runs pages in child processes, and a message whose process died is split so that
     only the crashing page fails;
  c. a page that hangs: plain Spark waits for it (the demo gives up after a stated time);
  d. (`--kill-worker`) a worker process killed midway: plain Spark runs the whole partition again;
  e. batch inference: a scikit-learn model predicts digits by `map_batches` with a model class and
     by Spark's `predict_batch_udf` (`conveyor.cli.inference`; needs the `demo` extra, else it is
     reported as not run, with the pip command).

Scenes a-d report pages done, pages failed and why, makespan and efficiency (work of the pages
done / (workers x makespan)); scene e, images per second of each, the model's builds and the
predictions that differ. Each gets a verdict drawn from those figures.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from conveyor.extras import DEMO, SPARK, MissingExtraError, require

require(SPARK, "conveyor demo")

from conveyor.cli.inference import Inference, run_inference
from conveyor.cli.scenes import Outcome, Scene, corpus, run_map, run_plain
from conveyor.client.pool import QueuePool
from conveyor.dashboard import Dashboard
from conveyor.spark.embedded import local
from conveyor.worker.options import ConsumerOptions

SCENE_KEYS = "abcde"
DEFAULT_SCENES = "abce"  # d (--kill-worker) too would take the demo past 2 minutes on 2 cores
# plain Spark is given this many times the map's makespan (at least PATIENCE_MIN_S) before the demo
# stops waiting for it: a job that needs more is hung or far behind
PATIENCE_FACTOR = 1.5
PATIENCE_MIN_S = 10.0
HANG_LIMIT_S = 1.0  # scene c: the map's time limit per page (the corpus's longest page takes well under it)
WARM_UP_PAGES = 600  # at most: a tenth of the corpus for small ones
IMAGES_PER_PAGE = 10  # scene e predicts this many images per page of --pages
WARM_UP_IMAGES = 1000
INFERENCE = ("e", "batch inference with a model")


def scenes(pages: int) -> dict[str, Scene]:
    """The demo's scenes; `pages` is the corpus of scenes a and d, b and c take a quarter of it."""
    small = max(pages // 4, 10)
    return {
        s.key: s
        for s in (
            Scene("a", "skewed documents", pages),
            Scene(
                "b",
                "pages that crash their process",
                small,
                crash=3,
                consumers=ConsumerOptions(pool="process"),
                shown="options=ConsumerOptions(pool='process')",
            ),
            Scene(
                "c",
                "a page that hangs",
                small,
                hang=1,
                time_limit=HANG_LIMIT_S,
                shown=f"time_limit={HANG_LIMIT_S:g}",
            ),
            Scene("d", "a worker killed midway", pages, kill=True),
        )
    }


@dataclass
class Result:
    """A page scene (a-d): how the map and plain Spark did."""

    scene: Scene
    faults: dict[str, int]
    total: int  # pages in the corpus
    conveyor: Outcome
    plain: Outcome

    def verdict(self) -> str:
        """One line, from the figures only."""
        c, p = self.conveyor, self.plain
        mine = f"map: {c.done:,} of {self.total:,} pages back, {_failed(c)} in {c.makespan_s:.1f} s"
        if p.ended != "finished":
            return f"{mine}; plain Spark: {p.ended.split(':', 1)[0]}, no page back"
        ratio = c.makespan_s / p.makespan_s
        how = "faster" if ratio < 1 else "slower"
        return f"{mine}; plain Spark: {p.done:,} pages in {p.makespan_s:.1f} s. map took {ratio:.2f}x its time ({how})"

    def expected(self) -> bool:
        """Whether the map did what it should: every page back, the bad ones reported."""
        c = self.conveyor
        return c.done + sum(c.failed.values()) == self.total and sum(c.failed.values()) == sum(self.faults.values())

    @property
    def key(self) -> str:
        return self.scene.key

    def notes(self) -> list[str]:
        """How each run ended and what it was run with."""
        shown = f" ({self.scene.shown})" if self.scene.shown else ""
        plain = self.plain.ended if self.plain.ended != "finished" else self.plain.note
        return [f"map{shown}: {self.conveyor.note}", f"plain Spark: {plain}"]


@dataclass
class InferenceResult:
    """Scene e: throughput of both ways, the model's builds and the predictions matched."""

    key: str
    title: str
    run: Inference

    def verdict(self) -> str:
        """One line, from the figures only."""
        r = self.run
        c, p = r.conveyor, r.plain
        ratio = c.per_s / p.per_s if p.per_s > 0 else 0.0
        how = "faster" if ratio > 1 else "slower"
        same = "every row the same prediction" if r.mismatches == 0 else f"{r.mismatches:,} rows differ"
        return (
            f"map_batches: {c.rows:,} of {r.images:,} images, {c.per_s:,.0f}/s, model built {r.built} times "
            f"for {r.consumers} consumers; plain Spark: {p.per_s:,.0f}/s. map_batches ran at {ratio:.2f}x its "
            f"rate ({how}); {same}"
        )

    def expected(self) -> bool:
        """Whether the map did what it should: every image back with plain Spark's prediction, one model a consumer."""
        r = self.run
        return r.conveyor.rows == r.images and r.failed == 0 and r.mismatches == 0 and r.built <= r.consumers

    def notes(self) -> list[str]:
        r = self.run
        return [
            f"map_batches (a model class, {r.model}): {r.conveyor.seconds:.1f} s, {r.failed} failed; "
            f"the warm-up built the model {r.warm_built} times",
            f"plain Spark (predict_batch_udf, the model in its closure): {r.plain.seconds:.1f} s",
        ]


@dataclass
class NotRun:
    """A scene that could not run here, and why (e.g. its extra is not installed)."""

    key: str
    title: str
    reason: str

    def verdict(self) -> str:
        return f"not run: {self.reason}"

    def expected(self) -> bool:
        return True

    def notes(self) -> list[str]:
        return []


Outcomes = Result | InferenceResult | NotRun


def _failed(o: Outcome, short: bool = False) -> str:
    n = sum(o.failed.values())
    if short:
        return "\n".join(f"{k}: {v}" for k, v in o.failed.most_common()) or "0"
    if not n:
        return "none failed"
    return f"{n} failed (" + ", ".join(f"{k} {why}" for why, k in o.failed.most_common()) + ")"


def run_demo(
    pages: int, workers: int | None, keys: str, console: Console, scale: float = 1.0, dashboard: bool = False
) -> list[Outcomes]:
    """The chosen scenes on the embedded default, in order; returns how each went.

    With `dashboard`, the dashboard of its queue servers is served meanwhile (its address printed).
    """
    console.print("starting the embedded Spark session and queue servers ...")
    say: Callable[[str], None] = console.print
    out: list[Outcomes] = []
    with local() as env, Dashboard(env.pool, port=0) if dashboard else contextlib.nullcontext() as board:
        if board is not None:
            console.print(f"dashboard on {board.url} (the map jobs show there as they run)")
        spark = env.spark
        slots = int(spark.sparkContext.defaultParallelism)
        n_workers = min(workers or slots, slots)
        if n_workers != (workers or slots):  # more would wait for a slot, and hold up the others' end
            console.print(f"--workers {workers}: local Spark has {slots} task slots on this machine; using {slots}")
        level = spark.conf.get("spark.log.level", "ERROR") or "ERROR"
        spark.sparkContext.setLogLevel("FATAL")  # the faults we cause are logged with long traces: the demo tells them
        try:
            # both ways once on a small corpus first, so that neither timed run pays for starting the
            # executors' Python workers or for the JVM compiling the code paths both use (seconds of CPU)
            console.print("warming up: both ways once on a few pages ...")
            warm = Scene("warm-up", "warm-up", max(40, min(WARM_UP_PAGES, pages // 10)))
            c = corpus(spark, warm)
            run_map(spark, env.pool, warm, c, n_workers, False, say)
            run_plain(spark, warm, c, n_workers, PATIENCE_MIN_S, None, say)
            c.frame.unpersist()
            chosen = scenes(pages)
            for key in keys:
                if key == INFERENCE[0]:
                    out.append(_inference(spark, env.pool, pages, n_workers, console))
                    continue
                scene = chosen[key]
                c = corpus(spark, scene, scale)
                faults = dict(c.faults)
                total = len(c.costs) + sum(faults.values())
                console.rule(f"scene {key}: {scene.title}")
                console.print(
                    f"{total:,} pages ({', '.join(f'{n} {k}' for k, n in faults.items()) or 'no fault'}), "
                    f"{c.work_s:.1f} s of work, {n_workers} workers"
                )
                t0 = time.perf_counter()
                mine, killed_at = run_map(spark, env.pool, scene, c, n_workers, console.is_terminal, say)
                console.print(
                    f"  conveyor.spark.map{f' ({scene.shown})' if scene.shown else ''}: done in "
                    f"{mine.makespan_s:.1f} s; now plain Spark ..."
                )
                patience = max(PATIENCE_MIN_S, PATIENCE_FACTOR * mine.makespan_s)
                theirs = run_plain(spark, scene, c, n_workers, patience, killed_at, say)
                c.frame.unpersist()
                result = Result(scene, faults, total, mine, theirs)
                console.print(f"  [bold]{result.verdict()}[/] ({time.perf_counter() - t0:.0f} s)")
                out.append(result)
        finally:
            spark.sparkContext.setLogLevel(level)
    return out


def _inference(spark: Any, pool: QueuePool, pages: int, workers: int, console: Console) -> InferenceResult | NotRun:
    """Scene e, or why it cannot run here."""
    key, title = INFERENCE
    console.rule(f"scene {key}: {title}")
    try:
        require(DEMO, f"conveyor demo's scene {key}")
    except MissingExtraError as e:
        console.print(f"  not run: {e}", markup=False)  # the pip command's brackets are not markup
        return NotRun(key, title, str(e))
    n = pages * IMAGES_PER_PAGE
    console.print(f"{n:,} 8x8 digits, a model trained on scikit-learn's bundled set, {workers} workers")
    t0 = time.perf_counter()
    result = InferenceResult(key, title, run_inference(spark, pool, n, workers, console.is_terminal, WARM_UP_IMAGES))
    console.print(f"  [bold]{result.verdict()}[/] ({time.perf_counter() - t0:.0f} s)")
    return result


def summary_tables(results: list[Outcomes]) -> list[Table]:
    """The page scenes' table, and the inference scene's, each if one of its scenes ran."""
    pages = [r for r in results if isinstance(r, Result)]
    inference = [r for r in results if isinstance(r, InferenceResult)]
    return ([_pages_table(pages)] if pages else []) + ([_inference_table(inference)] if inference else [])


def _inference_table(results: list[InferenceResult]) -> Table:
    # short run names, the scene in the title: the table fits an 80-column terminal
    scenes = "; ".join(f"{r.key}. {r.title}, {r.run.images:,} images" for r in results)
    t = Table(title=f"conveyor demo: {scenes}")
    for col in ("run", "rows back", "time", "items/s", "models built", "same answer"):
        t.add_column(col, justify="left" if col == "run" else "right", no_wrap=col == "run")
    for r in results:
        i = r.run
        t.add_row(
            "conveyor map_batches",
            f"{i.conveyor.rows:,}",
            f"{i.conveyor.seconds:.1f} s",
            f"{i.conveyor.per_s:,.0f}",
            str(i.built),
            f"{i.images - i.mismatches:,}",
        )
        t.add_row(
            "Spark predict_batch_udf", f"{i.plain.rows:,}", f"{i.plain.seconds:.1f} s", f"{i.plain.per_s:,.0f}", "", "(theirs)"
        )
        t.add_section()
    return t


def _pages_table(results: list[Result]) -> Table:
    t = Table(title="conveyor demo: documents, page by page")
    for col in ("scene", "run", "pages back", "failed", "makespan", "efficiency", "ended"):
        t.add_column(col, justify="left" if col in ("scene", "run", "failed", "ended") else "right")
    for r in results:
        for o, label in ((r.conveyor, "conveyor.spark.map"), (r.plain, "plain Spark")):
            t.add_row(
                f"{r.scene.key}. {r.scene.title}" if o is r.conveyor else "",
                label,
                f"{o.done:,} / {r.total:,}",
                _failed(o, short=True),
                f"{o.makespan_s:.1f} s",
                f"{o.efficiency:.2f}",
                o.ended.split(":", 1)[0],
            )
        t.add_section()
    return t


def verdicts(results: list[Outcomes]) -> list[str]:
    """The scenes' verdicts, with how each run ended and what it was run with."""
    out = []
    for r in results:
        out.append(f"{r.key}. {r.verdict()}")
        out.extend(f"   {note}" for note in r.notes())
    return out


@click.command()
@click.option(
    "--pages",
    default=9000,
    show_default=True,
    type=click.IntRange(40),
    help=f"Pages in the corpus of scenes a and d (b and c take a quarter of it; e predicts {IMAGES_PER_PAGE} images a page).",
)
@click.option("--workers", default=None, type=click.IntRange(1), help="Consumers (default: one per Spark slot).")
@click.option(
    "--scenes",
    "keys",
    default=DEFAULT_SCENES,
    show_default=True,
    help="Which scenes to run, in order: a skewed documents, b pages that crash their process, c a page "
    "that hangs, d a worker killed midway, e batch inference with a model.",
)
@click.option("--kill-worker", is_flag=True, help="Run scene d (a worker killed midway) too.")
@click.option(
    "--dashboard",
    "with_dashboard",
    is_flag=True,
    help="Serve the dashboard of the demo's queue servers meanwhile, and print its address.",
)
def demo(pages: int, workers: int | None, keys: str, kill_worker: bool, with_dashboard: bool) -> None:
    """Process a corpus of documents page by page through the queue on Spark and with plain Spark, scene by scene."""
    keys = keys.lower() + ("d" if kill_worker and "d" not in keys.lower() else "")
    if not keys or any(k not in SCENE_KEYS for k in keys) or len(set(keys)) != len(keys):
        raise click.BadParameter(f"letters of {SCENE_KEYS!r}, each at most once (got {keys!r})", param_hint="--scenes")
    console = Console(stderr=True)
    console.print(
        f"[bold]conveyor demo[/]: scenes {', '.join(keys)}; each through conveyor.spark.map (e: map_batches), then plain Spark"
    )
    results = run_demo(pages, workers, keys, console, dashboard=with_dashboard)
    out = Console()
    for table in summary_tables(results):
        out.print(table)
    for line in verdicts(results):
        out.print(line, highlight=False, markup=False)
    wrong = [r for r in results if not r.expected()]
    if wrong:
        raise click.ClickException("; ".join(f"scene {r.key}: {r.verdict()}" for r in wrong))
