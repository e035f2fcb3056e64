"""Errors of the TaskGraph runtime, and how they cross from a Spark task back to the driver."""

from __future__ import annotations

from typing import NoReturn

from ..errors import ConveyorError

# Marks the message of a GraphError raised inside a Spark task, so that the driver can find it in
# the Java stack trace Spark wraps it in and raise it again as itself.
_MARK_OPEN = "[conveyor.graph] "
_MARK_CLOSE = " [/conveyor.graph]"


class GraphError(ConveyorError):
    """A TaskGraph is invalid (at `initialize()`) or failed while it ran; the message names the node."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""

    def marked(self) -> str:
        """The message, marked for `unwrap_task_error` on the driver."""
        return f"{_MARK_OPEN}{self}{_MARK_CLOSE}"


class NodeTaskError(RuntimeError):
    """Raised inside a Spark task: carries a marked GraphError message through Spark."""


def raise_in_task(message: str) -> NoReturn:
    """Raise from a Spark task an error the driver re-raises as a GraphError with `message`."""
    raise NodeTaskError(GraphError(message).marked())


def unwrap_task_error(exc: BaseException) -> GraphError | None:
    """The GraphError a failed Spark job carries, if a Conveyor task raised one."""
    text = str(exc)
    start = text.find(_MARK_OPEN)
    if start < 0:
        return None
    end = text.find(_MARK_CLOSE, start)
    return GraphError(text[start + len(_MARK_OPEN) : end if end > 0 else None])
