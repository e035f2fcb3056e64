"""Queue classes and queue information of the project's own, as ndkale 2.2.4 lets a project write them."""

from conveyor.compat.kale import queue_info, queue_selector

RELEASE = "r7"


class ReleaseQueue(queue_info.TaskQueue):
    """QUEUE_CLASS: each queue's name carries the release, so that releases do not share queues."""

    def _decorate_name(self, name):
        return f"{RELEASE}-{name}", f"{RELEASE}-dlq-{name}"


class ListedQueues(queue_info.QueueInfoBase):
    """Queue information of the project's own (ndkale's QueueInfoBase): only the listed queues.

    Whether one has work is asked of the queue information the worker gave (which asks the servers).
    """

    def __init__(self, configured, names):
        self.configured = configured
        self.names = names

    def get_queues(self):
        return [q for q in self.configured.get_queues() if q.simple_name in self.names]

    def is_queue_empty(self, queue):
        return self.configured.is_queue_empty(queue)

    def does_queue_need_work(self, queue):
        return not self.is_queue_empty(queue)

    def get_highest_priority_queue_that_needs_work(self):
        return next((q for q in self.get_queues() if self.does_queue_need_work(q)), None)


class SlaOnlySelector(queue_selector.HighestPriorityFirst):
    """ndkale's HighestPriorityFirst over ListedQueues: the worker serves the "sla" queue only."""

    def __init__(self, queue_info):
        super().__init__(ListedQueues(queue_info, ["sla"]))
