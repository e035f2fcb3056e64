"""Settings of the ndkale-style test project (KALE_SETTINGS_MODULE=taskworker.settings)."""

import json
import multiprocessing
import os

from taskworker import state

MESSAGE_QUEUE_ENDPOINT_URL = os.environ.get("KALE_TEST_ENDPOINT", "")
QUEUE_CONFIG = "taskworker/queue_config.yaml"
QUEUE_SELECTOR = "taskworker.selector.BusiestFirst"  # written as for ndkale (SelectQueueBase, get_queue(self))
RETRY_DELAY_MULTIPLE_SEC = 0.2  # ndkale's backoff, (1 << retry) * this, made quick for the tests
OUT = os.environ.get("KALE_TEST_OUT", "")


def _record(name, **fields):
    if OUT:
        with open(os.path.join(OUT, name), "a") as f:
            f.write(json.dumps(fields) + "\n")


def ON_WORKER_STARTUP():
    state.READY = True  # per-process setup, as django.setup() or a database pool
    _record("worker-started", pid=os.getpid(), worker=multiprocessing.parent_process() is None)


def ON_WORKER_SHUTDOWN():
    _record("worker-stopped", pid=os.getpid(), ready=state.READY)
