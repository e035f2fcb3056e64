"""Per-process state that ON_WORKER_STARTUP sets up (as django.setup() or a database pool would)."""

READY = False
