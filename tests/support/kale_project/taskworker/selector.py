"""A queue selector written for ndkale (kale.queue_selector's documented way), import line changed."""

import random

from conveyor.compat.kale import queue_selector


class BusiestFirst(queue_selector.SelectQueueBase):
    """The highest-priority queue with work, else any queue (to long-poll)."""

    def get_queue(self):
        queue = self.queue_info.get_highest_priority_queue_that_needs_work()
        return queue if queue is not None else random.choice(self.queue_info.get_queues())
