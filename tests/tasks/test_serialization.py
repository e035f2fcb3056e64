"""Task envelopes, results, error text and ad-hoc callables (conveyor.tasks.envelope)."""

from __future__ import annotations

import collections
import decimal
import enum
import gc
import hashlib
import math
import os
import pickle
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from conveyor.constants import (
    CT_MSGPACK,
    CT_PICKLE,
    FUNCTION_CHUNK_BYTES,
    FUNCTION_MAX_BYTES,
    H_CONTENT_TYPE,
    RESULT_TAG_MSGPACK,
    RESULT_TAG_PICKLE,
)
from conveyor.errors import SerializationError
from conveyor.tasks.envelope import (
    Call,
    FunctionCache,
    FunctionPickler,
    PackedResult,
    adhoc_digest,
    adhoc_task_name,
    decode_call,
    decode_error,
    decode_result,
    encode_call,
    encode_error,
    encode_result,
    pack_plain,
    stored_form,
)


def same(a: object, b: object) -> bool:
    """Equal values of exactly the same types, all the way down (NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) == math.copysign(1, b))  # type: ignore[arg-type]
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))  # type: ignore[arg-type]
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())  # type: ignore[attr-defined,index]
    return a == b


scalars = (
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.floats() | st.text(max_size=20) | st.binary(max_size=20)
)
keys = st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(max_size=8) | st.binary(max_size=8)
plain = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.lists(inner, max_size=4).map(tuple)
        | st.dictionaries(keys | st.tuples(keys, keys), inner, max_size=4)
    ),
    max_leaves=20,
)
kwargs_st = st.dictionaries(st.text(min_size=1, max_size=8), plain, max_size=4)
app_data_st = st.none() | st.dictionaries(st.text(max_size=8), plain, max_size=4)


@given(st.lists(plain, max_size=5).map(tuple), kwargs_st, app_data_st)
def test_plain_data_goes_as_msgpack_and_round_trips_exactly(
    args: tuple[Any, ...], kwargs: dict[str, Any], app_data: dict[str, Any] | None
) -> None:
    payload, headers = encode_call("t.name", args, kwargs, app_data)
    assert headers == {H_CONTENT_TYPE: CT_MSGPACK}
    call = decode_call(payload, headers)
    assert call.name == "t.name"
    assert same(call.args, args) and same(call.kwargs, kwargs) and same(call.app_data, app_data)


@given(plain)
def test_results_round_trip_exactly(value: object) -> None:
    data = encode_result(value)
    assert data[0] == RESULT_TAG_MSGPACK
    assert same(decode_result(data), value)


class Color(enum.IntEnum):
    RED = 1


Point = collections.namedtuple("Point", "x y")


class Label(str):
    pass


@pytest.mark.parametrize(
    "value",
    [
        {1, 2},
        bytearray(b"ab"),
        Color.RED,
        Point(1, 2),
        Label("x"),
        2**64,
        -(2**63) - 1,
        decimal.Decimal("1.5"),
        "lone \ud800 surrogate",
        {"nested": (1, {2, 3})},
    ],
    ids=repr,
)
def test_other_values_go_as_pickle_and_keep_their_types(value: object) -> None:
    payload, headers = encode_call("t", (value,), {"k": value})
    assert headers[H_CONTENT_TYPE] == CT_PICKLE
    call = decode_call(payload, headers)
    assert type(call.args[0]) is type(value) and call.args[0] == value
    assert type(call.kwargs["k"]) is type(value) and call.kwargs["k"] == value
    result = decode_result(encode_result(value))
    assert type(result) is type(value) and result == value


def test_tuples_and_lists_stay_distinct() -> None:
    args = ([1, (2, [3])], (4,), {"t": (5, 6), (7, 8): [9]})
    call = decode_call(*encode_call("t", args, {}))
    assert call.args == args and same(call.args, args)


def test_deep_and_self_referencing_data_goes_as_pickle() -> None:
    deep: list[Any] = []
    cur = deep
    for _ in range(200):
        cur.append([])
        cur = cur[0]
    loop: list[Any] = [1]
    loop.append(loop)
    payload, headers = encode_call("t", (deep, loop), {})
    assert headers[H_CONTENT_TYPE] == CT_PICKLE
    call = decode_call(payload, headers)
    assert call.args[1][1] is call.args[1]


def test_callables_in_arguments_go_as_cloudpickle() -> None:
    offset = 10
    call = decode_call(*encode_call("t", (lambda x: x + offset,), {}))
    assert call.args[0](1) == 11


@pytest.mark.parametrize(
    ("args", "kwargs", "app_data", "culprit"),
    [
        ((1, threading.Lock()), {}, None, "args[1] (lock)"),
        ((), {"ok": 1, "bad": threading.Lock()}, None, "kwargs['bad'] (lock)"),
        ((), {}, {"x": threading.Lock()}, "app_data (dict)"),
    ],
)
def test_unserializable_arguments_name_the_task_and_the_argument(
    args: tuple[Any, ...], kwargs: dict[str, Any], app_data: dict[str, Any] | None, culprit: str
) -> None:
    with pytest.raises(SerializationError) as ei:
        encode_call("jobs.resize", args, kwargs, app_data)
    e = ei.value
    assert e.task == "jobs.resize" and e.argument == culprit
    assert "jobs.resize" in str(e) and culprit in str(e) and "lock" in str(e)
    assert e.retryable is False


@pytest.mark.parametrize(
    ("payload", "headers", "match"),
    [
        (b"\x95\x01", {}, "content type None"),
        (b"\x95\x01", {H_CONTENT_TYPE: "json"}, "content type 'json'"),
        (b"\xc1garbage", {H_CONTENT_TYPE: CT_MSGPACK}, "undecodable msgpack"),
        (b"not a pickle", {H_CONTENT_TYPE: CT_PICKLE}, "undecodable pickle"),
        (pickle.dumps((99, "t", (), {}, None)), {H_CONTENT_TYPE: CT_PICKLE}, "version 99"),
        (pickle.dumps("just a string"), {H_CONTENT_TYPE: CT_PICKLE}, "not a version 1 task envelope"),
    ],
)
def test_damaged_payloads_raise_serialization_errors(payload: bytes, headers: dict[str, str], match: str) -> None:
    with pytest.raises(SerializationError, match=match):
        decode_call(payload, headers)


def test_call_is_frozen() -> None:
    call = Call("t", (1,), {}, None)
    with pytest.raises(AttributeError):
        call.name = "other"  # type: ignore[misc]


def test_result_tags_and_errors() -> None:
    assert encode_result({1, 2})[0] == RESULT_TAG_PICKLE
    assert encode_result(None) == bytes([RESULT_TAG_MSGPACK]) + b"\xc0"
    with pytest.raises(SerializationError, match="lock result cannot be serialized"):
        encode_result(threading.Lock())
    with pytest.raises(SerializationError, match="empty"):
        decode_result(b"")
    with pytest.raises(SerializationError, match="unknown result tag 0x07"):
        decode_result(b"\x07abc")


class AppError(Exception):
    pass


def _fail() -> None:
    try:
        raise KeyError("inner")
    except KeyError as e:
        raise AppError("it broke\nsecond line") from e


def test_error_text_has_type_message_and_traceback() -> None:
    with pytest.raises(AppError) as ei:
        _fail()
    text = encode_error(ei.value)
    assert text.startswith(f"{__name__}.AppError: it broke\nsecond line\nTraceback (most recent call last):")
    assert "_fail" in text and "KeyError: 'inner'" in text and "direct cause" in text
    info = decode_error(text)
    assert info.type == f"{__name__}.AppError"
    assert info.message == "it broke\nsecond line"
    assert info.traceback.startswith("Traceback (most recent call last):") and "raise AppError" in info.traceback


def test_error_text_of_builtin_and_unraised_exceptions() -> None:
    assert encode_error(ValueError("bad")) == "ValueError: bad"
    assert decode_error("ValueError: bad") == decode_error(encode_error(ValueError("bad")))
    info = decode_error("lease expired on its last attempt (3 of 3)")
    assert (info.type, info.message, info.traceback) == ("", "lease expired on its last attempt (3 of 3)", "")


def test_adhoc_names_carry_the_digest() -> None:
    d = "ab" * 32
    assert adhoc_digest(adhoc_task_name(d)) == d
    assert adhoc_digest("app.tasks.resize") is None


def test_function_pickler_pickles_each_function_once() -> None:
    pickler = FunctionPickler()

    def f(x: int) -> int:
        return x * 3

    ref = pickler.ref(f)
    assert ref.digest == hashlib.sha256(ref.data).hexdigest()
    again = pickler.ref(f)
    assert again.data is ref.data  # the very same bytes: not pickled a second time
    assert pickle.loads(ref.data)(2) == 6

    def g(x: int) -> int:
        return x * 4

    assert pickler.ref(g).digest != ref.digest
    assert len(pickler) == 2
    del f, again
    gc.collect()
    assert len(pickler) == 1  # dropped with the function


def test_function_pickler_keeps_unreferenceable_callables_in_a_bounded_lru() -> None:
    pickler = FunctionPickler(max_strong=2)
    first = pickler.ref(str.upper)  # a method descriptor: no weak references
    assert pickler.ref(str.upper).data is first.data
    pickler.ref(str.lower)
    pickler.ref(bytes.hex)
    assert len(pickler) == 2
    assert pickle.loads(first.data)("a") == "A"


def test_function_pickler_rejects_what_cannot_be_pickled() -> None:
    lock = threading.Lock()
    with pytest.raises(SerializationError, match="cannot be pickled"):
        FunctionPickler().ref(lambda: lock)
    with pytest.raises(SerializationError, match="not callable"):
        FunctionPickler().ref(42)  # type: ignore[arg-type]


def test_a_big_function_is_stored_as_chunks_and_loaded_whole() -> None:
    """A model kept in a closure (40 MiB here) is stored as chunks and a manifest naming them, each checked."""
    weights = os.urandom(40 * 2**20)
    ref = FunctionPickler().ref(lambda i: weights[i])
    assert ref.size > 40 * 2**20 and len(ref.blobs) == 4  # three chunks and the manifest, named by the digest
    assert list(ref.blobs)[-1] == ref.digest and all(len(b) <= FUNCTION_CHUNK_BYTES for b in ref.blobs.values())
    assert all(hashlib.sha256(b).hexdigest() == k for k, b in ref.blobs.items())
    fetched: list[str] = []

    def fetch(key: str) -> bytes:
        fetched.append(key)
        return ref.blobs[key]

    f = FunctionCache().get(ref.digest, fetch)
    assert f(7) == weights[7] and sorted(fetched) == sorted(ref.blobs)
    first = next(iter(ref.blobs))
    with pytest.raises(SerializationError, match="hash to"):  # a chunk altered on the way: nothing is unpickled
        FunctionCache().get(ref.digest, lambda k: b"x" + ref.blobs[k][1:] if k == first else ref.blobs[k])


def test_a_function_past_the_limit_is_refused_with_its_size_and_the_fix() -> None:
    too_big = bytes(FUNCTION_MAX_BYTES + 2**20)  # zeros: not touched, so not resident
    with pytest.raises(SerializationError, match=r"predict' pickles to 1,025 MiB, over the 1,024 MiB .* load it where"):
        stored_form(too_big, "predict")


def test_function_cache_fetches_and_unpickles_once_per_digest() -> None:
    base = 5
    ref = FunctionPickler().ref(lambda x: x + base)
    digest, data = ref.digest, ref.data
    fetched: list[str] = []

    def fetch(d: str) -> bytes:
        fetched.append(d)
        return data

    cache = FunctionCache()
    f1 = cache.get(digest, fetch)
    f2 = cache.get(digest, fetch)
    assert f1 is f2 and f1(1) == 6
    assert fetched == [digest] and digest in cache


def test_function_cache_loads_a_digest_once_for_threads_asking_at_once() -> None:
    """Threads missing the cache together wait for one fetch and share its callable (a model it builds, say)."""
    ref = FunctionPickler().ref(lambda x: x)
    fetched: list[str] = []
    asked = threading.Barrier(8)

    def fetch(d: str) -> bytes:
        fetched.append(d)
        time.sleep(0.2)  # a slow round trip: the other threads arrive while it lasts
        return ref.data

    cache = FunctionCache()
    got: list[object] = []

    def ask() -> None:
        asked.wait(timeout=10)  # bounded: all 8 threads start within it
        got.append(cache.get(ref.digest, fetch))

    threads = [threading.Thread(target=ask) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)  # bounded: one fetch of 0.2 s
    assert len(got) == 8 and len({id(f) for f in got}) == 1 and fetched == [ref.digest]


UNPICKLED: list[str] = []  # the tag of each `Unpickled` unpickled in this process


class Unpickled:
    """A callable that notes each time it is unpickled (as a task holding a model would build it)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __call__(self) -> str:
        return self.tag

    def __setstate__(self, state: dict[str, str]) -> None:
        self.tag = state["tag"]
        UNPICKLED.append(self.tag)


class AskingLock:
    """The cache's lock, which before each hold the loading thread takes after its fetch first lets a new thread ask.

    So a thread asks at every step of the load's end, where a gap between removing the loading
    mark and inserting the function would let it load a second time.
    """

    def __init__(self, ask: Callable[[], None]) -> None:
        self.lock, self.ask = threading.Lock(), ask
        self.loader: int | None = None  # set by the fetch: the thread loading
        self.askers: list[threading.Thread] = []

    def __enter__(self) -> None:
        if threading.get_ident() == self.loader:
            asker = threading.Thread(target=self.ask)
            self.askers.append(asker)
            asker.start()
            asker.join(timeout=1)  # bounded: it returns at once, or waits for this load (then on its own after it)
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_function_cache_unpickles_a_function_once_whenever_another_thread_asks() -> None:
    """The loading mark goes when the function is in: no thread finds neither and loads again (a model built twice)."""
    data = pickle.dumps(Unpickled("once"))
    digest = hashlib.sha256(data).hexdigest()
    cache = FunctionCache()
    got: list[object] = []
    gate = AskingLock(lambda: got.append(cache.get(digest, fetch)))

    def fetch(d: str) -> bytes:
        if gate.loader is None:  # the first load's thread (an asker loading again would be the fault tested)
            gate.loader = threading.get_ident()
        return data

    cache._lock = gate  # type: ignore[assignment]  # the real lock inside, held as the cache holds it
    got.append(cache.get(digest, fetch))
    for t in gate.askers:
        t.join(timeout=10)  # bounded: each waits for one load at most
    assert gate.askers and not any(t.is_alive() for t in gate.askers)
    assert UNPICKLED.count("once") == 1 and len(got) == 1 + len(gate.askers) and len({id(f) for f in got}) == 1


def test_function_cache_forgets_a_digest() -> None:
    """`forget` drops the callable, and what it holds goes with it once nothing else does."""
    data = pickle.dumps(Unpickled("forgotten"))
    digest = hashlib.sha256(data).hexdigest()
    cache = FunctionCache()
    loaded = weakref.ref(cache.get(digest, lambda d: data))
    cache.forget(digest)
    gc.collect()
    assert digest not in cache and loaded() is None
    cache.forget(digest)  # not there: nothing to do


def test_function_cache_verifies_the_digest() -> None:
    digest = FunctionPickler().ref(len).digest
    other = FunctionPickler().ref(abs).data
    with pytest.raises(SerializationError, match="hash to"):
        FunctionCache().get(digest, lambda d: other)
    junk = b"not a pickle"
    with pytest.raises(SerializationError, match="cannot be unpickled"):
        FunctionCache().get(hashlib.sha256(junk).hexdigest(), lambda d: junk)
    not_callable = pickle.dumps(42)
    with pytest.raises(SerializationError, match="unpickled to a int"):
        FunctionCache().get(hashlib.sha256(not_callable).hexdigest(), lambda d: not_callable)


def test_function_cache_evicts_least_recently_used() -> None:
    pickler = FunctionPickler()
    refs = [pickler.ref(f) for f in (len, abs, min)]
    blobs = {r.digest: r.data for r in refs}
    cache = FunctionCache(max_entries=2)
    for r in refs:
        cache.get(r.digest, blobs.__getitem__)
    assert len(cache) == 2 and refs[0].digest not in cache and refs[2].digest in cache


def test_a_result_the_task_packed_itself_is_passed_on_and_decodes_as_plain_data() -> None:
    value = [[True, {"i": 1, "s": "x", "t": (1, 2)}, None, ""], 0]
    data = encode_result(PackedResult(pack_plain(value)))
    assert data == encode_result(value) and decode_result(data) == value
    assert decode_result(encode_result(PackedResult(pack_plain([bytearray(b"ab")])))) == [b"ab"]  # as documented
    for not_plain in ({1, 2}, [decimal.Decimal(1)], [2**64], Color.RED):
        with pytest.raises((TypeError, ValueError, OverflowError)):
            pack_plain(not_plain)
