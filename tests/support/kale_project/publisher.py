"""Publishes the test project's tasks, as ndkale's example/publisher.py does."""

import sys

from taskworker import tasks

if __name__ == "__main__":
    what = sys.argv[1]
    if what == "fib":
        print(tasks.FibonacciTask.publish(tasks.Point(3, 4), 10))
        print(tasks.FibonacciTask.publish("a string", 7, delay_sec=2))
    elif what == "flaky":
        print(tasks.FlakyTask.publish(None, "f1"))
        print(tasks.BlacklistedTask.publish({"k": 1}))
    elif what == "hang":
        print(tasks.HangTask.publish(None))
        print(tasks.NoLimitHangTask.publish(None))
        print(tasks.AfterHangTask.publish(None))
    elif what == "cleanup":
        print(tasks.CleanupTask.publish(None, False))
        print(tasks.CleanupTask.publish(None, True))
    elif what == "putoff":
        print(tasks.PutOffTask.publish(None, "p1"))
    else:  # a task class by name, published without arguments
        print(getattr(tasks, what).publish(None))
