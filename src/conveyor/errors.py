"""The exception hierarchy: every error Conveyor raises on purpose is a ConveyorError."""

from __future__ import annotations


class ConveyorError(Exception):
    """Base class of every error Conveyor raises on purpose."""


class StoreError(ConveyorError):
    """A queue store cannot do what was asked."""


class StoreClosedError(StoreError):
    """The store was closed."""


class CorruptStoreError(StoreError):
    """A store file holds damaged bytes outside a torn tail.

    `path` and `offset` locate the damage; open with `repair=True` to move the damaged
    file aside and keep what is intact.
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(
            f"{path}: corrupt at offset {offset}: {reason} "
            "(open with repair=True to move the damaged file aside and keep what is intact)"
        )
