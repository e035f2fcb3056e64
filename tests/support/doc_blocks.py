"""The code blocks of README.md and docs/*.md, with the marks that say how a test runs each.

A mark is an HTML comment on the line just above a block's fence (invisible where the Markdown is
rendered): `<!-- example: key=value key ... -->`. Without one, a Python block is a script a user
pastes and runs as written. The keys:

- `file=PATH`: the block is the text of PATH in the page's directory (a module the page's scripts
  import, a script the page's commands run); written before the page's blocks run.
- `given=PATH[,PATH]`: files of this repository the block needs (examples/tpch.py, say), copied into
  the page's directory.
- `continues`: the block goes on from the page's Python block before it (run after it, as one script).
- `signature=DOTTED.NAME`: the block shows a callable's parameters (`name(a, b=1)`, or `def`s of a
  class's methods); the test checks them against the callable itself.
- `tested-by=tests/PATH.py`: a test of its own runs the block (`section_code`), asserting more.
- `processes`: a shell block whose lines are commands a user starts in terminals of their own: the
  test starts each as a process in the page's directory, runs the page's later blocks, then stops them.
- `port=N`: on a `processes` block, the port its commands and the page's scripts use: the test moves
  it to a free one (other tests may hold N).
- `output`: a block of what the Python block before it prints: each line, `...` matching anything, is a
  line it prints, in that order.
- `timeout=S`: seconds the block may take (default 120).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from .procs import free_port

ROOT = Path(__file__).resolve().parents[2]
PAGES = (ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")))
DEFAULT_TIMEOUT_S = 120.0

_BLOCK = re.compile(
    r"^(?:[ ]*<!-- example: (?P<mark>[^>]*?) -->\n)?(?P<indent>[ ]*)```(?P<lang>[\w-]*)\n(?P<code>.*?)^(?P=indent)```",
    re.M | re.S,
)
_HEADING = re.compile(r"^#{1,4} (.+)$", re.M)
_KEYS = {"file", "given", "continues", "signature", "tested-by", "processes", "port", "output", "timeout"}


@dataclass(frozen=True)
class Block:
    """One fenced block of a page, with its mark."""

    page: Path
    line: int
    lang: str
    code: str
    heading: str
    marks: dict[str, str] = field(default_factory=dict)

    @property
    def name(self) -> str:
        """Where the block is, as a test id: `docs/spark.md:181`."""
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def timeout_s(self) -> float:
        """How long the block may run."""
        return float(self.marks.get("timeout", DEFAULT_TIMEOUT_S))

    def commands(self) -> list[list[str]]:
        r"""A shell block's commands, one per line (a trailing `\\` joins lines; `#` starts a comment)."""
        joined = self.code.replace("\\\n", " ")
        return [shlex.split(line, comments=True) for line in joined.splitlines() if shlex.split(line, comments=True)]


def _marks(text: str | None, where: str) -> dict[str, str]:
    marks: dict[str, str] = {}
    for word in (text or "").split():
        key, _, value = word.partition("=")
        assert key in _KEYS, f"{where}: unknown example mark {key!r} (known: {sorted(_KEYS)})"
        marks[key] = value
    return marks


def blocks(page: Path) -> list[Block]:
    """Every fenced block of `page`, in order."""
    text = page.read_text()
    found = list(_BLOCK.finditer(text))
    prose = text
    for m in found:  # a `# comment` inside a block is no heading
        prose = prose[: m.start()] + re.sub(r"[^\n]", " ", m.group(0)) + prose[m.end() :]
    headings = [(m.start(), m.group(1)) for m in _HEADING.finditer(prose)]
    out = []
    for m in found:
        line = text.count("\n", 0, m.start("lang")) + 1
        heading = next((h for at, h in reversed(headings) if at < m.start()), "")
        where = f"{page.relative_to(ROOT)}:{line}"
        code = textwrap.dedent(m.group("code")) if m.group("indent") else m.group("code")
        out.append(Block(page, line, m.group("lang"), code, heading, _marks(m.group("mark"), where)))
    return out


def all_blocks() -> list[Block]:
    """Every fenced block of README.md and docs/*.md."""
    return [b for page in PAGES for b in blocks(page)]


STOP_S = 30.0  # a `processes` command's clean stop (SIGTERM) before it is killed


def _page_files(page: list[Block], block: Block, where: Path) -> None:
    """The files a user's copy of the page would have: its `file=` blocks, and the block's `given=` files."""
    for b in page:
        if "file" in b.marks:
            path = where / b.marks["file"]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(b.code)
    for name in filter(None, block.marks.get("given", "").split(",")):
        shutil.copy(ROOT / name, where / Path(name).name)


def _script(page: list[Block], block: Block) -> str:
    """The block's code, after the blocks it continues."""
    python = [b for b in page if b.lang == "python"]
    chain = [next(b for b in python if b.line == block.line)]
    while "continues" in chain[0].marks:
        chain.insert(0, python[python.index(chain[0]) - 1])
    return "\n".join(b.code for b in chain)


def _on_free_ports(page: list[Block]) -> list[Block]:
    """The page with each port its `processes` blocks name (`port=7070`) moved to a free one.

    Tests run beside others that may hold the port a page's commands use; the page's blocks are run
    with a free port in its place, everywhere it is written.
    """
    moves = {b.marks["port"]: str(free_port()) for b in page if "port" in b.marks}
    for old, new in moves.items():
        page = [replace(b, code=re.sub(rf"\b{old}\b", new, b.code)) for b in page]
    return page


def _environment(where: Path, bin_dir: Path) -> dict[str, str]:
    env = dict(os.environ)
    if bin_dir != Path(sys.executable).parent:  # another venv (the core install's): its own packages only
        env.pop("PYTHONPATH", None)
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"  # `conveyor` and `python`: the venv's under test
    env.pop("CONVEYOR_CONNECT", None)
    env["HOME"] = str(where)  # nothing of the user running the tests leaks in (~/.config, Spark's Ivy cache)
    return env


@contextmanager
def _page_processes(
    page: list[Block], block: Block, where: Path, bin_dir: Path, logs: Path
) -> Iterator[list[subprocess.Popen[bytes]]]:
    """The commands of the page's `processes` blocks before `block`, each a process of its own; stopped after."""
    started: list[subprocess.Popen[bytes]] = []
    env = _environment(where, bin_dir)
    try:
        for b in page:
            if b.line >= block.line:
                break
            for i, argv in enumerate(b.commands() if "processes" in b.marks else ()):
                argv = [shutil.which(argv[0], path=env["PATH"]) or argv[0], *argv[1:]]
                with (logs / f"{b.line}-{i}.log").open("wb") as log:
                    started.append(subprocess.Popen(argv, cwd=where, env=env, stdout=log, stderr=subprocess.STDOUT))
        yield started
    finally:
        for p in started:
            p.send_signal(signal.SIGTERM)
        for p in started:
            try:
                p.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=STOP_S)


def run_as_written(block: Block, where: Path, python: Path) -> None:
    """Run a Python block as `python example.py` in a directory with its page's files, as a user would.

    The page's `processes` before it run meanwhile; it must end well within its timeout, those
    processes still running, and print what an `output` block after it says.
    """
    page = _on_free_ports(blocks(block.page))
    _page_files(page, block, where)
    (where / "example.py").write_text(_script(page, block))
    logs = where / ".logs"
    logs.mkdir()
    with _page_processes(page, block, where, python.parent, logs) as processes:
        try:
            done = subprocess.run(
                [str(python), "example.py"],
                cwd=where,
                env=_environment(where, python.parent),
                capture_output=True,
                text=True,
                timeout=block.timeout_s,
            )
        except subprocess.TimeoutExpired as e:
            raise AssertionError(f"{block.name} did not end within {block.timeout_s} s:\n{e.stdout!r}\n{e.stderr!r}") from None
        ended = [p.args for p in processes if p.poll() is not None]
    said = "".join(f"\n--- {p.name}\n{p.read_text(errors='replace')}" for p in sorted(logs.glob("*.log")))
    assert done.returncode == 0, f"{block.name} failed:\n{done.stdout}\n{done.stderr}{said}"
    assert not ended, f"{block.name}: {ended} ended early:{said}"
    after = next((b for b in page if b.line > block.line), None)
    if after is not None and "output" in after.marks:
        printed = iter(done.stdout.splitlines())
        for line in after.code.splitlines():
            pattern = re.compile(".*".join(map(re.escape, line.split("..."))))
            assert any(pattern.fullmatch(out) for out in printed), f"{block.name} did not print {line!r}:\n{done.stdout}"
