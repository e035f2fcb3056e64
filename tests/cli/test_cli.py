"""The `conveyor` command, run as a user runs it, and the project's lint gate.

The commands are registered in `conveyor.cli.commands` and reach servers through
`conveyor.cli.connecting`; `conveyor demo` runs every scene (`conveyor.cli.demo`, `conveyor.cli.scenes`,
over `conveyor.cli.corpus`; scene e, `conveyor.cli.inference`); `conveyor dead-letters` is
`conveyor.cli.dead_letters`, `conveyor drop` `conveyor.cli.drop`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from ..support.servers import wait_for

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_every_scene_and_reports_what_it_measured() -> None:
    """Four scenes, small: every page of the map comes back or is reported with its reason.

    Plain Spark aborts on the crashing pages (or is cancelled, on a busy machine), is cancelled on
    the hanging one, and recovers the killed worker.
    """
    cmd = [sys.executable, "-m", "conveyor", "demo", "--pages", "1200", "--scenes", "abc", "--kill-worker", "--dashboard"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, "COLUMNS": "200"})
    seen: list[dict[str, Any]] = []  # the dashboard's overview, read while the demo runs

    def watch(lines: Any, into: list[str]) -> None:
        for line in lines:
            into.append(line)
            if line.startswith("dashboard on "):
                url = line.split()[2]
                with urllib.request.urlopen(url + "api/overview", timeout=30) as r:
                    seen.append(json.loads(r.read()))

    err: list[str] = []
    std: list[str] = []
    pipes = ((proc.stderr, err), (proc.stdout, std))
    readers = [threading.Thread(target=watch, args=(pipe, into), daemon=True) for pipe, into in pipes]
    for r in readers:
        r.start()
    try:
        proc.wait(timeout=400)
    finally:
        proc.kill()
        for r in readers:
            r.join(30)
        for pipe, _ in pipes:
            assert pipe is not None
            pipe.close()
    out = subprocess.CompletedProcess(cmd, proc.returncode, "".join(std), "".join(err))
    assert out.returncode == 0, out.stderr[-3000:]
    assert len(seen) == 1 and [s["up"] for s in seen[0]["servers"]] == [True, True], seen  # the embedded pool's 2
    verdicts = {line[0]: line for line in out.stdout.splitlines() if line[:3] in ("a. ", "b. ", "c. ", "d. ")}
    assert set(verdicts) == set("abcd"), out.stdout
    assert "map: 1,199 of 1,200 pages back, 1 failed (1 ValueError)" in verdicts["a"]
    assert "plain Spark: 1,199 pages" in verdicts["a"]
    assert "map: 297 of 300 pages back, 3 failed (3 WorkerDied)" in verdicts["b"]
    # plain Spark gets 1.5x the map's makespan: on a busy machine its four worker crashes may outlast that
    aborted = "plain Spark: job aborted, no page back" in verdicts["b"]
    assert aborted or re.search(r"plain Spark: still running after \d+ s, no page back", verdicts["b"]), verdicts["b"]
    assert "map: 299 of 300 pages back, 1 failed (1 TimeLimitExceeded)" in verdicts["c"]
    assert re.search(r"plain Spark: still running after \d+ s, no page back", verdicts["c"])
    assert "map: 1,199 of 1,200 pages back, 1 failed (1 ValueError)" in verdicts["d"]
    assert "plain Spark: 1,199 pages" in verdicts["d"]
    assert ("a task failed 4 times (its Python worker crashed)" in out.stdout) == aborted
    assert "killed consumer pid" in out.stderr and "a consumer killed at" in out.stdout
    # plain Spark's worker is killed at the same second, if its job still runs then (it is told either way)
    assert ("killed Spark's Python worker pid" in out.stderr) == ("a Python worker killed at" in out.stdout)
    assert "Python worker exited unexpectedly" not in out.stderr  # the faults we cause are told, not logged with traces


def test_demo_scene_e_predicts_every_image_as_plain_spark_does() -> None:
    """Scene e, small: map_batches with a model class and predict_batch_udf, both measured, rows matched."""
    cmd = [sys.executable, "-m", "conveyor", "demo", "--scenes", "e", "--pages", "200"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr[-3000:]
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("e. ")), "")
    verdict = re.search(
        r"map_batches: 2,000 of 2,000 images, ([\d,]+)/s, model built (\d+) times for (\d+) consumers; "
        r"plain Spark: ([\d,]+)/s\. map_batches ran at ([\d.]+)x its rate \((faster|slower)\); "
        r"every row the same prediction",
        line,
    )
    assert verdict, out.stdout
    mine, built, consumers, theirs, ratio = (float(verdict.group(i).replace(",", "")) for i in range(1, 6))
    assert mine > 0 and theirs > 0 and ratio > 0
    assert 0 <= built <= consumers  # once per consumer process at most (0: the warm-up's kept for the run)
    assert re.search(r"conveyor demo: e\. .*, 2,000 images", out.stdout), out.stdout
    assert re.search(r"conveyor map_batches +│ +2,000 │", out.stdout), out.stdout  # every row back
    assert "documents, page by page" not in out.stdout  # no page scene ran


def test_demo_reports_scene_e_not_run_without_scikit_learn(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the demo extra, scene e is reported as not run, with the pip command, and nothing starts."""
    import io

    from rich.console import Console

    from conveyor.cli.demo import NotRun, _inference, verdicts

    monkeypatch.setitem(sys.modules, "sklearn", None)  # find_spec then answers None: as if not installed
    text = io.StringIO()
    result = _inference(None, None, 200, 2, Console(file=text, width=200))  # type: ignore[arg-type]  # neither is reached
    assert isinstance(result, NotRun) and result.expected()
    assert "pip install 'conveyor[demo]'" in result.reason and "sklearn not installed" in result.reason
    assert verdicts([result])[0].startswith("e. not run: conveyor demo's scene e needs Conveyor's 'demo' extra")
    assert "pip install 'conveyor[demo]'" in text.getvalue()


def test_demo_rejects_bad_arguments() -> None:
    cmd = [sys.executable, "-m", "conveyor", "demo", "--pages", "0"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--pages" in out.stderr
    out = subprocess.run([*cmd[:-2], "--scenes", "ax"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--scenes" in out.stderr and "'abcde'" in out.stderr


def test_version() -> None:
    out = subprocess.run([sys.executable, "-m", "conveyor", "--version"], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.startswith("conveyor, version ")


def test_h_shows_the_help_of_the_command_and_of_each_subcommand() -> None:
    for args in ([], ["worker"], ["serve"], ["stats"], ["dead-letters"]):
        out = subprocess.run([sys.executable, "-m", "conveyor", *args, "-h"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and out.stdout.startswith("Usage: "), (args, out.stderr)
        assert "-h, --help" in out.stdout, args


def test_stats_and_dead_letters_commands(tmp_path: Path) -> None:
    from conveyor.client.pool import QueuePool
    from conveyor.message import Message

    with QueuePool.local(n_servers=2, data_dir=tmp_path) as pool:
        pool.put("jobs", [Message(payload=b"job-%d" % i, max_attempts=1) for i in range(30)])
        got = pool.queues.get("jobs", 4)
        errors = [f"Traceback (most recent call last):\nValueError: bad page {i}" for i in range(4)]
        pool.queues.nack("jobs", [m.id for m in got], errors)
        connect = ",".join(pool.addresses)
        run = [sys.executable, "-m", "conveyor"]
        env = {"COLUMNS": "200", "PATH": "/usr/bin:/bin"}
        out = subprocess.run([*run, "stats", "--connect", connect], capture_output=True, text=True, timeout=60, env=env)
        assert out.returncode == 0, out.stderr
        row = next(line for line in out.stdout.splitlines() if "jobs" in line)
        assert [c.strip() for c in row.strip("│ ").split("│")][:6] == ["jobs", "26", "0", "0", "0", "4"]
        out = subprocess.run(
            [*run, "stats", "--connect", connect, "--per-shard"], capture_output=True, text=True, timeout=60, env=env
        )
        assert out.stdout.count("jobs") >= 1 and pool.addresses[0] in out.stdout
        # --watch into a pipe: a dated snapshot per interval as it comes, not one table when stopped
        watch = subprocess.Popen(
            [*run, "stats", "--connect", connect, "--watch", "0.2"], stdout=subprocess.PIPE, text=True, env=env
        )
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(watch.stdout.readline, "")), daemon=True)  # type: ignore[union-attr]
        reader.start()
        try:
            wait_for(lambda: sum("jobs" in line for line in lines) >= 2, timeout=30, what="two snapshots")
        finally:
            watch.terminate()
            watch.wait(30)
            reader.join(30)
            watch.stdout.close()  # type: ignore[union-attr]
        out = subprocess.run(
            [*run, "dead-letters", "--connect", pool.addresses[0], "--connect", pool.addresses[1], "--queue", "jobs"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert out.returncode == 0, out.stderr
        assert "Dead letters of 'jobs': 4" in out.stdout and "ValueError: bad page 3" in out.stdout and "job-" in out.stdout
        out = subprocess.run(
            [*run, "dead-letters", "--connect", connect, "--queue", "nope"], capture_output=True, text=True, timeout=60, env=env
        )
        assert out.returncode == 1 and "no queue named 'nope'" in out.stderr
        out = subprocess.run(
            [*run, "drop", "jobs", "--connect", connect], input="n\n", capture_output=True, text=True, timeout=60, env=env
        )
        assert out.returncode == 1 and "Aborted" in out.stderr and "jobs" in pool.stats()  # asked first; kept
        out = subprocess.run(
            [*run, "drop", "jobs", "nope", "--connect", connect, "--yes"], capture_output=True, text=True, timeout=60, env=env
        )
        assert out.returncode == 0, out.stderr
        assert out.stdout.splitlines() == ["jobs: dropped", "nope: no such queue"] and "jobs" not in pool.stats()


def test_serve_temporary_needs_a_new_or_empty_data_dir(tmp_path: Path) -> None:
    serve = [sys.executable, "-m", "conveyor", "serve", "--port", "0", "--temporary"]
    out = subprocess.run(serve, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "a temporary server needs a data directory" in out.stderr
    (tmp_path / "keep.txt").write_text("not the server's to delete")
    out = subprocess.run([*serve, "--data-dir", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 1 and "needs a new or empty data directory" in out.stderr
    assert (tmp_path / "keep.txt").exists()


def test_serve_stop_with_parent_runs_with_stdin_not_a_pipe(tmp_path: Path) -> None:
    """Started by hand or by a service manager, stdin is /dev/null: nothing to watch there, it serves."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "conveyor", "serve", "--port", "0", "--stop-with-parent"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and "listening on" in proc.stdout.readline()
        assert proc.poll() is None
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
        proc.stdout.close()  # type: ignore[union-attr]


def test_stats_reports_an_unreachable_server() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "conveyor", "stats", "--connect", "tcp://127.0.0.1:1"], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 3 and "DOWN" in out.stdout and "cannot connect to tcp://127.0.0.1:1" in out.stdout


def test_worker_command_runs_tasks_until_empty_and_stats_shows_it(tmp_path: Path) -> None:
    from conveyor.client.pool import QueuePool
    from tests.support import worker_tasks as wt

    with QueuePool.local(n_servers=1, data_dir=tmp_path) as pool:
        handles = wt.add.publish_many([(i, 1) for i in range(50)], _pool=pool)
        connect = pool.addresses[0]
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "conveyor",
                "worker",
                "--connect",
                connect,
                "--tasks",
                "tests.support.worker_tasks",
                "--queues",
                "jobs",
                "--concurrency",
                "4",
                "--until-empty",
            ],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=ROOT,
        )
        assert out.returncode == 0, out.stderr
        assert "processed 50" in out.stderr
        assert pool.gather(handles) == [i + 1 for i in range(50)]
        out = subprocess.run(
            [sys.executable, "-m", "conveyor", "stats", "--connect", connect],
            capture_output=True,
            text=True,
            timeout=60,
            env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"},
        )
        assert "Consumers: 1" in out.stdout and "50" in out.stdout


def test_worker_command_reports_a_missing_task_module() -> None:
    cmd = [sys.executable, "-m", "conveyor", "worker", "--connect", "tcp://127.0.0.1:1", "--tasks", "no.such.module"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and "no.such.module" in out.stderr


def conveyor(*args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run the `conveyor` command from the repository's directory (where `tests.support.worker_tasks` imports)."""
    kw.setdefault("cwd", ROOT)
    return subprocess.run(
        [sys.executable, "-m", "conveyor", *args], capture_output=True, text=True, timeout=kw.pop("timeout", 120), **kw
    )


def test_worker_without_task_modules_warns_and_dead_letters_can_be_requeued(tmp_path: Path) -> None:
    from conveyor.client.pool import QueuePool
    from conveyor.tasks.envelope import decode_result
    from tests.support import worker_tasks as wt

    with QueuePool.local(n_servers=2, data_dir=tmp_path) as pool:
        wt.add.publish_many([(i, 1) for i in range(20)], _pool=pool)
        connect = ",".join(pool.addresses)
        out = conveyor("worker", "--connect", connect, "--queues", "jobs", "--until-empty")
        assert out.returncode == 0, out.stderr
        assert "warning" in out.stderr and "no task modules (--tasks MODULE" in out.stderr
        assert "only ad-hoc callables" in out.stderr
        dead = pool.dead_letters("jobs")
        assert len(dead) == 20 and all(d.message.attempts == 1 for d in dead)  # unknown: no retry can mend it
        assert (
            "conveyor worker --tasks MODULE" in dead[0].error and "unknown task 'tests.support.worker_tasks.add'" in dead[0].error
        )
        out = conveyor("dead-letters", "--connect", connect, "--queue", "jobs", "--requeue", input="n\n")
        assert out.returncode == 1 and "Put 20 dead letter(s) of 'jobs' back" in out.stderr and "Aborted" in out.stderr
        assert len(pool.dead_letters("jobs")) == 20  # asked first; kept
        out = conveyor("dead-letters", "--connect", connect, "--queue", "jobs", "--requeue", "--yes")
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "jobs: requeued 20 dead letter(s)" and pool.dead_letters("jobs") == []
        out = conveyor(
            "worker", "--connect", connect, "--queues", "jobs", "--tasks", "tests.support.worker_tasks", "--until-empty"
        )
        assert out.returncode == 0, out.stderr
        assert "warning" not in out.stderr and "processed 20," in out.stderr
        assert sorted(decode_result(r) for _, r in pool.queues.results("jobs")) == [i + 1 for i in range(20)]
        assert pool.dead_letters("jobs") == []
        out = conveyor("dead-letters", "--connect", connect, "--queue", "jobs", "--requeue")
        assert out.returncode == 0 and out.stdout.strip() == "jobs: no dead letters"


def test_worker_refuses_both_a_queue_yaml_and_queue_names(tmp_path: Path) -> None:
    (tmp_path / "q.yaml").write_text("images:\n  priority: 10\n")
    out = conveyor("worker", "--connect", "tcp://127.0.0.1:1", "--queues-config", str(tmp_path / "q.yaml"), "--queues", "nothing")
    assert out.returncode == 2 and "--queues-config or --queues, not both" in out.stderr


def test_worker_refuses_pinning_task_processes() -> None:
    out = conveyor("worker", "--connect", "tcp://127.0.0.1:1", "--queues", "q", "--pool", "process", "--pin-core")
    assert out.returncode == 2 and "--pin-core is for --pool thread" in out.stderr


@pytest.mark.parametrize("how", [[], ["--processes", "2", "--pool", "process"]], ids=["one-process", "children"])
def test_worker_imports_task_modules_from_the_current_directory(tmp_path: Path, how: list[str]) -> None:
    """`--tasks myapp.tasks` from the project's directory imports, as Celery's worker does.

    It imports in the worker and in its consumer and task processes, although `python -P` (like the
    console script) leaves the current directory off sys.path.
    """
    from conveyor.client.pool import QueuePool
    from conveyor.constants import H_TASK
    from conveyor.message import Message
    from conveyor.tasks.envelope import decode_result, encode_call

    project = tmp_path / "project"
    (project / "myapp").mkdir(parents=True)
    (project / "myapp" / "__init__.py").write_text("")
    (project / "myapp" / "tasks.py").write_text(
        "import conveyor\n\n\n@conveyor.task(queue='jobs')\ndef shout(s):\n    return s.upper()\n"
    )
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    with QueuePool.local(n_servers=1, data_dir=tmp_path / "data") as pool:
        payload, headers = encode_call("myapp.tasks.shout", ("hi",), {})
        pool.put("jobs", [Message(payload=payload, headers={**headers, H_TASK: "myapp.tasks.shout"}) for _ in range(4)])
        args = ["worker", "--connect", pool.addresses[0], "--queues", "jobs", "--until-empty", *how]
        out = conveyor(*args, "--tasks", "myapp.tasks", cwd=project, env=env)
        assert out.returncode == 0, out.stderr
        assert [decode_result(r) for _, r in pool.queues.results("jobs")] == ["HI"] * 4 and pool.dead_letters("jobs") == []
        out = conveyor(*args, "--tasks", "myapp.nothing", cwd=project, env=env)
        assert out.returncode == 1 and "cannot import task module 'myapp.nothing'" in out.stderr
        assert "current directory" in out.stderr


@pytest.mark.parametrize("until_empty", [True, False], ids=["until-empty", "until-sigterm"])
def test_worker_with_several_processes_prints_their_summed_counts(tmp_path: Path, until_empty: bool) -> None:
    from conveyor.client.pool import QueuePool
    from tests.support import worker_tasks as wt

    with QueuePool.local(n_servers=2, data_dir=tmp_path) as pool:
        handles = wt.add.publish_many([(i, 1) for i in range(40)], _pool=pool)
        args = [
            "worker",
            "--connect",
            ",".join(pool.addresses),
            "--tasks",
            "tests.support.worker_tasks",
            "--queues",
            "jobs",
            "--processes",
            "2",
            "--concurrency",
            "2",
        ]
        if until_empty:
            out = conveyor(*args, "--until-empty")
            assert out.returncode == 0, out.stderr
            stderr = out.stderr
        else:
            proc = subprocess.Popen([sys.executable, "-m", "conveyor", *args], cwd=ROOT, stderr=subprocess.PIPE, text=True)
            try:
                pool.join("jobs", timeout=60, progress=False)
            finally:
                proc.terminate()
                _, stderr = proc.communicate(timeout=60)
            assert proc.returncode == 0, stderr
        assert pool.gather(handles) == [i + 1 for i in range(40)]
        summary = stderr.strip().splitlines()[-1]  # stealing depends on timing
        assert re.fullmatch(r"processed 40, failed 0 \(retried 0, dead 0\), timed out 0, stolen \d+", summary), stderr


@pytest.mark.parametrize("processes", ["1", "2"])
def test_worker_until_empty_gives_up_on_servers_it_cannot_reach(processes: str) -> None:
    from ..support.procs import free_port

    started = time.monotonic()
    out = conveyor(
        "worker",
        "--connect",
        f"tcp://127.0.0.1:{free_port()}",
        "--tasks",
        "tests.support.worker_tasks",
        "--queues",
        "jobs",
        "--until-empty",
        "--connect-timeout",
        "2",
        "--processes",
        processes,
        timeout=60,
    )
    assert out.returncode == 1 and "cannot connect to tcp://127.0.0.1:" in out.stderr
    assert "--connect-timeout (2 s): is the server running?" in out.stderr
    assert time.monotonic() - started < 30


def test_worker_without_until_empty_waits_for_a_server_to_come_up(tmp_path: Path) -> None:
    """A long-lived worker keeps retrying: it serves a server started after it."""
    from conveyor.client.pool import QueuePool
    from conveyor.server.processes import spawn_server, stop_server
    from tests.support import worker_tasks as wt

    from ..support.procs import free_port

    address = f"tcp://127.0.0.1:{free_port()}"
    args = ["worker", "--connect", address, "--tasks", "tests.support.worker_tasks", "--queues", "jobs", "--connect-timeout", "1"]
    proc = subprocess.Popen([sys.executable, "-m", "conveyor", *args], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):  # past --connect-timeout, it is still trying
            proc.wait(3)
        server, _ = spawn_server(tmp_path, port=int(address.rsplit(":", 1)[1]))
        try:
            with QueuePool.connect(address) as pool:
                handles = wt.add.publish_many([(i, 2) for i in range(10)], _pool=pool)
                assert pool.gather(handles, timeout=60) == [i + 2 for i in range(10)]
        finally:
            proc.terminate()
            _, stderr = proc.communicate(timeout=60)
            stop_server(server)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0 and "processed 10," in stderr, stderr
