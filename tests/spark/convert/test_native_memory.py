"""The compiled converter keeps no reference and no memory once a conversion is over.

Hard rule under test: whatever path an event takes through ``flowwarden.spark.convert._native`` (converted,
left to Python, every event of the batch left, a batch that is not all raw, a typed document
with values that do not fit, undecodable bytes, a refused plan, a ``raw`` that fails or is not
bytes, a large batch converted on threads), the objects it was given and the objects every call
shares keep their reference counts, and after a warm-up the Python heap (tracemalloc) and the
process's resident memory stay flat over 100,000 converted events. ``scripts/native-lsan`` runs
these tests under LeakSanitizer, which names the allocation that leaked, and
``scripts/native-asan`` runs them under AddressSanitizer.
"""

from __future__ import annotations

import ctypes
import datetime as dt
import gc
import sys
import tracemalloc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import bson
import psutil
import pytest
from bson.binary import Binary
from bson.dbref import DBRef
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp
from pydantic import BaseModel

from flowwarden.config import SchemaMode
from flowwarden.errors import UndecodableEventError
from flowwarden.spark import events_to_arrow
from flowwarden.spark.convert import native
from flowwarden.spark.convert.extjson import JsonMode
from flowwarden.spark.convert.plan import conversion_plan

pytestmark = pytest.mark.skipif(not native.AVAILABLE, reason="flowwarden.spark.convert._native is not built")

EVENTS = 100_000
"""Events converted after the warm-up by each check."""


class Item(BaseModel):
    sku: str
    qty: int
    price: float | None = None
    tags: list[str] = []
    attrs: dict[str, int] = {}


def event(index: int, document: Any, **fields: Any) -> bytes:
    return bson.encode(
        {
            "_id": {"_data": f"82{index:016X}"},
            "operationType": "update",
            "clusterTime": Timestamp(1_700_000_000 + index, index % 7),
            "wallTime": dt.datetime(2024, 1, 1) + dt.timedelta(seconds=index),
            "ns": {"db": "shop", "coll": "orders"},
            "documentKey": {"_id": index},
            "fullDocument": document,
            "updateDescription": {
                "updatedFields": {"qty": index},
                "removedFields": ["old"],
                "truncatedArrays": [{"field": "lines", "newSize": 2}],
            },
            **fields,
        }
    )


def item(index: int) -> dict[str, Any]:
    return {"sku": f"sku-{index}", "qty": index, "price": index / 4, "tags": ["a", "b"], "attrs": {"x": 1}}


def left_to_python(index: int) -> bytes:
    """An event the C code leaves to Python, one of four reasons in turn."""
    kind = index % 4
    if kind == 0:
        return event(index, {**item(index), "blob": Binary(b"abc" * 500, 2)})
    if kind == 1:
        return event(index, {**item(index), "ref": DBRef("orders", index), "text": "x" * 2000})
    if kind == 2:
        return event(index, {**item(index), "text": "x" * 2000}, to=5)  # `to` that is not a document
    return event(index, {**item(index), "text": "x" * 2000}, ns="shop.orders")


def undecodable(index: int) -> bytes:
    data = bytearray(event(index, {**item(index), "name": "text"}))
    at = data.index(b"text")
    data[at : at + 2] = b"\xc3\x28"  # invalid UTF-8: bson.decode refuses it
    return bytes(data)


def raw(data: list[bytes]) -> list[RawBSONDocument]:
    return [RawBSONDocument(one) for one in data]


class NotBytes(RawBSONDocument):
    """A document whose ``raw`` is a new list each time: the converter refuses it (TypeError)."""

    @property
    def raw(self) -> Any:
        return [MARKER]


class Failing(RawBSONDocument):
    """A document whose ``raw`` raises."""

    @property
    def raw(self) -> bytes:
        raise LookupError(MARKER)


MARKER = object()
"""Held by what NotBytes.raw and Failing.raw return: a reference to it outliving a call leaked."""

# The inputs are built once and converted again and again: their reference counts are checked.
CONVERTED = raw([event(i, item(i)) for i in range(200)])
MIXED = raw([left_to_python(i) if i % 5 == 0 else event(i, item(i)) for i in range(100)])
ALL_LEFT = raw([left_to_python(i) for i in range(40)])
UNDECODABLE = raw([event(i, item(i)) for i in range(9)] + [undecodable(9)])
NOT_RAW = [*raw([event(0, item(0))]), bson.decode(event(1, item(1)))]
TYPED = raw(
    [
        event(i, {**item(i), "qty": "many"} if i % 4 == 0 else item(i), fullDocumentBeforeChange=item(i))
        for i in range(100)
    ]
)
LARGE = raw([left_to_python(i) if i % 500 == 7 else event(i, item(i)) for i in range(4500)])
EMPTY_SLOT = RawBSONDocument.__new__(RawBSONDocument)  # its bytes slot never set
REFUSED = [
    [*CONVERTED[:10], NotBytes(CONVERTED[10].raw)],
    [*CONVERTED[:10], Failing(CONVERTED[10].raw)],
    [*CONVERTED[:10], EMPTY_SLOT],
]
INPUTS = [CONVERTED, MIXED, ALL_LEFT, UNDECODABLE, NOT_RAW, TYPED, LARGE, *REFUSED]
ROUND_EVENTS = sum(map(len, [CONVERTED, MIXED, ALL_LEFT, UNDECODABLE, UNDECODABLE, NOT_RAW, TYPED, TYPED]))
"""Events converted by a round of convert_every_path (LARGE comes every tenth round)."""

PLAN = conversion_plan(Item, SchemaMode.PERMISSIVE, JsonMode.CANONICAL)
assert PLAN.native_document is not None
DOCUMENT = PLAN.native_document
PROGRAM, ARROW_TYPE = DOCUMENT
# Plans the C code refuses once it has parsed part of them: a field whose key is not bytes after
# one that is fine, and a choice that is neither bytes, bool, int nor float.
BAD_FIELDS = ((*PROGRAM[:6], (PROGRAM[6][0], ("qty", *PROGRAM[6][1][1:]))), ARROW_TYPE)
BAD_CHOICES = ((1, 0, 0, 0, (b"red", 2, MARKER), None, ()), ARROW_TYPE)


def convert_every_path(rounds: int) -> int:
    """Converts the inputs ``rounds`` times along every path and drops every result; returns how
    many events were converted. Fails when a path no longer ends as it should."""
    threads, native.THREADS = native.THREADS, max(native.THREADS, 2)  # LARGE: two slices
    converted = 0
    try:
        for round_ in range(rounds):
            mode = JsonMode.RELAXED if round_ % 2 else JsonMode.CANONICAL
            result = native.convert(CONVERTED, mode)
            assert isinstance(result, native.Converted) and result.left == ()
            result = native.convert(MIXED, mode)
            assert isinstance(result, native.Converted) and len(result.left) == 20
            assert isinstance(native.convert(ALL_LEFT, mode), str)
            assert native.convert(NOT_RAW, mode) is None
            result = native.convert(UNDECODABLE, mode)
            assert isinstance(result, native.Converted) and result.left == ((9, "invalid UTF-8 in a string"),)
            with pytest.raises(UndecodableEventError):
                events_to_arrow(UNDECODABLE, json_mode=mode)
            result = native.convert(TYPED, mode, DOCUMENT)
            assert isinstance(result, native.Converted) and len(result.left) == 25
            batch = events_to_arrow(TYPED, schema=Item, json_mode=mode)
            assert len(batch.malformed) == 25
            for document in (BAD_FIELDS, BAD_CHOICES):
                with pytest.raises(TypeError):
                    native.convert(CONVERTED[:10], mode, document)
            with pytest.raises(TypeError):
                native.convert(REFUSED[0], mode)
            with pytest.raises(LookupError):
                native.convert(REFUSED[1], mode)
            with pytest.raises(AttributeError):
                native.convert(REFUSED[2], mode)
            converted += ROUND_EVENTS
            if round_ % 10 == 0:
                result = native.convert(LARGE, mode)
                assert isinstance(result, native.Converted) and len(result.left) == 9
                converted += len(LARGE)
            del result, batch
    finally:
        native.THREADS = threads
    return converted


def rounds_for(events: int) -> int:
    """How many rounds of convert_every_path convert at least ``events`` events."""
    return -(-events * 10 // (10 * ROUND_EVENTS + len(LARGE)))


def settle() -> None:
    """Frees what can be freed: cycles, the converter's pool of blocks, malloc's free pages."""
    gc.collect()
    native.release_memory()
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc's: gives free pages back
    if trim is not None:
        trim(0)


def shared_objects() -> list[Any]:
    """The objects every conversion hands the C code besides the events: the document type, its
    bytes slot, a typed document's plan with every part of it (bar the small ints, which the C
    code only reads and the whole interpreter shares), the marker and the interned name "raw"."""
    parts: list[Any] = []
    stack: list[Any] = [PROGRAM]
    while stack:
        value = stack.pop()
        if isinstance(value, tuple):
            stack.extend(value)
        if value is not None and not isinstance(value, int):
            parts.append(value)
    return [RawBSONDocument, native._RAW_SLOT, DOCUMENT, ARROW_TYPE, *parts, MARKER, sys.intern("raw")]


SINGLETONS = (None, True, False)
"""Not immortal before Python 3.12: a reference to one of them the C code returns too often
shows in their counts, which move a little with whatever else the interpreter does."""


def input_objects() -> list[Any]:
    objects: list[Any] = []
    for batch in INPUTS:
        objects.append(batch)
        for one in batch:
            objects.append(one)
            if type(one) is RawBSONDocument and one is not EMPTY_SLOT:
                objects.append(one.raw)
    return objects


def refcounts(objects: list[Any]) -> list[int]:
    return [sys.getrefcount(one) for one in objects]


@contextmanager
def traced() -> Iterator[None]:
    tracemalloc.start()
    try:
        yield
    finally:
        tracemalloc.stop()


def test_every_path_ends_as_it_should_over_100_000_events() -> None:
    assert convert_every_path(rounds_for(EVENTS)) >= EVENTS


def test_reference_counts_of_inputs_and_shared_objects_do_not_move() -> None:
    convert_every_path(2)
    gc.collect()
    inputs, shared = input_objects(), shared_objects()
    # Interned names ("raw", the plan's field names) are the interpreter's too: another thread
    # (a driver's monitor, say) takes and drops references to them meanwhile, so they are
    # counted like None, True and False below.
    exact = [*inputs, *(one for one in shared if type(one) is not str)]
    interned = [*SINGLETONS, *(one for one in shared if type(one) is str)]
    before, loosely = refcounts(exact), refcounts(interned)
    convert_every_path(rounds_for(EVENTS))
    gc.collect()
    after = refcounts(exact)
    moved = [
        (f"{type(one).__name__} {id(one):#x}", was, now)
        for one, was, now in zip(exact, before, after, strict=True)
        if now != was
    ]
    assert moved == [], f"reference counts moved (object, before, after): {moved[:10]}"
    # over a thousand calls and 100,000 events: a reference leaked per call or per event is more
    grown = [now - was for was, now in zip(loosely, refcounts(interned), strict=True)]
    assert max(grown) < 50 and min(grown) > -50, f"None, True, False and the names: {grown} references more"


def test_python_heap_does_not_grow() -> None:
    with traced():
        convert_every_path(2)
        settle()
        before, _ = tracemalloc.get_traced_memory()
        convert_every_path(rounds_for(EVENTS))
        settle()
        after, _ = tracemalloc.get_traced_memory()
    assert after - before < 256 << 10, f"the Python heap grew by {after - before} bytes"


@pytest.mark.skipif(
    hasattr(ctypes.CDLL(None), "__asan_init"),
    reason="AddressSanitizer holds freed memory in quarantine (scripts/native-lsan checks leaks)",
)
def test_resident_memory_does_not_grow() -> None:
    process = psutil.Process()
    convert_every_path(3)
    settle()
    before = process.memory_info().rss
    convert_every_path(rounds_for(EVENTS))
    settle()
    after = process.memory_info().rss
    assert after - before < 4 << 20, f"resident memory grew by {(after - before) >> 10} KiB"
