"""The shape of the code, checked as part of the tests (see docs/architecture.md).

- the import contracts in pyproject.toml (layers, the graph independent of the queue, no cycles);
- a strict type check of src/ (mypy, configured in pyproject.toml);
- no import of our own modules inside a function (which is how an import cycle is usually dodged);
- the layout is the formatter's and the lint rules hold (ruff, configured in pyproject.toml), with
  docstrings after PEP 257: a summary line, a blank line, then the body;
- every module of src/ is named by at least one test file (imported, or written as
  `conveyor.pkg.module` or `pkg/module.py`), so each has a test to go to;
- aiohttp through its public API only, and every runtime dependency bounded below its next major
  version (pyproject.toml);
- the core (servers, stores, clients, workers, tasks, the dashboard, the CLI) imports nothing of
  Spark's stack (numpy, pandas, pyarrow, pyspark): that is the `spark` extra's, and
  `pip install conveyor` stays small without it.

A module's size follows its job: there is no line limit (one pushed code into squeezed lines), and
`# fmt: skip` is kept for the few tables that read better aligned, each with its reason.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src" / "conveyor"
TESTS = ROOT / "tests"
BIN = Path(sys.executable).parent
MAX_FMT_SKIPS = 20  # aligned tables only, each with its reason


def test_import_contracts_hold() -> None:
    run = subprocess.run([str(BIN / "lint-imports"), "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "0 broken" in run.stdout


@pytest.mark.timeout(600)
def test_strict_type_check_passes() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-incremental"], cwd=ROOT, capture_output=True, text=True, timeout=540
    )
    assert run.returncode == 0, run.stdout[-20_000:] + run.stderr
    assert "Success: no issues found" in run.stdout


def _ruff() -> str:
    ruff = shutil.which("ruff", path=str(BIN)) or shutil.which("ruff")
    assert ruff, "ruff is a test dependency: pip install -e '.[test]'"
    return ruff


def test_lint_rules_hold() -> None:
    run = subprocess.run([_ruff(), "check", "src", "tests", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr


def test_layout_is_the_formatters() -> None:
    run = subprocess.run(
        [_ruff(), "format", "--check", "src", "tests", "bench"], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, "run `ruff format src tests bench`:\n" + run.stdout + run.stderr


def test_few_lines_are_kept_from_the_formatter() -> None:
    skips = [
        f"{p.relative_to(SRC)}:{n}"
        for p in _modules()
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if "# fmt: skip" in line
    ]
    assert len(skips) <= MAX_FMT_SKIPS, f"{len(skips)} lines kept from the formatter (at most {MAX_FMT_SKIPS}): {skips}"


def _modules() -> list[Path]:
    return sorted(SRC.rglob("*.py"))


def test_no_function_level_imports_of_our_own_modules() -> None:
    found = []
    for p in _modules():
        for node in ast.walk(ast.parse(p.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for sub in ast.walk(node):
                if isinstance(sub, ast.ImportFrom):
                    ours = sub.level > 0 or (sub.module or "").split(".")[0] == "conveyor"
                else:
                    ours = isinstance(sub, ast.Import) and any(a.name.split(".")[0] == "conveyor" for a in sub.names)
                if ours:
                    found.append(f"{p.relative_to(SRC)}:{sub.lineno}")
    assert not found, f"imports of conveyor modules inside functions (import at the top; a cycle means a layer is wrong): {found}"


def test_no_type_ignore_comments_in_the_library() -> None:
    found = [
        f"{p.relative_to(SRC)}:{i}"
        for p in _modules()
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if "type: ignore" in line
    ]
    assert not found, f"'type: ignore' in src/ (type it properly, or cast where a library is untyped): {found}"


def _module_name(p: Path) -> str:
    parts = p.relative_to(SRC.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported(tree: ast.AST) -> set[str]:
    """The modules a test file imports from: each `from conveyor.x import name`, as the module defining `name`."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "conveyor":
            assert node.module is not None
            package = importlib.import_module(node.module)
            for alias in node.names:
                found.add(f"{node.module}.{alias.name}")  # a module imported by name from its package
                obj = getattr(package, alias.name, None)
                if inspect.isclass(obj) or inspect.isfunction(obj):
                    found.add(obj.__module__)  # a re-exported name: the module that defines it
    return found


def test_every_module_is_named_by_a_test_file() -> None:
    tests = [(p.read_text(), _imported(ast.parse(p.read_text()))) for p in sorted(TESTS.rglob("test_*.py"))]
    unnamed = []
    for p in _modules():
        name, path = _module_name(p), p.relative_to(SRC).as_posix()
        written = re.compile(rf"(?<![\w.]){re.escape(name)}(?!\w)|(?<![\w/])(?:conveyor/)?{re.escape(path)}(?!\w)")
        if not any(name in imported or written.search(text) for text, imported in tests):
            unnamed.append(name)
    assert not unnamed, (
        f"{len(unnamed)} module(s) of src/conveyor named by no test file: {', '.join(unnamed)}. Test each in the test "
        "file of its package (tests/<package>/, see docs/architecture.md, Tests), importing it or naming it as "
        "`conveyor.<package>.<module>`; a module renamed or split is named by its new name"
    )


def test_no_private_attributes_of_aiohttp_objects() -> None:
    """Modules that use aiohttp touch only its public API: no `x._name` but on self or cls (privates change unannounced)."""
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text())
        uses_aiohttp = any(
            (isinstance(n, ast.ImportFrom) and (n.module or "").startswith("aiohttp"))
            or (isinstance(n, ast.Import) and any(a.name.startswith("aiohttp") for a in n.names))
            for n in ast.walk(tree)
        )
        if not uses_aiohttp:
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
                and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))
            ):
                found.append(f"{path.relative_to(SRC)}:{node.lineno} .{node.attr}")
    assert not found, f"private attributes reached in modules that use aiohttp: {found}"


RUNTIME_EXTRAS = ("spark", "connect", "quokka")  # what users install; `test` and `bench` are ours


def test_every_runtime_dependency_is_bounded_below_its_next_major_version() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    dependencies = [
        *project["dependencies"],
        *(d for name in RUNTIME_EXTRAS for d in extras[name] if not d.startswith("conveyor[")),
    ]
    unbounded = [d for d in dependencies if "<" not in d.split(";")[0]]
    assert dependencies and not unbounded, f"runtime dependencies without an upper bound: {unbounded}"


# the core, as `pip install conveyor` serves it: a package name, and whether every module in it is imported
# too (`conveyor` and `conveyor.cli` load their heavy parts on first use: the packages themselves)
CORE = {
    "conveyor": False,
    "conveyor.server": True,
    "conveyor.storage": True,
    "conveyor.client": True,
    "conveyor.worker": True,
    "conveyor.tasks": True,
    "conveyor.dashboard": True,
    "conveyor.cli": False,
}
SPARK_STACK = ("numpy", "pandas", "pyarrow", "pyspark")  # the `spark` extra's
# the modules of the `spark` extra, which may import its stack when they load (paths under src/conveyor)
SPARK_MODULES = ("spark/", "graph/", "compat/", "cli/corpus.py", "cli/scenes.py")
_IMPORT_EACH = """
import importlib, json, pkgutil, sys
core, stack = json.loads(sys.argv[1]), json.loads(sys.argv[2])
brought = {}
for package, whole in core.items():
    names = [package]
    if whole:
        path = importlib.import_module(package).__path__
        names += [m.name for m in pkgutil.walk_packages(path, package + ".")]
    for name in names:
        importlib.import_module(name)
        for top in stack:
            if top in sys.modules:
                brought.setdefault(top, name)
print(json.dumps(brought))
"""


def test_the_core_imports_nothing_of_sparks_stack() -> None:
    """Importing the core in a fresh process leaves numpy, pandas, pyarrow and pyspark unloaded."""
    run = subprocess.run(
        [sys.executable, "-c", _IMPORT_EACH, json.dumps(CORE), json.dumps(SPARK_STACK)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    brought = json.loads(run.stdout.splitlines()[-1])
    assert not brought, (
        "the core imports the spark extra's packages (package: the first module that brought it in): "
        + ", ".join(f"{top}: {name}" for top, name in brought.items())
    )


def test_only_the_spark_extras_modules_import_sparks_stack_as_they_load() -> None:
    """No other module imports numpy, pandas, pyarrow or pyspark at its top (inside a function, on first use, it may)."""
    found = []
    for p in _modules():
        path = p.relative_to(SRC).as_posix()
        if path.startswith(SPARK_MODULES):
            continue
        for node in ast.parse(p.read_text()).body:
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module or ""]
            else:
                continue
            found += [f"{path}:{node.lineno} {n}" for n in names if n.split(".")[0] in SPARK_STACK]
    assert not found, f"modules outside the spark extra import its stack as they load: {found}"
