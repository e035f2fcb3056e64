"""`KaleMessage`: what ndkale's `Task.handle_failure(message, exc)` is given, built from a Conveyor delivery.

Only the fields task code reads are kept; encoding is Conveyor's envelope (docs/tasks.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class KaleMessage:
    """One delivered kale task: its ids, name, arguments, app_data and retry number.

    id: the Conveyor message id (ndkale's SQS message id). task_id: the id the publisher gave it
    (`Task._get_task_id`). task_retry_num: 0 on the first delivery, as in ndkale.
    """

    id: int | None
    task_id: str | None
    task_name: str
    task_args: tuple[Any, ...] = ()
    task_kwargs: dict[str, Any] = field(default_factory=dict)
    task_app_data: Any = None
    task_retry_num: int = 0
    task_inst: Any = None
