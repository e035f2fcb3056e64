"""daskqueue's `daskqueue.utils.logger`: the logger its README and examples log with.

    from conveyor.compat.daskqueue.utils import logger      # was: from daskqueue.utils import logger

As daskqueue's: its level is the `LOGLEVEL` environment variable (default `INFO`), and it writes
to standard error as `time,ms LEVEL: message` through a handler of its own, made when this module
is first imported (in a consumer process too, where a consumer class logs with it). Each record
is written once, by that handler: it is not passed on to the root logger, which in a Conveyor
consumer process has Conveyor's own handler (daskqueue's logger did pass its records on, but on a
dask worker nothing above it wrote them). `logger.propagate = True` passes them on.
"""

from __future__ import annotations

import logging
import os

__all__ = ["logger"]


def _make_logger() -> logging.Logger:
    """The `conveyor.compat.daskqueue.utils` logger, with daskqueue's level and format."""
    made = logging.getLogger("conveyor.compat.daskqueue.utils")
    made.setLevel(os.environ.get("LOGLEVEL", "INFO").upper())
    if not made.handlers:  # a reload adds no second one
        handler = logging.StreamHandler()
        handler.setLevel(logging.DEBUG)
        handler.setFormatter(logging.Formatter("%(asctime)s,%(msecs)d %(levelname)s: %(message)s"))
        made.addHandler(handler)
    made.propagate = False
    return made


logger = _make_logger()
