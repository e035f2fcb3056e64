"""`conveyor dashboard` end to end, in a real headless Chromium over real queue servers and consumers.

In the system's Chromium, driven by Playwright, over real queue servers and consumer processes:
counts that follow the work, a killed consumer marked lost and one stopped marked finished, a killed
server shown down while the rest keeps updating (the totals marked partial, its last figures kept
apart), the charts' axes and readout, internal queues hidden until asked for, the requeue button,
the login, bad input (an unreachable server, a wrong token, 100,000 dead letters, script in an error
text), and the page's speed with 2 servers, 100 queues and 50 consumers. Screenshots for the docs
are taken from these runs (CONVEYOR_SCREENSHOTS=DIR writes them there).

The command is `conveyor.cli.dashboard`.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import conveyor.spark as cs
from conveyor.client.pool import QueuePool
from conveyor.client.sharded import format_id, parse_id
from conveyor.constants import H_ROWS
from conveyor.dashboard import Dashboard
from conveyor.errors import ConveyorError
from conveyor.message import Message
from conveyor.spark.consumers import rows_put_records
from conveyor.spark.records import RowsPut
from conveyor.tasks.options import TaskOptions
from conveyor.tasks.publish import build_message
from conveyor.worker import Consumer, ConsumerPool

from ..support import worker_tasks as wt
from ..support.servers import wait_for
from .browsing import call_json, shot

pytestmark = pytest.mark.timeout(120)
MODULES = ["tests.support.worker_tasks"]


def cell(page: Any, table: str, key: str, column: int) -> str:
    """The text of a row's cell (`key`: its data attribute's value), or "" if no such row yet."""
    attr = {"queues": "queue", "consumers": "consumer", "dead": "id"}[table]
    loc = page.locator(f"#{table} tbody tr[data-{attr}='{key}'] td").nth(column)
    return str(loc.text_content()) if loc.count() else ""


def number(text: str) -> int:
    return int(text.replace(",", "")) if text.replace(",", "").isdigit() else -1


def updated(page: Any) -> float:
    return float(page.evaluate("document.body.dataset.updated || '0'"))


def test_counts_follow_the_work_a_killed_consumer_is_lost_and_a_stopped_one_finished(page: Any) -> None:
    with QueuePool.local(n_servers=2) as pool, Dashboard(pool, port=0) as board:
        wt.sleeps.publish_many([(0.05,)] * 400, _pool=pool)
        page.goto(board.url)
        wait_for(lambda: number(cell(page, "queues", "jobs", 1)) == 400, 10, "400 ready on the page")
        cp = ConsumerPool(pool, 2, queues=["jobs"], concurrency=2, task_modules=MODULES, restart=False).start()
        try:
            wait_for(lambda: 100 <= number(cell(page, "queues", "jobs", 4)) < 400, 20, "acked growing on the page")
            working = page.locator("#consumers tbody tr.ok, #consumers tbody tr.slow")
            wait_for(lambda: working.count() == 2, 10, "2 consumers shown working")
            rows = page.locator("#consumers tbody tr")
            wait_for(
                lambda: all(number(str(r.locator("td").nth(3).text_content())) > 0 for r in rows.all()),
                10,
                "their reports of work done",
            )
            shot(page, "dashboard-running")
            victim = cp.processes[0]
            name = next(
                r.get_attribute("data-consumer")
                for r in page.locator("#consumers tbody tr").all()
                if f":{victim.pid}:" in str(r.get_attribute("data-consumer"))
            )
            os.kill(victim.pid, signal.SIGKILL)  # type: ignore[arg-type]
            wait_for(lambda: cell(page, "consumers", name, 9) == "late", 15, "the killed consumer marked late")
            wait_for(lambda: cell(page, "consumers", name, 9) == "lost", 15, "then lost")
            assert page.locator(f"#consumers tbody tr.lost[data-consumer='{name}']").count() == 1
            others = [r for r in page.locator("#consumers tbody tr").all() if r.get_attribute("data-consumer") != name]
            assert len(others) == 1 and others[0].get_attribute("class") in ("ok", "slow")
            # the other one stopped as a consumer pool stops it (SIGTERM): it says so, and is not taken for lost
            survivor = str(others[0].get_attribute("data-consumer"))
            os.kill(cp.processes[1].pid, signal.SIGTERM)  # type: ignore[arg-type]
            wait_for(lambda: cell(page, "consumers", survivor, 9) == "finished", 30, "the stopped consumer marked finished")
            assert page.locator("#consumers tbody tr.finished").count() == 1
            assert cell(page, "consumers", name, 9) == "lost"
            shot(page, "dashboard-finished-and-lost")
        finally:
            cp.cancel()
    assert page.errors == []


def test_a_killed_server_is_shown_down_and_the_rest_keeps_updating(page: Any) -> None:
    with QueuePool.local(n_servers=2) as pool, Dashboard(pool, port=0) as board:
        pool.queues.clients[0].put("jobs", [Message(payload=b"x")] * 60)
        pool.queues.clients[1].put("jobs", [Message(payload=b"x")] * 40)
        page.goto(board.url)
        wait_for(lambda: number(cell(page, "queues", "jobs", 1)) == 100, 10, "100 ready")
        victim = pool.servers.processes[1]  # type: ignore[union-attr]
        os.kill(victim.pid, signal.SIGKILL)
        down = page.locator("#servers .server.down")
        wait_for(lambda: down.count() == 1, 10, "the killed server shown down")
        assert pool.queues.clients[1].address in str(down.text_content())
        wait_for(lambda: number(cell(page, "queues", "jobs", 1)) == 60, 10, "the other shard's 60 still shown")
        pool.queues.clients[0].put("jobs", [Message(payload=b"y")] * 7)
        wait_for(lambda: number(cell(page, "queues", "jobs", 1)) == 67, 10, "and still updated")
        t0 = updated(page)
        wait_for(lambda: updated(page) > t0, 5, "the page still refreshing")
        assert "1 of 2 servers down" in str(page.locator("#updated").text_content())
        page.click("#queues tbody tr[data-queue='jobs']")
        stale = page.locator("#shards tbody tr.down.stale")
        wait_for(lambda: stale.count() == 1, 10, "its shard shown down in the breakdown, with its last figures")
        assert number(str(stale.locator("td").nth(2).text_content())) == 40  # its ready, as it last answered
        assert "last known" in str(stale.locator("td").nth(1).text_content())
        wait_for(lambda: "(down)" in str(page.locator("#dead-status").text_content()), 10, "its dead letters said unread")
        assert pool.queues.clients[1].address in str(page.locator("#dead-status").text_content())
        shot(page, "dashboard-server-down")
    assert page.errors == []


def test_the_requeue_buttons_move_dead_letters_back_to_ready(page: Any) -> None:
    with QueuePool.local(n_servers=2) as pool, Dashboard(pool, port=0) as board:
        pool.queues.declare("bad", max_attempts=1)
        ids = pool.put("bad", [Message(payload=b"item %d" % i) for i in range(6)])
        for c in pool.queues.clients:
            got = c.get("bad", 10)
            c.nack("bad", [m.id for m in got], [f"Traceback (most recent call last):\nValueError: item {m.id}" for m in got])
        page.goto(board.url)
        wait_for(lambda: number(cell(page, "queues", "bad", 5)) == 6, 10, "6 dead letters on the page")
        page.click("#queues tbody tr[data-queue='bad']")
        wait_for(lambda: page.locator("#dead tbody tr").count() == 6, 10, "the dead letters listed")
        # each error shows the line that names it (after the bare traceback header), the whole on a click
        assert str(page.locator("#dead tbody tr summary").first.text_content()).startswith("ValueError: item")
        shot(page, "dashboard-dead-letters")
        first = format_id(ids[0])  # as the page shows ids
        page.check(f"#dead tbody tr[data-id='{first}'] input")
        page.click("#requeue-selected")
        wait_for(lambda: page.locator("#dead tbody tr").count() == 5, 10, "one requeued")
        assert "requeued 1" in str(page.locator("#dead-status").text_content())
        # ready again; "failed" counts the messages that ended so, the requeued one too (it came back as a new message)
        wait_for(lambda: number(cell(page, "queues", "bad", 1)) == 1, 10, "the queue's row shows it ready")
        assert number(cell(page, "queues", "bad", 5)) == 6
        assert pool.stats("bad")["bad"].ready == 1
        page.click("#requeue-all")
        wait_for(lambda: page.locator("#dead tbody tr").count() == 0, 10, "all requeued")
        wait_for(lambda: number(cell(page, "queues", "bad", 1)) == 6, 10, "all ready")
        assert pool.dead_letters("bad") == []
    assert page.errors == []


def test_an_error_text_holding_script_shows_as_text_and_never_runs(page: Any) -> None:
    evil = '<img src=x onerror="window.pwned=1"><script>window.pwned=2</script><b>bold</b>'
    with QueuePool.local(n_servers=1) as pool, Dashboard(pool, port=0) as board:
        pool.queues.declare("evil", max_attempts=1)
        pool.put("evil", [Message(payload=evil.encode())])
        got = pool.queues.clients[0].get("evil", 1)
        pool.queues.clients[0].nack("evil", [got[0].id], [evil])
        page.goto(board.url)
        page.click("#queues tbody tr[data-queue='evil']")
        wait_for(lambda: page.locator("#dead tbody tr").count() == 1, 10, "the dead letter listed")
        row = page.locator("#dead tbody tr").first
        assert evil in str(row.text_content())  # the markup shown as text, the payload too
        assert page.locator("#dead img, #dead script, #dead b").count() == 0
        assert page.evaluate("window.pwned === undefined")
    assert page.errors == []


def test_100000_dead_letters_are_paged_and_the_page_stays_fast(page: Any) -> None:
    with QueuePool.local(n_servers=2) as pool, Dashboard(pool, port=0) as board:
        pool.queues.declare("many", max_attempts=1)
        pool.put("many", [Message(payload=b"p")] * 100_000)
        for c in pool.queues.clients:
            while got := c.get("many", 5000):
                c.nack("many", [m.id for m in got], final=True)
        assert pool.stats("many")["many"].failed == 100_000
        page.goto(board.url)
        wait_for(lambda: number(cell(page, "queues", "many", 5)) == 100_000, 10, "100,000 dead on the page")
        t0 = time.monotonic()
        page.click("#queues tbody tr[data-queue='many']")
        wait_for(lambda: page.locator("#dead tbody tr").count() == 50, 10, "the first page")
        first_page_s = time.monotonic() - t0
        page.click("#dead-more")
        wait_for(lambda: page.locator("#dead tbody tr").count() == 100, 10, "the second page")
        assert first_page_s < 1.0, f"the first page of dead letters took {first_page_s:.2f} s"
        ids = [parse_id(str(r.get_attribute("data-id"))) for r in page.locator("#dead tbody tr").all()]
        assert len(set(ids)) == 100 and ids == sorted(ids)  # pages follow each other, nothing twice


def test_off_loopback_the_page_asks_for_the_token(page: Any, tmp_path: Path) -> None:
    with QueuePool.local(n_servers=1, token="s3cret") as pool:
        with pytest.raises(ConveyorError, match="without the pool's token"):
            Dashboard(pool, "0.0.0.0", 0)
        with pytest.raises(ConveyorError, match="without TLS"):
            Dashboard(pool, "0.0.0.0", 0, token="s3cret")
        pool.put("jobs", [Message(payload=b"x")] * 3)
        with Dashboard(pool, "0.0.0.0", 0, token="s3cret", insecure=True) as board:
            url = f"http://127.0.0.1:{board.port}/"
            with pytest.raises(urllib.error.HTTPError) as e:
                urllib.request.urlopen(url + "api/overview", timeout=10)
            e.value.close()
            assert e.value.code == 401
            page.goto(url)
            assert page.url.endswith("/login")
            page.fill("input[name=token]", "wrong")
            page.click("button[type=submit]")
            page.wait_for_url("**/login?failed=1")
            assert page.locator("#queues").count() == 0
            shot(page, "dashboard-login")
            page.fill("input[name=token]", "s3cret")
            page.click("button[type=submit]")
            wait_for(lambda: number(cell(page, "queues", "jobs", 1)) == 3, 10, "the page, once logged in")
            cookie = next(c for c in page.context.cookies() if c["name"] == "conveyor_dashboard")
            assert cookie["httpOnly"] and "s3cret" not in cookie["value"]
            headers = {"Authorization": "Bearer s3cret", "Content-Type": "application/json"}
            req = urllib.request.Request(url + "api/requeue", data=b'{"queue": "jobs", "ids": "all"}', headers=headers)
            with pytest.raises(urllib.error.HTTPError) as e:  # no X-Conveyor header: what another site's page would send
                urllib.request.urlopen(req, timeout=10)
            e.value.close()
            assert e.value.code == 403


def _kill_one_of_servers(page: Any, n: int) -> None:
    """Of `n` real servers with work on each, one SIGKILLed: every total is marked partial, naming it."""
    with QueuePool.local(n_servers=n) as pool, Dashboard(pool, port=0) as board:
        for c in pool.queues.clients:
            c.put("jobs", [Message(payload=b"x")] * 10)
        page.goto(board.url)
        wait_for(lambda: number(cell(page, "queues", "jobs", 1)) == 10 * n, 10, "every server's share shown")
        badge = page.locator("#partial")
        assert not badge.is_visible() and page.locator(".partial-mark:visible").count() == 0
        victim = pool.servers.processes[n - 1]  # type: ignore[union-attr]
        where = pool.queues.clients[n - 1].address.removeprefix("tcp://")
        os.kill(victim.pid, signal.SIGKILL)
        wait_for(badge.is_visible, 15, "the partial badge")
        assert badge.text_content() == f"partial: 1 of {n} servers unreachable ({where})"
        assert page.locator("#queues tbody tr.partial[data-queue='jobs'] .tag.partial").count() == 1
        # each aggregate shown marked: the two charts, the queues, the map jobs
        assert page.locator(".partial-mark:visible").count() == 4
        wait_for(lambda: number(cell(page, "queues", "jobs", 1)) == 10 * (n - 1), 10, "the survivors' share")
    assert page.errors == []


def test_one_of_two_servers_killed_marks_every_total_partial_naming_it(page: Any) -> None:
    _kill_one_of_servers(page, 2)


def test_one_of_three_servers_killed_marks_every_total_partial_naming_it(page: Any) -> None:
    _kill_one_of_servers(page, 3)


def test_internal_queues_are_hidden_until_the_toggle_shows_them_and_the_url_keeps_it(page: Any) -> None:
    with QueuePool.local(n_servers=1) as pool, Dashboard(pool, port=0) as board:
        records = rows_put_records("a1b2c3")  # the queue a Spark job's feeding tasks record on
        records.declare(pool.queues)
        records.record(pool.queues, 0, RowsPut(rows=5))
        pool.put("jobs", [Message(payload=b"x")] * 2)
        internal = f"#queues tbody tr[data-queue='{records.queue}']"
        page.goto(board.url)
        wait_for(lambda: number(cell(page, "queues", "jobs", 1)) == 2, 10, "the user's queue")
        assert page.locator(internal).count() == 0
        assert "1 internal hidden" in str(page.locator("#queue-count").text_content())
        toggle = page.get_by_label("show internal queues")
        assert toggle.is_visible() and not toggle.is_checked()
        toggle.check()
        wait_for(lambda: page.locator(internal).count() == 1, 5, "the internal queue shown")
        assert number(cell(page, "queues", records.queue, 1)) == 1
        assert page.locator(f"{internal} .tag").first.text_content() == "internal"
        assert page.url.endswith("?internal=1")
        page.reload()  # kept in the URL
        wait_for(lambda: page.locator(internal).count() == 1, 10, "still shown after a reload")
        assert page.get_by_label("show internal queues").is_checked()
        page.get_by_label("show internal queues").uncheck()
        wait_for(lambda: page.locator(internal).count() == 0, 5, "hidden again")
        assert "internal" not in page.url
    assert page.errors == []


def test_the_charts_have_labelled_axes_and_a_readout_under_the_pointer(page: Any) -> None:
    refused: list[str] = []  # what the page's CSP blocked, as Chromium says on the console: nothing
    page.on("console", lambda m: refused.append(m.text) if "Content Security Policy" in m.text else None)
    with QueuePool.local(n_servers=1) as pool, Dashboard(pool, port=0) as board:
        pool.put("jobs", [Message(payload=b"x")] * 25)
        page.goto(board.url)
        samples = page.locator("#chart-ready path.ready")
        wait_for(lambda: samples.count() == 1 and str(samples.get_attribute("d")).count("L") >= 3, 15, "a few seconds drawn")
        for chart, unit in (("chart-rates", "messages/s"), ("chart-ready", "messages")):
            assert page.locator(f"#{chart} .y-label").text_content() == unit
            assert page.locator(f"#{chart} .x-label").text_content() == "time"
            times = [str(t) for t in page.locator(f"#{chart} .x-tick text").all_text_contents()]
            assert len(times) >= 3 and all(re.fullmatch(r"\d\d:\d\d(:\d\d)?", t) for t in times), times
            values = page.locator(f"#{chart} .y-tick text").all_text_contents()
            assert len(values) >= 2 and values[0] == "0" and all(re.fullmatch(r"[\d.]+[kM]?", v) for v in values), values
        assert page.locator("#chart-ready .y-tick text").all_text_contents()[-1] in ("25", "30", "40", "50")
        # the pointer over the ready chart, near its right end: the readout gives the time and the value there
        box = page.locator("#chart-ready").bounding_box()
        page.mouse.move(box["x"] + box["width"] - 20, box["y"] + box["height"] / 2)
        readout = page.locator("#chart-ready-readout")
        wait_for(readout.is_visible, 5, "the readout")
        text = str(readout.text_content())
        assert re.search(r"\d\d:\d\d:\d\d", text) and "ready 25 messages" in text, text
        assert page.locator("#chart-ready .cursor line").count() == 1
        page.mouse.move(box["x"] + box["width"] - 20, box["y"] + box["height"] / 2 + 5)
        page.mouse.move(0, 0)  # off the chart: the readout goes
        wait_for(lambda: not readout.is_visible(), 5, "the readout hidden")
        box = page.locator("#chart-rates").bounding_box()
        page.mouse.move(box["x"] + box["width"] - 20, box["y"] + box["height"] / 2)
        wait_for(page.locator("#chart-rates-readout").is_visible, 5, "the rates' readout")
        assert re.search(
            r"put [\d.,]+ messages/s.*ack [\d.,]+ messages/s", str(page.locator("#chart-rates-readout").text_content())
        )
        shot(page, "dashboard-chart-readout")
    assert page.errors == [] and refused == []


def test_an_unreachable_server_is_shown_down_from_the_start(page: Any) -> None:
    with QueuePool.local(n_servers=1) as up:
        up.put("jobs", [Message(payload=b"x")] * 4)
        pool = QueuePool.connect([up.addresses[0], "tcp://127.0.0.1:1"], connect_timeout=2.0, timeout=2.0)
        try:
            with Dashboard(pool, port=0) as board:
                page.goto(board.url)
                wait_for(lambda: number(cell(page, "queues", "jobs", 1)) == 4, 10, "the answering server's queue")
                down = page.locator("#servers .server.down")
                wait_for(lambda: down.count() == 1, 10, "the other shown down")
                assert "tcp://127.0.0.1:1" in str(down.text_content())
                wait_for(lambda: "refused" in str(down.get_attribute("title")).lower(), 10, "its error shown")
        finally:
            pool.close()


def test_the_page_is_fast_with_2_servers_100_queues_and_50_consumers(page: Any) -> None:
    with QueuePool.local(n_servers=2) as pool, Dashboard(pool, port=0) as board:
        for q in range(100):
            pool.put(f"queue-{q:03d}", [Message(payload=b"x")] * 10)
        for w in range(50):  # 50 consumers' reports, through the real report operation
            pool.queues.report(
                f"host-{w % 5}:{1000 + w}:0",
                {"processed": w, "failed": 0, "running": 1, "pid": 1000 + w, "host": f"host-{w % 5}"},
            )
        wait_for(
            lambda: len(_overview(board.url)["queues"]) == 100 and len(_overview(board.url)["consumers"]) == 50,
            10,
            "the dashboard polled the servers since",
        )
        t0 = time.monotonic()
        page.goto(board.url)
        wait_for(
            lambda: (
                page.locator("#queues tbody tr").count() == 100
                and page.locator("#consumers tbody tr").count() == 50
                and updated(page) > 0
            ),  # the stamp comes after the charts' history: shown last
            10,
            "100 queues and 50 consumers, and when they were polled",
        )
        load_s = time.monotonic() - t0
        stamps = [updated(page)]
        deadline = time.monotonic() + 8
        while time.monotonic() < deadline:
            if (u := updated(page)) != stamps[-1]:
                stamps.append(u)
            time.sleep(0.05)
        gaps = [b - a for a, b in itertools.pairwise(stamps)]
        assert load_s < 1.0, f"the page took {load_s:.2f} s to show everything"
        assert len(gaps) >= 3 and max(gaps) <= 2.0, f"updates {gaps}"
        shot(page, "dashboard-many")


def test_conveyor_dashboard_serves_the_page_and_its_json(tmp_path: Path) -> None:
    with QueuePool.local(n_servers=1) as pool:
        pool.put("jobs", [Message(payload=b"x")] * 2)
        proc = subprocess.Popen(
            [sys.executable, "-m", "conveyor", "dashboard", "--connect", pool.addresses[0], "--port", "0"],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline().split()
            assert line[:2] == ["dashboard", "on"]
            url = line[2]
            got = wait_for(lambda: _overview(url) if _overview(url)["queues"] else None, 10, "the overview")
            assert got["queues"][0]["name"] == "jobs" and got["queues"][0]["ready"] == 2
            with urllib.request.urlopen(url, timeout=10) as r:
                assert b"Conveyor" in r.read() and "script-src 'self'" in r.headers["Content-Security-Policy"]
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(15)
            assert proc.stdout is not None
            proc.stdout.close()
        assert proc.returncode == 0


def _overview(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "api/overview", timeout=10) as r:
        return dict(json.loads(r.read()))


def test_the_json_endpoints_refuse_bad_input_and_a_queue_on_one_shard_pages() -> None:
    with QueuePool.local(n_servers=2) as pool, Dashboard(pool, port=0) as board:
        api = board.url + "api/"
        pool.queues.clients[0].declare("one", max_attempts=1)  # on shard 0 only: shard 1 has no such queue
        pool.queues.clients[0].put("one", [Message(payload=b"x")] * 3)
        got = pool.queues.clients[0].get("one", 3)
        pool.queues.clients[0].nack("one", [m.id for m in got], ["no"] * 3)
        wait_for(lambda: _overview(board.url)["queues"], 10, "the dashboard's first poll")
        status, page = call_json(api + "dead-letters?queue=one&limit=2")
        assert status == 200 and len(page["items"]) == 2 and page["next"] and page["skipped"] == []
        status, rest = call_json(api + f"dead-letters?queue=one&limit=2&cursor={page['next']}")
        assert status == 200 and len(rest["items"]) == 1 and rest["next"] == ""
        assert {d["id"] for d in page["items"] + rest["items"]} == {"0:1", "0:2", "0:3"}  # as every command shows ids
        for query in ("", "queue=one&limit=0", "queue=one&limit=x", "queue=one&cursor=x", "queue=one&cursor=%C2%B2:1"):
            assert call_json(api + "dead-letters?" + query)[0] == 400, query
        for ids in (["-1"], ["abc"], [True], [1.5], [str(2 << 48)], [], "some"):
            status, reply = call_json(api + "requeue", {"queue": "one", "ids": ids})
            assert status == 400 and "error" in reply, ids
        assert call_json(api + "requeue", {"queue": "one"})[0] == 400
        status, reply = call_json(api + "requeue", {"queue": "one", "ids": [page["items"][0]["id"]]})
        assert status == 200 and reply == {"requeued": 1, "skipped": []}
        assert call_json(api + "requeue", {"queue": "one", "ids": "all"})[1] == {"requeued": 2, "skipped": []}
        assert pool.stats("one")["one"].ready == 3
        # a page of another site, its name rebound to this address: not answered
        status, reply = call_json(api + "overview", headers={"Host": f"evil.example:{board.port}"})
        assert status == 421 and "answers only to loopback names" in reply["error"]
        assert call_json(api + "overview", headers={"Host": f"localhost:{board.port}"})[0] == 200


def test_a_busy_consumer_far_behind_its_peers_is_marked_slow() -> None:
    """Of three consumers reporting, the one doing 1 task a report to its peers' 20 is marked slow.

    Three consumers report (the real report operation, every 0.5 s): two do 20 tasks a report, one
    does 1 with tasks running; that one is slow, the others ok.
    """
    with QueuePool.local(n_servers=1) as pool, Dashboard(pool, port=0) as board:
        done = {"fast-1": 0, "fast-2": 0, "laggard": 0}

        def consumers() -> dict[str, dict[str, Any]]:
            return {c["name"]: c for c in _overview(board.url)["consumers"]}

        def report() -> dict[str, dict[str, Any]] | None:
            for name in done:
                done[name] += 1 if name == "laggard" else 20
                pool.queues.report(name, {"processed": done[name], "failed": 0, "running": 2, "pid": 1, "host": "h"})
            got = consumers()
            time.sleep(0.5)  # the pace of the reports, not a wait for anything
            return got if got.get("laggard", {}).get("status") == "slow" else None

        got = wait_for(report, 40, "the laggard marked slow")  # a rate needs 15 s of reports
        assert got["fast-1"]["status"] == got["fast-2"]["status"] == "ok"
        assert got["laggard"]["rate"] < 0.3 * got["fast-1"]["rate"]


def test_a_map_jobs_rows_are_counted_by_its_consumers_reports() -> None:
    """A map job's rows done and total are those of its messages settled, exact at the end.

    Messages saying how many rows they carry (as map's do): the job's rows done and total are the
    rows of the messages settled, a message failed for good included, and exact at the end.
    """
    with QueuePool.local(n_servers=2) as pool, Dashboard(pool, port=0) as board:
        opts = TaskOptions(queue="map-t", max_retries=0)
        sizes = [3, 5, 1, 4] * 10
        messages = [
            dataclasses.replace(m := build_message(wt.add.task_name, opts, (j, 1), {}), headers={**m.headers, H_ROWS: str(n)})
            for j, n in enumerate(sizes)
        ]
        failing = build_message(wt.fails_for_good.task_name, opts, (), {})
        pool.put("map-t", [*messages, dataclasses.replace(failing, headers={**failing.headers, H_ROWS: "7"})])
        Consumer(pool.queues, ["map-t"], concurrency=2, until_empty=True, task_modules=MODULES).run()

        def job() -> dict[str, Any] | None:
            jobs = _overview(board.url)["jobs"]
            return jobs[0] if jobs and jobs[0]["done"] == 41 and jobs[0]["rows_total"] == sum(sizes) + 7 else None

        got = wait_for(job, 10, "the job's rows, as the consumer's last report says")
        assert got["rows_done"] == got["rows_total"] == 137 and got["failed"] == 1 and got["total"] == 41


def _slow_row(row: dict[str, Any]) -> dict[str, Any]:
    time.sleep(0.05)
    return {"i": row["id"]}


def test_a_running_map_job_shows_its_progress_then_done(page: Any, spark: Any) -> None:
    with QueuePool.local(n_servers=2) as pool, Dashboard(pool, port=0) as board:
        done: dict[str, int] = {}
        df = spark.range(600, numPartitions=4)

        failed: list[BaseException] = []

        def run() -> None:
            try:
                out = cs.map(
                    df,
                    _slow_row,
                    schema="i long",
                    queue_pool=pool,
                    n_consumers=2,
                    concurrency=2,
                    rows_per_message=2,
                    progress=False,
                )
                done["rows"] = out.count()
            except BaseException as e:  # told by the test, not lost with the thread
                failed.append(e)

        job = threading.Thread(target=run, daemon=True)
        job.start()
        page.goto(board.url)

        def midway() -> bool:
            row = page.locator("#jobs tbody tr")
            if row.count() != 1:
                return False
            cells = [str(c.text_content()) for c in row.locator("td").all()]
            rows, messages = (number(cells[2]), number(cells[3])), (number(cells[4]), number(cells[5]))
            return cells[0].startswith("map-") and 0 < rows[0] < rows[1] and 0 < messages[0] < messages[1]

        wait_for(midway, 60, "the map job shown midway")
        shot(page, "dashboard-map")
        job.join(120)
        assert not failed and done.get("rows") == 600, failed

        def finished() -> bool:
            cells = [str(c.text_content()) for c in page.locator("#jobs tbody tr td").all()]
            # rows (2 to a message) and messages, each all done
            rows, messages = (number(cells[2]), number(cells[3])), (number(cells[4]), number(cells[5]))
            return len(cells) == 9 and rows == (600, 600) and messages == (300, 300) and cells[8] == "0 s"

        wait_for(finished, 15, "the finished job shown done, until its results' queue is dropped")
        # its consumers, Spark tasks that ended with the job, said so: finished, none taken for lost
        statuses = page.locator("#consumers tbody tr td:nth-child(10)")
        wait_for(lambda: set(statuses.all_text_contents()) == {"finished"}, 15, "the job's consumers finished")
    assert page.errors == []
