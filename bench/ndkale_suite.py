"""Run ndkale's own tests of its public API, from a checkout of its repository, on `conveyor.compat.kale`.

    git clone https://github.com/Nextdoor/ndkale /tmp/ndkale
    python bench/ndkale_suite.py --repo /tmp/ndkale [--commit version-2.2.4]

ndkale's tests (`kale/tests/` at `--commit`: nothing of ndkale is kept in this repository) are
copied into a temporary directory as the package `kale_tests`, where only these change (REWRITES):
`from kale import X` and `from kale.X import Y` import from `conveyor.compat.kale`; the dotted
strings `'kale.X...'` (`mock.patch` targets, task names, the settings' class paths) become
`'conveyor.compat.kale.X...'`, and `'kale.tests.X'` becomes `'kale_tests.X'`; `import mock` becomes
`from unittest import mock` (the library the mock package backports); `from kale import sqs` and
`from kale import consumer` go (ndkale's SQS client: only excluded tests use it). The tests are
collected as nose, ndkale's runner, collects them (methods such as `get_queue_test` too, where
pytest takes only `test*`: CONFTEST), with `KALE_SETTINGS_MODULE` naming their `test_settings`, and
run by pytest in a subprocess of this interpreter, with this tree's src/ first on its path. They
import six and botocore (its `ClientError`), which this interpreter must have.

Excluded (EXCLUDED_FILES and EXCLUDED_TESTS, each with its reason; docs/migrating-from-ndkale.md,
"ndkale's own tests"): the tests of ndkale's SQS internals, which Conveyor's servers replace:
`kale.sqs` and `kale.consumer` against moto's fake SQS, `kale.crypt`, the SQS message body format,
the publisher and queue info built over a boto3 `SQSTalk`, and the SQS worker's batch loop. Exit
status 1 if a selected test fails (or none runs), 2 if --repo or --commit is wrong.
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import os
import re
import sys
import tempfile
from pathlib import Path

from seed_suite import Timeout, UsageError, extract, fail_usage, python_path, report, resolve, run_pytest

PROJECT = "Nextdoor/ndkale"
COMPAT = "conveyor.compat.kale"
PACKAGE = "kale_tests"  # kale/tests/ is copied as this package: with no `kale` package, an import left as it was fails
SQS_BOTO = "builds QueueInfo over kale.sqs.SQSTalk() (boto3)"
EXCLUDED_FILES = {  # ndkale's test file -> why all its tests are left out
    "test_sqs.py": "kale.sqs.SQSTalk, ndkale's SQS client, against moto's fake SQS: Conveyor's servers are the queue",
    "test_consumer.py": "kale.consumer.Consumer, ndkale's SQS batch receiver, against moto's fake SQS",
    "test_crypt.py": "kale.crypt, the AES encryption of SQS message bodies: messages are Conveyor's envelope",
    "test_publisher.py": "each builds kale.sqs.SQSTalk() (boto3) and mocks its SQS queue and 900 s delay limit"
    " (the compat's publish checks: tests/compat)",
    "test_worker.py": "ndkale's SQS batch loop (Consumer mocked, fetch_batch/_run_batch/_release_batch, visibility"
    " timeouts, time.time mocked); what a user sees of it: tests/compat/test_compat_kale*.py with a real worker",
}
EXCLUDED_TESTS = {  # a test of a kept file -> why it is left out
    "test_message.py::MessageTestCase::test_encode": "ndkale's SQS body format (pickle, zlib, kale.crypt)",
    "test_message.py::MessageTestCase::test_decode": "decode_sqs of a boto3 message in ndkale's SQS body format",
    "test_queue_info.py::QueueInfoTest::test_queues": SQS_BOTO,
    "test_queue_info.py::QueueInfoTest::test_does_queue_need_work_empty": SQS_BOTO,
    "test_queue_info.py::QueueInfoTest::test_does_queue_need_work_non_empty": SQS_BOTO,
    "test_queue_info.py::QueueInfoTest::test_does_queue_need_work_rate_limited": SQS_BOTO + ", and SQS's ThrottlingException",
}
REWRITES = [
    (re.compile(r"^import mock$", re.M), "from unittest import mock"),
    (re.compile(r"^from kale import (sqs|consumer)\n", re.M), ""),
    (re.compile(r"^from kale import ", re.M), f"from {COMPAT} import "),
    (re.compile(r"^from kale\.(\w+) import ", re.M), rf"from {COMPAT}.\1 import "),
    (re.compile(r"""(['"])kale\.tests\."""), rf"\1{PACKAGE}."),
    (re.compile(r"""(['"])kale\."""), rf"\1{COMPAT}."),
]
NOSE_TEST = re.compile(r"(?:^|[\b_./-])[Tt]est")  # nose's default testMatch
FIXTURES = ("setUp", "tearDown", "setUpClass", "tearDownClass", "setUpModule", "tearDownModule")
CONFTEST = f'''"""Collects the TestCase methods nose would: names matching its testMatch, not only test*."""
import re
import unittest

_NOSE_TEST = re.compile({NOSE_TEST.pattern!r})
_FIXTURES = {FIXTURES!r}


def _nose_names(loader, case):
    return sorted(
        name for name in dir(case)
        if _NOSE_TEST.search(name) and not name.startswith("__") and name not in _FIXTURES and callable(getattr(case, name))
    )


unittest.TestLoader.getTestCaseNames = _nose_names
'''


def redirected(text: str) -> str:
    """A test file's text with REWRITES made."""
    for pattern, replacement in REWRITES:
        text = pattern.sub(replacement, text)
    return text


def nose_tests(text: str) -> int:
    """How many tests nose collects from a test file (the methods and functions its testMatch takes)."""
    tree = ast.parse(text)
    functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        functions += [n for n in cls.body if isinstance(n, ast.FunctionDef)]
    return sum(1 for f in functions if NOSE_TEST.search(f.name) and not f.name.startswith("__") and f.name not in FIXTURES)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repo", type=Path, required=True, help=f"a git checkout (or mirror) of {PROJECT}")
    parser.add_argument("--commit", default="version-2.2.4", help="the commit whose tests to run (default: version-2.2.4)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds the pytest run may take (default 600)")
    args = parser.parse_args()
    try:
        commit = resolve(args.repo, args.commit, PROJECT)
        files = extract(args.repo, commit, ["kale/tests"], PROJECT)
        missing = [m for m in ("six", "botocore") if importlib.util.find_spec(m) is None]
        if missing:
            raise UsageError(
                f"ndkale's tests import {' and '.join(missing)}: pip install {' '.join(missing)} in {sys.executable}"
            )
    except UsageError as error:
        return fail_usage(parser.prog, error)
    print(f"ndkale {args.commit} ({commit[:12]}): kale/tests on {COMPAT}")
    texts = {Path(path).name: data for path, data in files.items()}
    with tempfile.TemporaryDirectory(prefix="ndkale-suite-") as tmp:
        work = Path(tmp)
        (work / PACKAGE).mkdir()
        for name, data in texts.items():
            if name in EXCLUDED_FILES:
                continue
            if name.endswith(".py"):
                (work / PACKAGE / name).write_text(redirected(data.decode()))
            elif not name.endswith(".pyc"):
                (work / PACKAGE / name).write_bytes(data)  # test_queue_config.yaml
        (work / "conftest.py").write_text(CONFTEST)
        (work / "pytest.ini").write_text("[pytest]\n")  # this rootdir's, not the tree's pyproject.toml
        env = {**os.environ, "PYTHONPATH": python_path(work), "KALE_SETTINGS_MODULE": f"{PACKAGE}.test_settings"}
        try:
            outcome = run_pytest(
                sys.executable,
                [PACKAGE],
                cwd=work,
                excluded=[f"{PACKAGE}/{t}" for t in EXCLUDED_TESTS],
                env=env,
                timeout=args.timeout,
            )
        except Timeout as error:
            print(f"FAILED: {error}")
            return 1
    excluded = [
        (f"kale/tests/{name}", nose_tests(texts[name].decode()), why) for name, why in EXCLUDED_FILES.items() if name in texts
    ]
    excluded += [(f"kale/tests/{t}", 1, why) for t, why in EXCLUDED_TESTS.items() if f"{PACKAGE}/{t}" in outcome.deselected]
    listed = [f"kale/tests/{name}" for name in [*EXCLUDED_FILES, *EXCLUDED_TESTS]]
    for stale in sorted(set(listed) - {what for what, _, _ in excluded}):
        print(f"note: {stale} is listed as excluded but is not among the tests at {args.commit}")
    return report(outcome, excluded)


if __name__ == "__main__":
    sys.exit(main())
