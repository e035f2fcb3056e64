"""`KaleMessage` (`kale.message`): one kale task as `handle_failure`, `republish` and tests see it.

ndkale 2.2.4's fields and constructor: the task's id, name, arguments and app_data, and two
counters, `task_retry_num` (every re-publish, which sets the retry delay) and `task_failure_num`
(the failures that counted, on which retries are decided). The worker builds one for each delivery
from the Conveyor message; `id` is then the Conveyor message id and `sqs_queue_name` its queue.

Encoding is Conveyor's envelope (docs/tasks.md), not ndkale's SQS body, so there is no
`encode`/`decode_sqs`/`decode_str`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from conveyor.compat.kale import settings, utils


def _get_current_timestamp() -> float:
    """When a message is made (the TIMESTAMP_FUNC setting), for `_enqueued_time`.

    A module function, as in ndkale, so that tests can patch it; it reads the setting when called,
    never at import.
    """
    stamp: float = settings.current().TIMESTAMP_FUNC()
    return stamp


def _get_publisher_data() -> str:
    """Who makes a message (the PUBLISHER_STR_FUNC setting), for `_publisher_data`."""
    who: str = settings.current().PUBLISHER_STR_FUNC()
    return who


class KaleMessage:
    """One kale task: ids, name, arguments, app_data and its retry and failure counts.

    Built as in ndkale: from `task_class` (or `task_name`), `task_id` and `payload`
    (`{'args', 'kwargs'[, 'app_data']}`); `current_retry_num` and `current_failure_num` default to
    0. With `instantiate_task`, `task_inst` is the task made from the message body (the class found
    through TASK_MAPPER or its dotted name); the worker sets it to the running task.
    """

    def __init__(
        self,
        sqs_message_id: Any = None,
        sqs_receipt_handle: Any = None,
        sqs_queue_name: str | None = None,
        task_class: Any = None,
        task_name: str | None = None,
        task_id: Any = None,
        payload: Mapping[str, Any] | None = None,
        current_retry_num: int | None = None,
        current_failure_num: int | None = None,
        enqueued_time: float | None = None,
        publisher_data: str | None = None,
        instantiate_task: bool = False,
        delete_func: Callable[[], object] | None = None,
    ) -> None:
        payload = self._validate_task_payload(payload)
        self.id = sqs_message_id
        self.sqs_queue_name = sqs_queue_name
        self.sqs_receipt_handle = sqs_receipt_handle
        if task_class is not None:  # its registered name: module.Class, as ndkale builds it
            self.task_name: str | None = (
                getattr(task_class, "task_name", None) or f"{task_class.__module__}.{task_class.__name__}"
            )
        else:
            self.task_name = task_name
        self.task_id = task_id
        self.task_args: Any = payload.get("args")
        self.task_kwargs: Any = payload.get("kwargs")
        self.task_app_data: Any = payload.get("app_data")
        self.task_retry_num: int = current_retry_num or 0
        self.task_failure_num: int = current_failure_num or 0
        self._enqueued_time = enqueued_time or _get_current_timestamp()
        self._publisher_data = publisher_data or _get_publisher_data()
        self.task_inst: Any = None
        if instantiate_task and self.task_name is not None:
            self.task_inst = self._class_from_path(self.task_name)(self._get_message_body())
        self.delete_func = delete_func

    @staticmethod
    def _validate_task_payload(payload: Mapping[str, Any] | None) -> Mapping[str, Any]:
        """The payload, if it has `args` and `kwargs`; AssertionError (ndkale's) if not."""
        if payload is None or "args" not in payload or "kwargs" not in payload:
            raise AssertionError(f"a task payload needs 'args' and 'kwargs', got {payload!r}")
        return payload

    def _get_message_body(self) -> dict[str, Any]:
        """The message as ndkale's body dict: what a task is constructed from."""
        return {
            "id": self.task_id,
            "task": self.task_name,
            "payload": {"args": self.task_args, "kwargs": self.task_kwargs, "app_data": self.task_app_data},
            "_enqueued_time": self._enqueued_time,
            "_publisher": self._publisher_data,
            "retry_num": self.task_retry_num,
            "failure_num": self.task_failure_num,
        }

    @staticmethod
    def _class_from_path(task_path: str) -> Any:
        """The task class of a task name: through the TASK_MAPPER setting, else the name as a dotted path."""
        return utils.class_import_from_path(settings.current().TASK_MAPPER.get(task_path, task_path))

    def delete(self) -> None:
        """Call the `delete_func` given (ndkale's SQS delete); nothing without one.

        The worker settles Conveyor messages itself: a task need not delete its message.
        """
        if self.delete_func is not None:
            self.delete_func()

    def __repr__(self) -> str:
        return (
            f"<KaleMessage {self.task_name} task_id={self.task_id!r} retry={self.task_retry_num} "
            f"failure={self.task_failure_num} id={self.id!r}>"
        )
