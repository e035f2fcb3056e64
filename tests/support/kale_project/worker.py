"""Runs a worker, as ndkale's example/worker.py does."""

from conveyor.compat.kale import worker

if __name__ == "__main__":
    worker.Worker().run()
