"""The exception hierarchy: every error Conveyor raises on purpose is a ConveyorError."""

from __future__ import annotations


class ConveyorError(Exception):
    """Base class of every error Conveyor raises on purpose."""


class StoreError(ConveyorError):
    """A queue store cannot do what was asked."""


class StoreClosedError(StoreError):
    """The store was closed."""


class DiskFullError(StoreError):
    """The disk (or quota) holding a store is full: the operation changed nothing; retry once space is freed."""


class CorruptStoreError(StoreError):
    """A store file holds damaged bytes outside a torn tail, or lacks records the index confirms.

    `path` and `offset` locate the damage; open with `repair=True` (a server: `--repair`) to keep
    what is intact (damaged bytes are kept aside) and report what is not.
    """

    def __init__(self, path: str, offset: int, reason: str) -> None:
        self.path = path
        self.offset = offset
        self.reason = reason
        super().__init__(
            f"{path}: corrupt at offset {offset}: {reason} "
            "(open with repair=True, or start the server with --repair, to keep what is intact and report what is not)"
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


class ServerBusyError(ConveyorError, ConnectionRefusedError):
    """The server takes no more connections now (its connection limit): a client tries again until its `connect_timeout`."""


class ConnectionLostError(ConveyorError, ConnectionError):
    """The connection to a server failed or closed before a reply came.

    The request may or may not have taken effect on the server.
    """


class NoSlotsError(ConveyorError):
    """A Spark job of Conveyor's got no task slot within its bound (`start_timeout_s`).

    The cluster has no executor with a free core for it.
    """


class JobInputChangedError(ConveyorError):
    """A resumable Spark job (`map(..., job=...)`) was run again over input other than its earlier runs'.

    Its queue holds results of rows the input no longer has (or has elsewhere): reusing them would
    give wrong output. The queue is kept; `restart=True` starts the job anew.
    """


class PreflightError(ConveyorError):
    """On a cluster, the executors cannot do the work.

    They lack conveyor or a task module, or a queue server is out of their reach: `problems` maps
    each host to what is wrong there.
    """

    def __init__(self, message: str, problems: dict[str, list[str]]) -> None:
        self.problems = problems
        super().__init__(message)


class ServerUnreachableError(ConnectionLostError):
    """A queue server has not answered for longer than the caller's bound (`unreachable_s`).

    Raised instead of retrying forever: the work it holds cannot finish without it. `address` is
    the server, `seconds` how long it has been out of reach, `held` the messages pending on it per
    queue when it was last heard from (empty when unknown).
    """

    def __init__(self, address: str, seconds: float, held: dict[str, int] | None = None, what: str = "") -> None:
        self.address, self.seconds, self.held = address, seconds, dict(held or {})
        holds = ", ".join(f"{n:,} message(s) pending in {q!r}" for q, n in self.held.items()) or "messages unknown"
        super().__init__(
            f"{what}queue server {address} unreachable for {seconds:.0f} s (when last heard from it held "
            f"{holds}); start it again on its data dir to go on, or drop the work"
        )


# --- Tasks: definitions, publishing, envelopes and runs -------------------------------------------
class ConfigError(ConveyorError, ValueError):
    """A settings module or a queue configuration file holds an invalid value.

    The message names the file (or module), the queue and the field.
    """


class TaskOptionError(ConveyorError, ValueError):
    """A task option or a publish option is invalid.

    Such as a bad priority, negative retries, a time limit at or above the queue's visibility
    timeout, ...
    """


class TaskArgumentError(ConveyorError, TypeError):
    """Published arguments do not fit the task's signature: caught at publish time, not at run time."""


class NoPublisherError(ConveyorError):
    """`publish` was called with no `_pool` and no default pool set."""


class DuplicateTaskError(ConveyorError):
    """Two different objects were registered under one task name."""


class SerializationError(ConveyorError):
    """Arguments, a result or a payload cannot be (de)serialized.

    `task` and `argument` name what failed when known (`argument` is e.g. "args[1]",
    "kwargs['x']" or "app_data"). Not retryable: the same bytes fail the same way every time.
    """

    retryable = False

    def __init__(self, message: str, *, task: str | None = None, argument: str | None = None) -> None:
        self.task = task
        self.argument = argument
        super().__init__(message)


class UnknownTaskError(ConveyorError, LookupError):
    """No task is registered under this name in the worker's registry.

    Not retryable (`retryable = False`): the consumer should fail the message at once, so it
    ends in the dead letters instead of being redelivered until its attempts run out.
    """

    retryable = False

    def __init__(self, name: str, registered: list[str], hint: str = "") -> None:
        self.name = name
        self.registered = registered
        shown = ", ".join(registered[:20]) + (f", ... ({len(registered) - 20} more)" if len(registered) > 20 else "")
        super().__init__(
            f"unknown task {name!r}{hint}; registered: {shown or '(none)'}. "
            "Import the module that defines it in the worker (`conveyor worker --tasks MODULE`, "
            "task_modules=[...], or settings TASK_MODULES)"
        )


class TaskError(ConveyorError):
    """A task run failed: the consumer nacks (or dead-letters) the message with `error`.

    task: the task name (or "?" when the envelope could not be read).
    error: `conveyor.tasks.envelope.encode_error` text of the cause (type, message, traceback).
    retryable: False when retrying cannot help (unknown task, undecodable payload, an exception
        type the task lists in `no_retry`, or one whose class sets `retryable = False`).
    cause: the original exception; None after crossing a process boundary, where only the
        text survives (the cause itself may not pickle).
    """

    def __init__(self, task: str, error: str, retryable: bool, cause: BaseException | None = None) -> None:
        self.task = task
        self.error = error
        self.retryable = retryable
        self.cause = cause
        first = error.split("\n", 1)[0]
        super().__init__(f"task {task!r} failed{'' if retryable else ' (not retryable)'}: {first}")

    def __reduce__(self) -> tuple[object, ...]:
        # drop the cause: it may hold unpicklable state; its text is in `error`
        return (TaskError, (self.task, self.error, self.retryable))


class TimeLimitExceededError(ConveyorError):
    """A call awaited under a time limit (an async row of `conveyor.spark.map`) ran over it and was cancelled."""


class TaskFailedError(ConveyorError):
    """A task ended in the dead letters. `error` is its last error: type, message and traceback."""

    def __init__(self, handle: object, error: str) -> None:
        self.handle = handle
        self.error = error
        last = error.strip().splitlines()[0] if error.strip() else "no error text"
        super().__init__(f"{handle} failed: {last}")
