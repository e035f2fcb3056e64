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


class ProtocolError(ConveyorError):
    """Malformed frames or a protocol limit exceeded; the connection is closed.

    `request_id` is the id of the offending request when its header could be read, else 0.
    """

    def __init__(self, message: str, request_id: int = 0) -> None:
        self.request_id = request_id
        super().__init__(message)


class AuthError(ConveyorError):
    """Authentication failed: a wrong or missing token, or a server that cannot prove it has one."""


class RequestError(ConveyorError):
    """The server refused one request (its `kind` says why); the connection stays usable."""

    def __init__(self, kind: str, message: str) -> None:
        self.kind = kind
        super().__init__(message)


class ConnectionLostError(ConveyorError, ConnectionError):
    """The connection to a server failed or closed before a reply came.

    The request may or may not have taken effect on the server.
    """
