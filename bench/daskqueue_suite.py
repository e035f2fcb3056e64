"""Run daskqueue's own tests of its public API, from a checkout of its repository, on `conveyor.compat.daskqueue`.

    git clone https://github.com/AmineDiro/daskqueue /tmp/daskqueue
    python bench/daskqueue_suite.py --repo /tmp/daskqueue [--commit 106fdcf] [--python PY] [--examples]

daskqueue's tests (`tests/`, `integration/`, `conftest.py` and `pytest.ini` at `--commit`, by default
106fdcf, 9 January 2023: release 0.2.0 with its README updated; nothing of daskqueue is kept in
this repository) are copied into a temporary directory, where only import lines change (`rewrite`):
`from daskqueue[.module] import a, b` imports the names from `conveyor.compat.daskqueue`
(`daskqueue.utils` from `conveyor.compat.daskqueue.utils`); a name the compat does not have (an
internal, which only excluded tests use) is bound to a stand-in that raises when used; `from
distributed import Client` imports the compat's `Client`; dask's `client` test fixture (from
`distributed.utils_test`: a local dask cluster and its client) is replaced by one giving a compat
`Client()`, and its `gen_cluster` (used by excluded tests only) by dask's without the keyword that
later releases dropped (FIXTURES). pytest runs them in a subprocess of `--python`, which must
import dask and distributed (daskqueue's conftest imports `distributed.utils_test`: exit status 2
if it cannot), with this tree's src/ first on its path.

Excluded (EXCLUDED, each with its reason; docs/migrating-from-daskqueue.md, "daskqueue's own
tests"): the tests of daskqueue's internals, which have no counterpart here because Conveyor's
servers store and deliver the messages: its segment and index file formats, `DurableQueue` built
by hand, and `TransientQueue`, `QueuePoolActor` and consumers made as dask actors. With
`--examples`, daskqueue's README example (its python block using `QueuePool`) and
`examples/perf_io_bound.py` and `examples/perf_cpu_bound.py` then run as scripts, their imports
rewritten the same way (its other examples list a directory of its author's machine). Exit status
1 if a selected test or an example fails, 2 if --repo, --commit or --python is wrong.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from seed_suite import (
    Timeout,
    UsageError,
    extract,
    fail_usage,
    python_path,
    readme_block,
    report,
    resolve,
    run_bounded,
    run_pytest,
)

PROJECT = "AmineDiro/daskqueue"
COMPAT = "conveyor.compat.daskqueue"
DEFAULT_COMMIT = "106fdcfd68db763bbadaa5f95f961552dcc3a219"  # 9 January 2023: v0.2.0 with its README updated
DURABLE = "DurableQueue built by hand, looked at through its segments (active_segment, w_cursor...) and put_sync/get_sync"
ACTORS = "QueuePoolActor and DummyConsumer made as dask actors, driving a consumer's own loop (start, _consume, done, cancel)"
EXCLUDED = {  # a test file or test -> why it is left out
    "tests/test_log_segment.py": "the byte layout of daskqueue's log segment files (header, identifier, write cursor)",
    "tests/test_index_segment.py": "daskqueue's index files (its bitcask-style index and write-ahead log) and their GC",
    "tests/test_durable_queue.py": DURABLE,
    "integration/test_integration_durable.py::test_durable_queue": DURABLE,
    "integration/test_integration_durable.py::test_durable_queue_gc": DURABLE,
    "integration/test_integration_durable_multiplelog.py": DURABLE,
    "tests/test_queue.py": "TransientQueue made as a dask actor on a dask test cluster, driven by its own get/put",
    "tests/test_consumer.py::test_async_consumer_create": ACTORS,
    "tests/test_consumer.py::test_consummer_get_item": ACTORS,
    "tests/test_consumer.py::test_consummer_get_items": ACTORS,
    "tests/test_queue_pool.py::test_putmany_queuepool": ACTORS,
}
EXAMPLES = ["examples/perf_io_bound.py", "examples/perf_cpu_bound.py"]
FIXTURES_MODULE = "dq_fixtures"
FIXTURES = '''"""What the rewritten imports of daskqueue's tests name in place of dask's test fixtures and its internals."""
import pytest

from conveyor.compat.daskqueue import Client


@pytest.fixture
def client():
    """A compat Client(), where dask's fixture made a local dask cluster and its client."""
    with Client() as c:
        yield c


def gen_cluster(**kwargs):
    """distributed.utils_test.gen_cluster without `cluster_dump_directory`, which later releases dropped."""
    from distributed.utils_test import gen_cluster as dask_gen_cluster

    kwargs.pop("cluster_dump_directory", None)
    return dask_gen_cluster(**kwargs)


class not_in_compat:
    """A daskqueue name conveyor.compat.daskqueue does not have (an internal): raises when used."""

    def __init__(self, name):
        self.name = name

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(f"{self.name} is not in conveyor.compat.daskqueue (a daskqueue internal)")

    def __getattr__(self, attr):
        raise NotImplementedError(f"{self.name}.{attr}: not in conveyor.compat.daskqueue (a daskqueue internal)")

    def __repr__(self):
        return f"<not in compat: {self.name}>"
'''
PROBE = """
import importlib, importlib.util, json, sys
missing = [m for m in ("dask", "distributed", "pytest") if importlib.util.find_spec(m) is None]
found = {}
if not missing:
    import dask, distributed
    for module, names in json.loads(sys.argv[1]).items():
        imported = importlib.import_module(module)
        found[module] = [n for n in names if hasattr(imported, n)]
    versions = {"dask": dask.__version__, "distributed": distributed.__version__}
    print(json.dumps({"found": found, "versions": versions, "timeout": importlib.util.find_spec("pytest_timeout") is not None}))
else:
    print(json.dumps({"missing": missing}))
"""


def target(module: str) -> str:
    """The compat module that a daskqueue module's names are imported from."""
    return f"{COMPAT}.utils" if module == "daskqueue.utils" or module.startswith("daskqueue.utils.") else COMPAT


def daskqueue_imports(text: str) -> list[ast.ImportFrom]:
    """The `from daskqueue... import` statements of a file; a plain `import daskqueue` is not handled."""
    found = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "daskqueue" for a in node.names):
            raise UsageError(f"a plain `import daskqueue...` (line {node.lineno}) is not rewritten")
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "daskqueue":
            found.append(node)
    return found


def wanted(texts: list[str]) -> dict[str, list[str]]:
    """The names the files import from daskqueue, by the compat module that would have them."""
    names: dict[str, set[str]] = {}
    for text in texts:
        for node in daskqueue_imports(text):
            names.setdefault(target(node.module or ""), set()).update(a.name for a in node.names)
    return {module: sorted(n) for module, n in names.items()}


def rewrite(text: str, found: dict[str, list[str]]) -> str:
    """A file's text with its daskqueue and dask-client import lines pointed at the compat (`found`: what it has)."""
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(ast.parse(text)):
        if not isinstance(node, ast.ImportFrom) or node.module is None:
            continue
        module, names, out = node.module, [(a.name, a.asname) for a in node.names], []
        if module.split(".")[0] == "daskqueue":
            compat = target(module)
            keep = [(n, a) for n, a in names if n in found.get(compat, [])]
            if keep:
                out.append(f"from {compat} import " + ", ".join(f"{n} as {a}" if a else n for n, a in keep))
            for n, a in names:
                if (n, a) not in keep:
                    out.append(f"from {FIXTURES_MODULE} import not_in_compat")
                    out.append(f'{a or n} = not_in_compat("{module}.{n}")  # redirected: not in {compat}')
        elif module == "distributed" and any(n == "Client" for n, _ in names):
            out.append(f"from {COMPAT} import Client")
            rest = [n for n, _ in names if n != "Client"]
            if rest:
                out.append("from distributed import " + ", ".join(rest))
        elif module == "distributed.utils_test" and any(n in ("client", "gen_cluster") for n, _ in names):
            out.append(f"from {FIXTURES_MODULE} import client  # redirected: a compat Client(), not a dask cluster")
            if any(n == "gen_cluster" for n, _ in names):
                out.append(f"from {FIXTURES_MODULE} import gen_cluster  # dask's, without the keyword later releases dropped")
            rest = [n for n, _ in names if n not in ("client", "gen_cluster")]
            if rest:
                out.append("from distributed.utils_test import " + ", ".join(rest) + "  # noqa")
        else:
            continue
        indent = lines[node.lineno - 1][: node.col_offset]
        edits.append((node.lineno - 1, node.end_lineno, "".join(indent + line + "\n" for line in out)))
    for start, end, replacement in sorted(edits, reverse=True):
        lines[start:end] = [replacement]
    return "".join(lines)


def probe(python: str, names: dict[str, list[str]]) -> dict:
    """What `python` has: dask and distributed's versions, the compat's names among `names`, pytest-timeout."""
    try:
        code, out = run_bounded(
            [python, "-c", PROBE, json.dumps(names)], timeout=180, env={**os.environ, "PYTHONPATH": python_path()}
        )
    except FileNotFoundError:
        raise UsageError(f"--python {python}: no such interpreter") from None
    if code != 0:
        raise UsageError(f"--python {python} cannot import {COMPAT}:\n{out[-3000:]}")
    found = json.loads(out.strip().splitlines()[-1])
    if found.get("missing"):
        raise UsageError(
            f"--python {python} cannot import {', '.join(found['missing'])}: daskqueue's tests need dask and distributed"
            f" (its conftest imports distributed.utils_test) and pytest; pip install dask distributed pytest, or give"
            f" --python an interpreter that has them"
        )
    return found


def run_examples(
    python: str, files: dict[str, bytes], found: dict[str, list[str]], work: Path, env: dict[str, str], timeout: float
) -> int:
    """Run the README example and EXAMPLES as scripts; how many failed."""
    scripts = {"readme_example.py": readme_block(files["README.md"].decode(), "QueuePool")}
    scripts |= {Path(e).name: files[e].decode() for e in EXAMPLES}
    work.mkdir()
    failed = 0
    for name, text in scripts.items():
        (work / name).write_text(rewrite(text, found))
        start = time.perf_counter()
        try:
            code, out = run_bounded([python, name], timeout=timeout, cwd=work, env=env)
        except Timeout as error:
            code, out = -1, str(error)
        failed += code != 0
        print(f"example {name}: {'exit 0' if code == 0 else f'FAILED (exit {code})'} in {time.perf_counter() - start:.1f} s")
        if code != 0:
            print(out[-4000:])
    return failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help=f"a git checkout (or mirror) of {PROJECT}")
    parser.add_argument("--commit", default=DEFAULT_COMMIT, help=f"the commit whose tests to run (default: {DEFAULT_COMMIT[:7]})")
    parser.add_argument("--python", default=sys.executable, help="an interpreter with dask and distributed (default: this one)")
    parser.add_argument("--examples", action="store_true", help="also run the README example and the two perf scripts")
    parser.add_argument(
        "--timeout", type=float, default=900, help="seconds the pytest run, and each example, may take (default 900)"
    )
    args = parser.parse_args()
    paths = ["tests", "integration", "conftest.py", "pytest.ini"] + (["README.md", *EXAMPLES] if args.examples else [])
    try:
        commit = resolve(args.repo, args.commit, PROJECT)
        files = extract(args.repo, commit, paths, PROJECT)
        sources = {path: data.decode() for path, data in files.items() if path.endswith(".py")}
        if args.examples:
            sources["readme_example.py"] = readme_block(files["README.md"].decode(), "QueuePool")
        has = probe(args.python, wanted(list(sources.values())))
    except UsageError as error:
        return fail_usage(parser.prog, error)
    versions = ", ".join(f"{k} {v}" for k, v in has["versions"].items())
    print(f"daskqueue {commit[:12]}: tests/ and integration/ on {COMPAT} (--python {args.python}: {versions})")
    with tempfile.TemporaryDirectory(prefix="daskqueue-suite-") as tmp:
        work = Path(tmp) / "daskqueue"
        for path, data in files.items():
            if path in ("README.md", *EXAMPLES):
                continue
            (work / path).parent.mkdir(parents=True, exist_ok=True)
            (work / path).write_bytes(rewrite(data.decode(), has["found"]).encode() if path.endswith(".py") else data)
        (Path(tmp) / f"{FIXTURES_MODULE}.py").write_text(FIXTURES)
        env = {**os.environ, "PYTHONPATH": python_path(Path(tmp))}
        per_test = ["--timeout", "120"] if has["timeout"] else []
        try:
            outcome = run_pytest(
                args.python, [*per_test, "tests", "integration"], cwd=work, excluded=list(EXCLUDED), env=env, timeout=args.timeout
            )
        except Timeout as error:
            print(f"FAILED: {error}")
            return 1
        deselected = outcome.deselected
        excluded = [
            (what, sum(1 for d in deselected if d == what or d.startswith(what + "::")), why) for what, why in EXCLUDED.items()
        ]
        for what, n, _ in excluded:
            if n == 0:
                print(f"note: {what} is listed as excluded but is not among the tests at {args.commit}")
        status = report(outcome, [e for e in excluded if e[1]])
        if args.examples and run_examples(args.python, files, has["found"], Path(tmp) / "examples", env, args.timeout):
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
