"""What bench/ndkale_suite.py and bench/daskqueue_suite.py share: a seed system's own tests, run on a compat layer.

The seed system's files are taken at run time from a git repository the user gives (a checkout or a
bare mirror) with `git archive`, so nothing of them is kept in this repository. pytest runs them in
a subprocess of its own process group, killed if it outlasts its time, with a plugin (PLUGIN) that
deselects the excluded tests by exact node id (`--deselect` matches prefixes: `test_durable_queue`
would drop `test_durable_queuepool` too) and writes each test's outcome to a JSON file.
"""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import tarfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GIT_TIMEOUT = 120  # seconds, for each git command
PLUGIN_MODULE = "seed_suite_plugin"
PLUGIN = '''"""Deselects the excluded tests by exact node id (or a whole file ending in .py), records each test's outcome."""
import json
import os

EXCLUDED = json.loads(os.environ["SEED_SUITE_EXCLUDED"])
outcomes, deselected = {}, []


def _excluded(nodeid):
    return any(nodeid == e or (e.endswith(".py") and nodeid.startswith(e + "::")) for e in EXCLUDED)


def pytest_collection_modifyitems(config, items):
    drop = [item for item in items if _excluded(item.nodeid)]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if not _excluded(item.nodeid)]
        deselected.extend(item.nodeid for item in drop)


def pytest_collectreport(report):
    if report.failed:
        outcomes[report.nodeid or "<collection>"] = "failed"


def pytest_runtest_logreport(report):
    if report.failed:
        outcomes[report.nodeid] = "failed"
    elif report.skipped:
        outcomes.setdefault(report.nodeid, "skipped")
    elif report.when == "call":
        outcomes.setdefault(report.nodeid, "passed")


def pytest_sessionfinish(session, exitstatus):
    with open(os.environ["SEED_SUITE_OUTCOMES"], "w") as f:
        json.dump({"outcomes": outcomes, "deselected": deselected}, f)
'''


class UsageError(Exception):
    """A wrong --repo, --commit or interpreter: the scripts report it and exit with status 2."""


class Timeout(Exception):
    """A subprocess outlasted its time and was killed with its process group."""


def run_bounded(cmd: list[str], *, timeout: float, cwd: Path | None = None, env: dict[str, str] | None = None) -> tuple[int, str]:
    """Run `cmd` in a new process group, its stdout and stderr together; the group is killed after `timeout` seconds."""
    with subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True
    ) as proc:
        try:
            out, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise Timeout(f"{' '.join(cmd[:4])} ... did not finish in {timeout:g} s: killed") from None
        return proc.returncode, out


def resolve(repo: Path, commit: str, project: str) -> str:
    """The full id of `commit` in the git repository at `repo`, a checkout or mirror of `project`."""
    if not repo.is_dir():
        raise UsageError(f"--repo {repo}: no such directory (git clone https://github.com/{project} first)")
    git = ["git", "-C", str(repo)]
    found = subprocess.run([*git, "rev-parse", "--git-dir"], capture_output=True, text=True, timeout=GIT_TIMEOUT)
    if found.returncode != 0:
        raise UsageError(f"--repo {repo}: not a git repository (a clone of https://github.com/{project} is needed)")
    found = subprocess.run(
        [*git, "rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], capture_output=True, text=True, timeout=GIT_TIMEOUT
    )
    if found.returncode != 0:
        raise UsageError(f"--commit {commit}: no such commit in {repo} (is it a clone of {project}? try git fetch --tags)")
    return found.stdout.strip()


def extract(repo: Path, commit: str, paths: list[str], project: str) -> dict[str, bytes]:
    """The files under `paths` at `commit` of `repo` (git archive), by path."""
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", "--format=tar", commit, "--", *paths], capture_output=True, timeout=GIT_TIMEOUT
    )
    if archive.returncode != 0:
        raise UsageError(f"{commit} of {repo} has no {' '.join(paths)}: not {project}? ({archive.stderr.decode().strip()})")
    files = {}
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        for member in tar.getmembers():
            extracted = tar.extractfile(member) if member.isfile() else None
            if extracted is not None:
                files[member.name] = extracted.read()
    return files


def python_path(*extra: Path) -> str:
    """PYTHONPATH for a subprocess: this tree's src/ first, then `extra`, then what was set."""
    parts = [str(ROOT / "src"), *map(str, extra), os.environ.get("PYTHONPATH", "")]
    return os.pathsep.join(p for p in parts if p)


@dataclass
class Outcome:
    """What a pytest run gave: each selected test's outcome, the node ids deselected, and its output."""

    tests: dict[str, str]
    deselected: list[str]
    returncode: int
    output: str

    def count(self, outcome: str) -> int:
        """How many tests had `outcome` (passed, failed or skipped)."""
        return sum(1 for o in self.tests.values() if o == outcome)


def run_pytest(python: str, args: list[str], *, cwd: Path, excluded: list[str], env: dict[str, str], timeout: float) -> Outcome:
    """pytest's outcomes on `args`, run by `python` in `cwd` with PLUGIN (written there) deselecting `excluded`."""
    (cwd / f"{PLUGIN_MODULE}.py").write_text(PLUGIN)  # python -m puts the working directory on the path
    results = cwd / "seed-suite-outcomes.json"
    env = {**env, "SEED_SUITE_EXCLUDED": json.dumps(excluded), "SEED_SUITE_OUTCOMES": str(results)}
    cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:randomly", "-p", PLUGIN_MODULE, "-rfE", *args]
    returncode, output = run_bounded(cmd, timeout=timeout, cwd=cwd, env=env)
    if not results.exists():  # pytest stopped before its session finished
        return Outcome({"<pytest run>": "failed"}, [], returncode, output)
    found = json.loads(results.read_text())
    return Outcome(found["outcomes"], found["deselected"], returncode, output)


def report(outcome: Outcome, excluded: list[tuple[str, int, str]]) -> int:
    """Print the counts, each exclusion (`what`, how many tests, why) and the verdict; the exit status."""
    by_file: dict[str, Counter[str]] = {}
    for nodeid, result in outcome.tests.items():
        by_file.setdefault(nodeid.split("::")[0], Counter())[result] += 1
    for path, counts in sorted(by_file.items()):
        print(f"  {path}: " + ", ".join(f"{n} {result}" for result, n in sorted(counts.items())))
    failed = sorted(nodeid for nodeid, result in outcome.tests.items() if result == "failed")
    passed, skipped, n_excluded = outcome.count("passed"), outcome.count("skipped"), sum(n for _, n, _ in excluded)
    ok = not failed and passed > 0 and outcome.returncode == 0
    if not ok:
        print(outcome.output[-8000:])
    for nodeid in failed:
        print(f"FAILED {nodeid}")
    print("excluded (tests of internals the compat does not have):")
    for what, n, why in excluded:
        print(f"  {what} ({n}): {why}")
    print(f"{passed} passed, {len(failed)} failed, {skipped} skipped, {n_excluded} excluded")
    print("all selected tests pass" if ok else f"FAILED (pytest exit status {outcome.returncode})")
    return 0 if ok else 1


def readme_block(readme: str, containing: str) -> str:
    """The one ```python block of a README that contains `containing`."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if containing in b]
    if len(blocks) != 1:
        raise UsageError(f"the README has {len(blocks)} python blocks with {containing!r}, not 1")
    return blocks[0]


def fail_usage(prog: str, error: Exception) -> int:
    """Report a usage error as argparse does; the exit status 2."""
    print(f"{prog}: error: {error}", file=sys.stderr)
    return 2
