"""daskqueue 0.2's API over Conveyor: daskqueue code runs with its import lines changed.

    from conveyor.compat.daskqueue import Client            # was: from distributed import Client
    from conveyor.compat.daskqueue import QueuePool, ConsumerPool, ConsumerBaseClass, ...
    from conveyor.compat.daskqueue.utils import logger      # was: from daskqueue.utils import logger

`Client()` starts local Conveyor queue servers (as dask's `Client()` started a local cluster);
`Client(address=...)` connects to running ones. A `QueuePool` is queues on those servers, a
`ConsumerPool` local consumer processes (`conveyor.ConsumerPool`) each holding one consumer object.
Fetching, leases, retries, dead letters and acks (early, daskqueue's default, or late) are
Conveyor's. Every difference that remains is in docs/migrating-from-daskqueue.md.
"""

from __future__ import annotations

from conveyor.compat.daskqueue.client import Client, LocalCluster
from conveyor.compat.daskqueue.consumers import ConsumerBaseClass, DummyConsumer, GeneralConsumer, Message, NotACall
from conveyor.compat.daskqueue.pools import Durability, PutTimeout, Queue, QueuePool
from conveyor.compat.daskqueue.workers import ConsumerPool, ConsumerRef

__all__ = [
    "Client",
    "ConsumerBaseClass",
    "ConsumerPool",
    "ConsumerRef",
    "DummyConsumer",
    "Durability",
    "GeneralConsumer",
    "LocalCluster",
    "Message",
    "NotACall",
    "PutTimeout",
    "Queue",
    "QueuePool",
]
