"""Task envelopes, results, error text and ad-hoc callables: the bytes a task message carries.

Trust model: queue servers never decode these bytes. Plain data goes as msgpack, which any
process may read safely; anything else goes as (cloud)pickle, which runs code when loaded, so it
must only travel between a client and the workers its user runs (see docs/tasks.md).

Plain data, encoded as msgpack and decoded to equal values of the same types: None, bool, int
in [-2**63, 2**64), float, str, bytes, and lists, tuples and dicts of plain data (dict keys may be
any hashable plain value). Types are checked exactly, so subclasses (IntEnum, a str subclass,
namedtuples), bytearray, sets and the rest go as pickle and keep their types too.
"""

from __future__ import annotations

import hashlib
import pickle
import threading
import traceback
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import cloudpickle
import msgpack

from conveyor.constants import (
    ADHOC_TASK_PREFIX,
    CT_MSGPACK,
    CT_PICKLE,
    ENVELOPE_VERSION,
    FUNCTION_CHUNK_BYTES,
    FUNCTION_MANIFEST_MAGIC,
    FUNCTION_MAX_BYTES,
    H_CONTENT_TYPE,
    INT64_MIN,
    MAX_ERROR_CHARS,
    MSGPACK_EXT_TUPLE,
    MSGPACK_MAX_DEPTH,
    PICKLE_PROTOCOL,
    RESULT_TAG_MSGPACK,
    RESULT_TAG_PICKLE,
    UINT64_MAX,
)
from conveyor.errors import SerializationError
from conveyor.message import slot_setters

_SCALARS = frozenset({type(None), bool, float, str, bytes})


def is_plain(obj: object, depth: int = 0) -> bool:
    """True if `obj` round-trips exactly through msgpack (see the module docstring)."""
    t = type(obj)
    if t in _SCALARS:
        return True
    if t is int:
        return INT64_MIN <= cast(int, obj) <= UINT64_MAX
    if depth >= MSGPACK_MAX_DEPTH:  # also stops self-referencing containers; pickle copes with those
        return False
    # loops rather than all(generator): this runs for every published message
    if t is list or t is tuple:
        for x in cast("list[object] | tuple[object, ...]", obj):
            if type(x) not in _SCALARS and not is_plain(x, depth + 1):
                return False
        return True
    if t is dict:
        for k, v in cast("dict[object, object]", obj).items():
            if type(k) not in _SCALARS and not is_plain(k, depth + 1):
                return False
            if type(v) not in _SCALARS and not is_plain(v, depth + 1):
                return False
        return True
    return False


def _default(obj: object) -> msgpack.ExtType:
    # strict_types sends tuples here instead of packing them as arrays: tag them so they come back as tuples
    if type(obj) is tuple:  # a Packer of its own: this runs inside the calling thread's Packer
        return msgpack.ExtType(MSGPACK_EXT_TUPLE, msgpack.packb(list(obj), **_PACK_OPTIONS))
    raise TypeError(f"not plain data: {type(obj).__name__}")


_PACK_OPTIONS: dict[str, Any] = {"use_bin_type": True, "strict_types": True, "default": _default}


def _ext_hook(code: int, data: bytes) -> object:
    if code == MSGPACK_EXT_TUPLE:
        return tuple(_unpack(data))
    raise ValueError(f"unknown msgpack extension type {code}")


_packers = threading.local()  # a Packer is not thread-safe: one per thread, reused (building one costs ~1 us)


def _pack(obj: object) -> bytes:
    try:
        packer = _packers.p
    except AttributeError:
        packer = _packers.p = msgpack.Packer(**_PACK_OPTIONS)
    return cast(bytes, packer.pack(obj))


def _unpack(data: bytes) -> Any:
    # strict_map_key=False: dicts with int (or tuple, ...) keys round-trip; the bytes come from our own clients
    return msgpack.unpackb(data, raw=False, strict_map_key=False, ext_hook=_ext_hook)


def _pickle(obj: object) -> bytes:
    return cast(bytes, cloudpickle.dumps(obj, protocol=PICKLE_PROTOCOL))


# --- task envelopes -----------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class Call:
    """A decoded task envelope: which task to run, with what."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    app_data: dict[str, Any] | None = None


_CALL_SETTERS = slot_setters(Call)  # a decoded call is built without `__init__` (see there)


def encode_call(
    name: str, args: tuple[Any, ...], kwargs: dict[str, Any], app_data: dict[str, Any] | None = None
) -> tuple[bytes, dict[str, str]]:
    """Encode a call as (payload, headers): msgpack when everything is plain data, else cloudpickle.

    Raises SerializationError naming the task and the first argument that cannot be pickled.
    """
    if is_plain(args) and (not kwargs or is_plain(kwargs)) and (app_data is None or is_plain(app_data)):
        try:
            return _pack([ENVELOPE_VERSION, name, list(args), kwargs, app_data]), {H_CONTENT_TYPE: CT_MSGPACK}
        except (TypeError, ValueError, OverflowError):  # e.g. a str with lone surrogates: pickle keeps it
            pass
    try:
        return _pickle((ENVELOPE_VERSION, name, tuple(args), kwargs, app_data)), {H_CONTENT_TYPE: CT_PICKLE}
    except Exception as e:  # pickling raises many unrelated types
        arg, why = _culprit(args, kwargs, app_data, e)
        raise SerializationError(f"task {name!r}: {arg} cannot be serialized: {why}", task=name, argument=arg) from e


def _culprit(args: tuple[Any, ...], kwargs: dict[str, Any], app_data: object, error: Exception) -> tuple[str, str]:
    """Which argument failed to pickle, and why (pickled one by one to find it)."""
    parts = [(f"args[{i}]", a) for i, a in enumerate(args)] + [(f"kwargs[{k!r}]", v) for k, v in kwargs.items()]
    parts.append(("app_data", app_data))
    for label, value in parts:
        try:
            _pickle(value)
        except Exception as e:
            return f"{label} ({type(value).__name__})", f"{type(e).__name__}: {e}"
    return "the arguments", f"{type(error).__name__}: {error}"


def decode_call(payload: bytes, headers: dict[str, str]) -> Call:
    """Decode `encode_call`'s payload; SerializationError if it is damaged or of an unknown kind."""
    ct = headers.get(H_CONTENT_TYPE)
    try:
        if ct == CT_MSGPACK:
            f = _unpack(payload)
        elif ct == CT_PICKLE:
            f = pickle.loads(payload)
        else:
            raise SerializationError(f"unknown task payload content type {ct!r} (header {H_CONTENT_TYPE!r})")
    except SerializationError:
        raise
    except Exception as e:
        raise SerializationError(f"undecodable {ct} task payload: {type(e).__name__}: {e}") from e
    if not (isinstance(f, (list, tuple)) and len(f) == 5 and f[0] == ENVELOPE_VERSION and type(f[1]) is str):
        version = f[0] if isinstance(f, (list, tuple)) and f else None
        raise SerializationError(f"not a version {ENVELOPE_VERSION} task envelope (version {version!r})")
    _, name, args, kwargs, app_data = f
    if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict):
        raise SerializationError(f"task {name!r}: malformed envelope (args or kwargs)", task=name)
    call = object.__new__(Call)
    set_name, set_args, set_kwargs, set_app_data = _CALL_SETTERS
    set_name(call, name)
    set_args(call, tuple(args))
    set_kwargs(call, kwargs)
    set_app_data(call, app_data)
    return call


# --- results and errors -------------------------------------------------------------------------
@dataclass(frozen=True, slots=True)
class PackedResult:
    """A task's result that the task encoded itself (`pack_plain`): `encode_result` passes its bytes on.

    For a task whose results are plain data by construction and many values large (map's rows),
    where checking every value first (`is_plain`) costs several times the packing.
    """

    data: bytes


def pack_plain(value: object) -> bytes:
    """`value` as a msgpack result body; TypeError, ValueError or OverflowError if it is not plain data.

    Types are checked as the packer walks them, once: exactly, except that a bytearray or a
    memoryview inside comes back as bytes (`is_plain` refuses those; use this where that is fine).
    """
    return _pack(value)


def encode_result(value: object) -> bytes:
    """A task's return value as bytes; the first byte says msgpack or pickle."""
    if type(value) is PackedResult:
        return bytes((RESULT_TAG_MSGPACK,)) + value.data
    if is_plain(value):
        try:
            return bytes((RESULT_TAG_MSGPACK,)) + _pack(value)
        except (TypeError, ValueError, OverflowError):
            pass
    try:
        return bytes((RESULT_TAG_PICKLE,)) + _pickle(value)
    except Exception as e:
        raise SerializationError(f"a {type(value).__name__} result cannot be serialized: {type(e).__name__}: {e}") from e


def decode_result(data: bytes) -> object:
    """The value `encode_result` encoded."""
    if not data:
        raise SerializationError("empty result bytes")
    tag, body = data[0], data[1:]
    try:
        if tag == RESULT_TAG_MSGPACK:
            return _unpack(body)
        if tag == RESULT_TAG_PICKLE:
            return pickle.loads(body)
    except Exception as e:
        raise SerializationError(f"undecodable result: {type(e).__name__}: {e}") from e
    raise SerializationError(f"unknown result tag 0x{tag:02x}")


_TRACEBACK_START = "\nTraceback (most recent call last):"


def encode_error(exc: BaseException) -> str:
    """Readable error text: "module.Type: message", then the traceback (if the exception has one).

    This is the text a nack and a dead letter keep; `decode_error` splits it again.
    Never raises, whatever the exception object does (a `__str__` that raises, say): what cannot be
    said is replaced by a note saying so, so the task is still settled with what can be said.
    """
    t = type(exc)
    name = _safe(
        lambda: t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}",
        "an exception whose type has no name",
    )
    head = f"{name}: {_safe(lambda: str(exc), f'<the message of this {name} could not be read: str() raised>')}"
    if exc.__traceback__ is not None:
        head += "\n" + _safe(
            lambda: "".join(traceback.format_exception(t, exc, exc.__traceback__)).rstrip("\n"),
            "(the traceback could not be formatted)",
        )
    if len(head) <= MAX_ERROR_CHARS:
        return head
    half = MAX_ERROR_CHARS // 2  # the start says what, the end where: keep both
    return f"{head[:half]}\n... ({len(head) - 2 * half:,} characters cut) ...\n{head[-half:]}"


def _safe(text: Callable[[], str], instead: str) -> str:
    try:
        out = text()
        return out if type(out) is str else instead
    except Exception:
        return instead


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """`encode_error`'s text split up: type name, message and traceback ("" when none)."""

    type: str
    message: str
    traceback: str


def decode_error(text: str) -> ErrorInfo:
    """Split `encode_error` text (or any error text) into type, message and traceback."""
    head, sep, tb = text.partition(_TRACEBACK_START)
    typ, colon, message = head.partition(": ")
    if not colon or " " in typ or "\n" in typ:  # not ours: keep it whole as the message
        return ErrorInfo("", head, (sep + tb).lstrip("\n"))
    return ErrorInfo(typ, message, (sep + tb).lstrip("\n"))


# --- ad-hoc callables ---------------------------------------------------------------------------
def adhoc_task_name(digest: str) -> str:
    """The task name an ad-hoc call carries: the function's content digest, not its bytes."""
    return ADHOC_TASK_PREFIX + digest


def adhoc_digest(name: str) -> str | None:
    """The function digest of an ad-hoc task name, or None for a registered task's name."""
    return name[len(ADHOC_TASK_PREFIX) :] if name.startswith(ADHOC_TASK_PREFIX) else None


@dataclass(frozen=True, slots=True)
class FunctionRef:
    """A cloudpickled callable as the servers store it; `digest` names it on the wire.

    A pickle of up to FUNCTION_CHUNK_BYTES is one blob, itself (`digest` its sha256). A larger one
    is stored as chunks and a manifest that names them in order (`digest` the manifest's sha256), so
    that no request comes near the frame limit and every blob is still checked by its hash where
    it is read (`FunctionCache`).
    """

    digest: str
    blobs: dict[str, bytes] = field(repr=False)  # by sha256 hex, to store in this order: the one `digest` names last
    size: int  # bytes of the pickle

    @property
    def data(self) -> bytes:
        """The pickle itself (a big one's chunks joined, in the manifest's order)."""
        named = self.blobs[self.digest]
        keys = manifest_keys(named)
        return named if keys is None else b"".join(self.blobs[k] for k in keys)


def stored_form(data: bytes, what: str) -> FunctionRef:
    """The blobs that store the pickle `data` of the function `what` (see `FunctionRef`)."""
    if len(data) > FUNCTION_MAX_BYTES:
        raise SerializationError(
            f"function {what!r} pickles to {len(data) / 2**20:,.0f} MiB, over the {FUNCTION_MAX_BYTES // 2**20:,} MiB a "
            "function may take: it holds big state in its closure or globals; load it where the function runs "
            "instead (e.g. a class whose __init__ loads the model from a path given in fn_args)",
            task=what,
        )
    if len(data) <= FUNCTION_CHUNK_BYTES:
        key = _sha256(data)
        return FunctionRef(key, {key: data}, len(data))
    chunks = [data[i : i + FUNCTION_CHUNK_BYTES] for i in range(0, len(data), FUNCTION_CHUNK_BYTES)]
    keys = [_sha256(c) for c in chunks]
    manifest = FUNCTION_MANIFEST_MAGIC + "\n".join(keys).encode()
    blobs = dict(zip(keys, chunks, strict=True))
    digest = _sha256(manifest)
    blobs[digest] = manifest
    return FunctionRef(digest, blobs, len(data))


def manifest_keys(blob: bytes) -> list[str] | None:
    """The chunk keys a big function's manifest names, in order; None for a blob that is a pickle itself."""
    if not blob.startswith(FUNCTION_MANIFEST_MAGIC):
        return None
    return blob[len(FUNCTION_MANIFEST_MAGIC) :].decode("ascii", "replace").split("\n")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class FunctionPickler:
    """Publisher side: cloudpickles each function object once and remembers its (digest, bytes).

    Entries are keyed by the object's identity and dropped when it is garbage collected; objects
    that cannot be weakly referenced (builtins) are kept in a bounded LRU instead. The bytes are
    taken the first time a function is seen: later changes to its globals or closure are not sent.
    """

    def __init__(self, max_strong: int = 1024) -> None:
        self._weak: dict[int, tuple[weakref.ref[Any], FunctionRef]] = {}
        self._strong: OrderedDict[int, tuple[object, FunctionRef]] = OrderedDict()
        self._max_strong = max_strong
        self._lock = threading.Lock()

    def ref(self, func: Callable[..., Any]) -> FunctionRef:
        """`func` cloudpickled, with the digest naming it: pickled once per function object."""
        if not callable(func):
            raise SerializationError(f"not callable: {type(func).__name__}")
        key = id(func)
        with self._lock:
            w = self._weak.get(key)
            if w is not None and w[0]() is func:
                return w[1]
            s = self._strong.get(key)
            if s is not None and s[0] is func:
                self._strong.move_to_end(key)
                return s[1]
        try:
            data = _pickle(func)
        except Exception as e:
            name = getattr(func, "__qualname__", type(func).__name__)
            raise SerializationError(f"function {name!r} cannot be pickled: {type(e).__name__}: {e}", task=name) from e
        ref = stored_form(data, getattr(func, "__qualname__", type(func).__name__))
        with self._lock:
            try:
                self._weak[key] = (weakref.ref(func, lambda _: self._weak.pop(key, None)), ref)
            except TypeError:  # not weakly referenceable: keep it alive in the LRU (ids stay unique)
                self._strong[key] = (func, ref)
                if len(self._strong) > self._max_strong:
                    self._strong.popitem(last=False)
        return ref

    def __len__(self) -> int:
        return len(self._weak) + len(self._strong)


_pickler = FunctionPickler()


def function_ref(func: Callable[..., Any]) -> FunctionRef:
    """The process-wide pickler's `FunctionRef` of `func`."""
    return _pickler.ref(func)


class FunctionCache:
    """Worker side: ad-hoc callables by digest, unpickled once each (LRU of `max_entries`).

    `get` fetches the bytes of a digest not seen yet through `fetch` (the lead's blob store) and
    checks that they hash to the digest before unpickling them. Threads asking for the same new
    digest at once wait for one load and share its callable, so that state a callable builds
    where it runs (a model) is built once per process.
    """

    def __init__(self, max_entries: int = 256) -> None:
        self._funcs: OrderedDict[str, Callable[..., Any]] = OrderedDict()
        self._max = max_entries
        self._lock = threading.Lock()
        self._loading: dict[str, threading.Lock] = {}  # digest -> held by the thread loading it

    def get(self, digest: str, fetch: Callable[[str], bytes]) -> Callable[..., Any]:
        with self._lock:
            f = self._funcs.get(digest)
            if f is not None:
                self._funcs.move_to_end(digest)
                return f
            loading = self._loading.setdefault(digest, threading.Lock())
        with loading:  # outside the cache's lock: a fetch may be a network round trip
            with self._lock:
                f = self._funcs.get(digest)
            if f is not None:  # loaded while this thread waited
                return f
            try:
                loaded = self._load(digest, fetch)
            except BaseException:
                with self._lock:
                    self._loading.pop(digest, None)
                raise
            with self._lock:  # in one hold: a thread arriving now finds the function, never neither entry
                self._funcs[digest] = loaded
                self._loading.pop(digest, None)
                if len(self._funcs) > self._max:
                    self._funcs.popitem(last=False)
            return loaded

    def forget(self, digest: str) -> None:
        """Drop `digest`'s callable (a job's task, once its consumer ends), and with it what it built where it ran."""
        with self._lock:
            self._funcs.pop(digest, None)

    @staticmethod
    def _load(digest: str, fetch: Callable[[str], bytes]) -> Callable[..., Any]:
        data = _fetch_checked(digest, digest, fetch)
        keys = manifest_keys(data)
        if keys is not None:  # a big function: its chunks, each checked by its hash
            data = b"".join(_fetch_checked(digest, key, fetch) for key in keys)
        try:
            loaded: object = pickle.loads(data)
        except Exception as e:
            raise SerializationError(
                f"function {digest} cannot be unpickled: {type(e).__name__}: {e}", task=adhoc_task_name(digest)
            ) from e
        if not callable(loaded):
            raise SerializationError(f"function {digest} unpickled to a {type(loaded).__name__}", task=adhoc_task_name(digest))
        return loaded

    def __contains__(self, digest: object) -> bool:
        return digest in self._funcs

    def __len__(self) -> int:
        return len(self._funcs)


def _fetch_checked(digest: str, key: str, fetch: Callable[[str], bytes]) -> bytes:
    """The blob `key` of the function `digest`, fetched and checked against its hash."""
    if len(key) != 64 or not all(c in "0123456789abcdef" for c in key):
        raise SerializationError(
            f"function {digest}: its manifest names {key[:80]!r}, not a sha256", task=adhoc_task_name(digest)
        )
    data = fetch(key)
    got = _sha256(data)
    if got != key:
        raise SerializationError(f"function bytes fetched for {key} hash to {got}", task=adhoc_task_name(digest))
    return data
