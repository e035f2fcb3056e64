"""Every code example of README.md and docs/ works as written.

Each Python block runs as a script a user pastes, in a directory of its own that holds the files its
page gives (`file=` blocks) and the repository files it names (`given=`); the commands of a page's
`processes` blocks (the quickstart's server and worker) run beside it as separate processes. A block
that shows a callable's parameters is checked against the callable. The marks:
tests/support/doc_blocks.py.
"""

from __future__ import annotations

import ast
import inspect
import itertools
import pkgutil
import re
import sys
from pathlib import Path

import pytest

from .support.doc_blocks import ROOT, Block, all_blocks, blocks, run_as_written

BLOCKS = all_blocks()
PYTHON = [b for b in BLOCKS if b.lang == "python"]
# a block that a later one continues runs as the start of that one
CONTINUED = {id(prev) for prev, b in itertools.pairwise(PYTHON) if "continues" in b.marks and prev.page == b.page}
SCRIPTS = [b for b in PYTHON if not {"file", "signature", "tested-by"} & b.marks.keys() and id(b) not in CONTINUED]
SIGNATURES = [b for b in PYTHON if "signature" in b.marks]
TESTED_ELSEWHERE = [b for b in BLOCKS if "tested-by" in b.marks]


def test_every_python_block_is_run_or_checked() -> None:
    """No Python block escapes: each is a script, a file a script uses, a signature, or another test's."""
    assert len(PYTHON) >= 20, "the docs' Python blocks were not found"
    files = [b for b in PYTHON if "file" in b.marks]
    for b in files:
        compile(b.code, b.name, "exec")
        users = [u for u in blocks(b.page) if u is not b and ("processes" in u.marks or u in SCRIPTS)]
        assert users, f"{b.name}: file {b.marks['file']} is used by no script or command of its page"
    counted = {id(b) for b in SCRIPTS + SIGNATURES + files + TESTED_ELSEWHERE} | CONTINUED
    assert [b.name for b in PYTHON if id(b) not in counted] == []


@pytest.mark.parametrize("block", TESTED_ELSEWHERE, ids=lambda b: b.name)
def test_blocks_run_by_their_own_tests_are_named_there(block: Block) -> None:
    """A block marked `tested-by` is the section that test runs: it names the page and the heading."""
    test = (ROOT / block.marks["tested-by"]).read_text()
    sections = re.findall(r'section_code\("([^"]+)", "#+ ([^"]+)"\)', test)
    assert any(page == block.page.name and block.heading.startswith(prefix) for page, prefix in sections), (
        f"{block.name}: {block.marks['tested-by']} does not run the section {block.heading!r} of {block.page.name}"
    )


def _documented(node: ast.FunctionDef | ast.AsyncFunctionDef) -> list[tuple[str, object, object]]:
    """The parameters a `def` shows, in order: (name, kind, default), `inspect.Parameter.empty` where none."""
    p, empty, args = inspect.Parameter, inspect.Parameter.empty, node.args
    positional = [(a, p.POSITIONAL_ONLY) for a in args.posonlyargs] + [(a, p.POSITIONAL_OR_KEYWORD) for a in args.args]
    defaults = [empty] * (len(positional) - len(args.defaults)) + [ast.literal_eval(d) for d in args.defaults]
    out: list[tuple[str, object, object]] = [(a.arg, k, d) for (a, k), d in zip(positional, defaults, strict=True)]
    if args.vararg:
        out.append((args.vararg.arg, p.VAR_POSITIONAL, empty))
    out += [
        (a.arg, p.KEYWORD_ONLY, empty if d is None else ast.literal_eval(d))
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    if args.kwarg:
        out.append((args.kwarg.arg, p.VAR_KEYWORD, empty))
    return out


@pytest.mark.parametrize("block", SIGNATURES, ids=lambda b: b.name)
def test_documented_signatures_are_the_real_ones(block: Block) -> None:
    """A `def` a block shows has the real callable's parameters: names, order, kinds and defaults.

    The target is a function (the `def` bears its name) or a class (each `def` is one of its methods).
    """
    target = pkgutil.resolve_name(block.marks["signature"])
    defs = [n for n in ast.parse(block.code).body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    assert defs, f"{block.name}: a signature block shows `def`s"
    for node in defs:
        if inspect.isclass(target):
            real = inspect.signature(getattr(target, node.name))
        else:
            assert node.name == target.__name__, f"{block.name}: def {node.name}, for {block.marks['signature']}"
            real = inspect.signature(target)
        actual = [(q.name, q.kind, q.default) for q in real.parameters.values()]
        assert _documented(node) == actual, f"{block.name}: {node.name}{real}"


@pytest.mark.timeout(600)
@pytest.mark.parametrize("block", SCRIPTS, ids=lambda b: b.name)
def test_example_runs_as_written(block: Block, tmp_path: Path) -> None:
    """The block, run as `python example.py` in its page's directory, ends well and prints what the page says."""
    run_as_written(block, tmp_path, Path(sys.executable))
