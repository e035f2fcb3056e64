"""ndkale 2.2.4 on Conveyor: its modules, imported from `conveyor.compat.kale` instead of `kale`.

`from conveyor.compat.kale import task, worker, settings` (and `publisher`, `exceptions`,
`queue_info`, `queue_selector`, `message`, `test_utils`, `utils`, `timeout`) in place of
`from kale import ...`.

A thin layer over Conveyor's own tasks, queue YAML, selectors and consumer; what differs from
ndkale, and why, is in docs/migrating-from-ndkale.md.
"""

from __future__ import annotations
