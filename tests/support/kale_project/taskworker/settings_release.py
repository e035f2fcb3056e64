"""Settings with a QUEUE_CLASS and a queue selector over queue information of the project's own."""

from taskworker.settings import *  # noqa: F403

QUEUE_CLASS = "taskworker.queues.ReleaseQueue"
QUEUE_SELECTOR = "taskworker.queues.SlaOnlySelector"
