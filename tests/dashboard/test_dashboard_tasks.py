"""The dashboard's tasks: a queue's running and recent tasks, a task's page, and cancelling from it.

In the system's Chromium over real queue servers and consumer processes running the tasks of
tests/support/worker_tasks.py: a running task shown with its name and consumer, then its end with
its state, attempts and runtime; a failing task's page with its error and history; the filters by
name, state and id; argument previews (msgpack decoded, a pickle only named); cancel with the
requeue's rules; hostile names and errors shown as text; a server down named. Screenshots for the
docs: dashboard-tasks and dashboard-task (CONVEYOR_SCREENSHOTS=DIR). The endpoints behind them are
`conveyor.dashboard.task_lookup`'s.
"""

from __future__ import annotations

import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest

from conveyor.client.pool import QueuePool
from conveyor.client.sharded import format_id
from conveyor.constants import CANCELLED_ERROR, H_TASK
from conveyor.dashboard import Dashboard
from conveyor.message import Message
from conveyor.worker import ConsumerPool

from ..support import worker_tasks as wt
from ..support.servers import wait_for
from .browsing import call_json, shot

pytestmark = pytest.mark.timeout(150)
MODULES = ["tests.support.worker_tasks"]
WAITS = "tests.support.worker_tasks.waits_for_file"
FAILS = "tests.support.worker_tasks.always_fails"
ADD = "tests.support.worker_tasks.add"


class Opaque:
    """An argument msgpack cannot carry: the call is pickled."""

    def __init__(self, n: int) -> None:
        self.n = n


def rows(page: Any, table: str) -> list[list[str]]:
    """The cells' texts of every row of a table, read at once (the page redraws its tables each second)."""
    got = page.evaluate(
        "t => [...document.querySelectorAll('#' + t + ' tbody tr')].map(r => [...r.cells].map(c => c.textContent))", table
    )
    return [[str(c) for c in r] for r in got]


def cells(page: Any, table: str, msg_id: str) -> list[str]:
    """The cells of the first row of `table` (running, recent) for this id, or [] if none."""
    return next((r for r in rows(page, table) if r[0] == msg_id), [])


def column(page: Any, table: str, n: int) -> list[str]:
    return [r[n] for r in rows(page, table)]


def text(page: Any, selector: str) -> str:
    return str(page.locator(selector).text_content())


def test_a_running_task_then_its_end_and_a_failing_tasks_page_with_its_error_and_history(page: Any, tmp_path: Path) -> None:
    release = tmp_path / "release"
    with QueuePool.local(n_servers=2) as pool, Dashboard(pool, port=0) as board:
        waits = format_id(wt.waits_for_file.publish(str(release), 60.0, _pool=pool).id)
        fails = format_id(wt.always_fails.publish(str(tmp_path / "log"), _pool=pool).id)  # 3 attempts, then a dead letter
        adds = format_id(wt.add.publish(2, 40, _pool=pool).id)
        cp = ConsumerPool(pool, 1, queues=["jobs"], concurrency=2, task_modules=MODULES, restart=False).start()
        try:
            page.goto(board.url + "#/queue/jobs")
            wait_for(lambda: cells(page, "running", waits), 20, "the running task listed")
            row = cells(page, "running", waits)
            assert row[1] == WAITS and row[2] == "running" and row[3] == "1"
            assert f":{cp.processes[0].pid}:" in row[5]  # its consumer, by name
            wait_for(lambda: cells(page, "recent", fails)[2:3] == ["failed"], 30, "the failing task's end")
            wait_for(lambda: cells(page, "recent", adds)[2:3] == ["acked"], 10, "the add's end")
            shot(page, "dashboard-tasks")
            release.touch()
            wait_for(lambda: cells(page, "recent", waits)[2:3] == ["acked"], 20, "the released task's end")
            row = cells(page, "recent", waits)
            assert row[1] == WAITS and row[3] == "1" and re.fullmatch(r"\d+\.\d\d s", row[4]) and row[5]
            assert not cells(page, "running", waits)
            runs = [r for r in rows(page, "recent") if r[0] == fails]
            assert [(r[2], r[3]) for r in runs] == [("failed", "3"), ("retried", "2"), ("retried", "1")]

            # the filters: a part of the name, a state, an id
            page.fill("#tasks-search", "always")
            wait_for(lambda: set(column(page, "recent", 1)) == {FAILS}, 10, "only the failing task's runs")
            assert len(rows(page, "recent")) == 3
            page.select_option("#tasks-state", "failed")
            wait_for(lambda: len(rows(page, "recent")) == 1, 10, "its failed run only")
            page.fill("#tasks-search", "")
            page.select_option("#tasks-state", "")
            page.fill("#tasks-id", adds)
            wait_for(lambda: column(page, "recent", 0) == [adds], 10, "the add's run only")
            assert rows(page, "running") == []
            page.fill("#tasks-id", "not an id")
            wait_for(lambda: "not a message id" in text(page, "#tasks-status"), 10, "a bad id said so")
            page.fill("#tasks-id", "")
            wait_for(lambda: len(rows(page, "recent")) == 5, 10, "every run again")

            # the failing task's page: its error whole, its history
            page.locator(f"#recent tbody tr[data-id='{fails}']").first.click()
            wait_for(lambda: page.url.endswith(f"#/queue/jobs/task/{fails}"), 5, "the task's own URL")
            wait_for(lambda: "Traceback" in text(page, "#task-error"), 10, "its error")
            assert "ValueError: this input is bad" in text(page, "#task-error")
            assert text(page, "#task-name") == FAILS and text(page, "#task-state").startswith("failed")
            assert text(page, "#task-payload").startswith(f"{FAILS}('")
            events = column(page, "task-history", 1)
            assert events == ["put", "delivered", "retried", "delivered", "retried", "delivered", "failed"]
            assert "ValueError: this input is bad" in text(page, "#task-history tbody tr:last-child")
            assert page.locator("#task-cancel").is_hidden()  # a dead letter: nothing to cancel
            shot(page, "dashboard-task")
            page.reload()  # the link alone opens it
            wait_for(lambda: "Traceback" in text(page, "#task-error"), 10, "its page from its link")
            page.goto(board.url + f"#/queue/jobs/task/{adds}")
            wait_for(lambda: text(page, "#task-result") == "42", 10, "another task's result")
            assert text(page, "#task-payload") == f"{ADD}(2, 40)" and text(page, "#task-error") == "–"
        finally:
            release.touch()
            cp.cancel()
    assert page.errors == [] and page.refused == []


def test_the_argument_preview_decodes_msgpack_and_only_names_a_pickle(page: Any) -> None:
    with QueuePool.local(n_servers=1) as pool, Dashboard(pool, port=0) as board:
        plain = format_id(wt.add.publish(2, 40, _pool=pool).id)
        pickled = format_id(wt.add.publish(Opaque(1), 1, _pool=pool).id)
        assert len(pool.queues.clients[0].get("jobs", 2, consumer="by-hand")) == 2  # delivered: its server keeps the preview
        page.goto(board.url + f"#/queue/jobs/task/{plain}")
        wait_for(lambda: text(page, "#task-payload") == f"{ADD}(2, 40)", 10, "the decoded call")
        assert text(page, "#task-state").startswith("delivered")
        page.goto(board.url + f"#/queue/jobs/task/{pickled}")
        wait_for(lambda: re.fullmatch(r"pickled, [\d,]+ bytes", text(page, "#task-payload")), 10, "the pickle named")
        assert text(page, "#task-id") == pickled
        assert page.locator("#task-headers tbody tr th", has_text="ct").count() == 1
    assert page.errors == [] and page.refused == []


def test_cancel_from_the_task_page_under_the_requeues_rules(page: Any) -> None:
    with QueuePool.local(n_servers=2) as pool, Dashboard(pool, port=0) as board:
        later = format_id(wt.add.publish(1, 2, _delay=600, _pool=pool).id)  # delayed: cancellable
        ready = wt.add.publish(3, 4, _pool=pool).id
        page.goto(board.url + "#/queue/jobs")
        page.fill("#tasks-id", later)  # not delivered yet: no records, but a link to its page
        page.click("#tasks-open")
        wait_for(lambda: text(page, "#task-state").startswith("ready"), 10, "its status")
        assert page.url.endswith(f"#/queue/jobs/task/{later}")
        assert page.locator("#task-cancel").is_visible()
        page.click("#task-cancel")
        wait_for(lambda: text(page, "#task-status") == "cancelled", 10, "cancelled")
        wait_for(lambda: text(page, "#task-state").startswith("failed"), 10, "a dead letter now")
        assert text(page, "#task-error") == CANCELLED_ERROR and page.locator("#task-cancel").is_hidden()
        assert len(pool.dead_letters("jobs")) == 1
        # the endpoint: the requeue's CSRF header, and the login when there is a token
        api = board.url + "api/cancel"
        body = {"queue": "jobs", "ids": [format_id(ready)]}
        assert call_json(api, body, {})[0] == 403
        for bad in (
            {"queue": "jobs", "ids": []},
            {"queue": "jobs", "ids": ["x"]},
            {"queue": "jobs", "ids": ["9:1"]},
            {"ids": ["0:1"]},
        ):
            status, reply = call_json(api, bad, {"X-Conveyor": "1"})
            assert status == 400 and "error" in reply, bad
        assert pool.stats("jobs")["jobs"].ready == 1  # nothing changed
        with Dashboard(pool, port=0, token="s3cret") as guarded:
            assert call_json(guarded.url + "api/cancel", body, {"X-Conveyor": "1"})[0] == 401
            assert call_json(guarded.url + "api/cancel", body, {"Authorization": "Bearer s3cret"})[0] == 403
            status, reply = call_json(guarded.url + "api/cancel", body, {"X-Conveyor": "1", "Authorization": "Bearer s3cret"})
        assert status == 200 and reply == {"outcomes": {format_id(ready): "cancelled"}}
        assert pool.stats("jobs")["jobs"].ready == 0
    assert page.errors == [] and page.refused == []


def test_a_hostile_task_name_and_error_show_as_text(page: Any) -> None:
    evil = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script><b>bold</b>'
    with QueuePool.local(n_servers=1) as pool, Dashboard(pool, port=0) as board:
        c = pool.queues.clients[0]
        c.declare("evil", max_attempts=1)
        c.put("evil", [Message(payload=evil.encode(), headers={H_TASK: evil})])
        got = c.get("evil", 1, consumer=evil)
        c.nack("evil", [got[0].id], [f"Traceback (most recent call last):\nValueError: {evil}"])
        msg_id = format_id(got[0].id)
        page.goto(board.url + "#/queue/evil")
        wait_for(lambda: cells(page, "recent", msg_id)[2:3] == ["failed"], 10, "the failed task listed")
        row = cells(page, "recent", msg_id)
        assert row[1] == evil and row[5] == evil and row[7] == f"ValueError: {evil}"  # the line that names the error
        page.locator(f"#recent tbody tr[data-id='{msg_id}']").click()
        wait_for(lambda: evil in text(page, "#task-error"), 10, "its error on its page")
        assert text(page, "#task-name") == evil and evil in text(page, "#task-history")
        assert evil in text(page, "#task-payload")  # not msgpack: its bytes as text
        assert page.locator("main img, main script, main b").count() == 0
        assert page.evaluate("window.pwned === undefined")
    assert page.errors == [] and page.refused == []


def test_a_server_down_marks_the_task_list_partial_naming_it_and_bad_input_is_refused(page: Any) -> None:
    with QueuePool.local(n_servers=2) as pool, Dashboard(pool, port=0) as board:
        for c in pool.queues.clients:
            c.put("jobs", [Message(payload=b"x", headers={H_TASK: "t"})])
            c.get("jobs", 1, consumer="hand")
        api = board.url + "api/"
        status, got = call_json(api + "tasks?queue=jobs")
        assert status == 200 and len(got["running"]) == 2 and got["partial"] is None
        for query in ("", "queue=jobs&limit=0", "queue=jobs&limit=x", "queue=jobs&state=lost", "queue=jobs&id=1:2:3"):
            assert call_json(api + "tasks?" + query)[0] == 400, query
        assert call_json(api + "tasks?queue=nothing")[0] == 404
        for query in ("queue=jobs", "queue=jobs&id=x", "id=0:1", "queue=jobs&id=5:1"):
            assert call_json(api + "task?" + query)[0] == 400, query
        page.goto(board.url + "#/queue/jobs")
        wait_for(lambda: len(rows(page, "running")) == 2, 10, "both servers' running tasks")
        assert page.locator("#tasks-partial").is_hidden()
        where = pool.queues.clients[1].address.removeprefix("tcp://")
        os.kill(pool.servers.processes[1].pid, signal.SIGKILL)  # type: ignore[union-attr]
        wait_for(lambda: page.locator("#tasks-partial").is_visible(), 15, "the list marked partial")
        assert where in text(page, "#tasks-partial") and len(rows(page, "running")) == 1
        status, got = call_json(api + "tasks?queue=jobs")
        assert status == 200 and got["partial"]["unreachable"] == [where] and len(got["running"]) == 1
        status, got = call_json(api + f"task?queue=jobs&id={format_id(pool.queues.global_id(1, 1))}")
        assert status == 502 and where in got["error"]
    assert page.errors == []
