"""Column builders: the Python path's lists of values to Arrow arrays, by the schema's shape.

Owns the structure of a typed column: a :class:`Column` is compiled once per schema
(:func:`compile_column`, one builder per struct field, array element and map value) and
then called once per column per batch with the list of that column's values. A struct
reads every field of a document in one pass (:func:`columns_reader`), fills defaults and
checks required fields; a list or map flattens its children into one list for the child
builder; a scalar column goes to pyarrow whole when its values already have the types
pyarrow takes exactly, else value by value through :mod:`flowwarden.spark.convert.values`.

Hard rules: a value that does not fit is written as null and reported in
:class:`~flowwarden.spark.convert.misfits.FirstMisfits` under the event it came from (``owners``);
a builder never raises for a misfit, never drops or reorders values (its array has one
entry per input value), and never works per value when the whole column can go to pyarrow
as it is. This module imports pyarrow, never pyspark.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from types import NoneType
from typing import Any

from bson.objectid import ObjectId

from flowwarden.spark._extra import require
from flowwarden.spark.convert.extjson import Encoder
from flowwarden.spark.convert.misfits import FirstMisfits, Misfit, describe_value
from flowwarden.spark.convert.values import EXACT_TYPES, decimal_unscaler, scalar_converter
from flowwarden.spark.convert.valuespec import FieldSpec, Kind, ValueSpec
from flowwarden.spark.schema import arrow_type

pa = require("pyarrow", "flowwarden.spark (change events to Arrow)")

__all__ = ["ChildEventIndexes", "Column", "columns_reader", "compile_column"]

_MISSING_TYPE = type("_Missing", (), {"__repr__": lambda self: "<missing>"})
_MISSING: Any = _MISSING_TYPE()
_ONLY_NONE = frozenset({NoneType})
_DICTS = frozenset({dict, NoneType})
_LISTS = frozenset({list, NoneType})
_STRINGS_AND_IDS = frozenset({str, ObjectId, NoneType})
_ZERO_WORD = bytes(16)
_ARROW_ERRORS = (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError)


class ChildEventIndexes(Sequence[int]):
    """The ``owners`` of the flattened children of a list or map column: for each array
    element or map value, in flattened order, the index of the event it came from.

    ``parent`` holds the event index of each list or map, ``offsets`` where each one's children
    start in the flattened values (one more entry than ``parent``). An index is looked up only
    when a misfit has to be reported, so the common, fitting batch never materialises the
    sequence.
    """

    __slots__ = ("offsets", "parent")

    def __init__(self, parent: Sequence[int], offsets: list[int]) -> None:
        self.parent = parent
        self.offsets = offsets

    def __len__(self) -> int:
        return self.offsets[-1]

    @typing.overload
    def __getitem__(self, index: int) -> int: ...

    @typing.overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if isinstance(index, slice):
            return list(self)[index]
        return self.parent[bisect.bisect_right(self.offsets, index) - 1]

    def __iter__(self) -> Iterator[int]:
        offsets = self.offsets
        for row, owner in enumerate(self.parent):
            yield from itertools.repeat(owner, offsets[row + 1] - offsets[row])


def _validity(nulls: list[bool]) -> Any:
    """The mask argument of pyarrow's from_arrays: None when no value is null."""
    return pa.array(nulls, type=pa.bool_()) if True in nulls else None


@functools.lru_cache(maxsize=256)
def columns_reader(keys: tuple[str, ...]) -> Callable[[Sequence[Any], Any], list[list[Any]]]:
    """A function reading ``keys`` from every document in one pass: one list per key.

    Its source is generated (as ``collections.namedtuple`` does) so the loop body is one
    ``get`` per key and no inner loop: each document is read once, while it is in the CPU cache,
    instead of once per field, which halves the cost on documents scattered over the heap.
    Keys enter the source only as ``repr()`` string literals. A None document gives None in
    every column, a missing key gives ``missing``.
    """
    count = len(keys)
    columns = ", ".join(f"c{i}" for i in range(count))
    source = "\n".join(
        [
            "def read(documents, missing):",
            *(f"    c{i} = []; a{i} = c{i}.append" for i in range(count)),
            "    for document in documents:",
            "        if document is None:",
            *(f"            a{i}(None)" for i in range(count)),
            "            continue",
            "        get = document.get",
            *(f"        a{i}(get({key!r}, missing))" for i, key in enumerate(keys)),
            f"    return [{columns}]",
        ]
    )
    namespace: dict[str, Any] = {}
    exec(compile(source, f"<flowwarden columns {keys!r:.60}>", "exec"), namespace)
    reader: Callable[[Sequence[Any], Any], list[list[Any]]] = namespace["read"]
    return reader


class Column:
    """Builds one Arrow array from the list of values of one column (or nested field).

    ``owners[i]`` is the index of the event ``values[i]`` came from, for misfit reports.
    """

    __slots__ = ("arrow_type", "path", "spec")

    def __init__(self, spec: ValueSpec, path: str) -> None:
        self.spec = spec
        self.path = path
        self.arrow_type = arrow_type(spec)

    def build(
        self, values: list[Any], owners: Sequence[int], misfits: FirstMisfits, kinds: set[type] | None = None
    ) -> Any:
        raise NotImplementedError


class _ScalarColumn(Column):
    __slots__ = ("convert", "exact")

    def __init__(self, spec: ValueSpec, path: str, json: Encoder) -> None:
        super().__init__(spec, path)
        self.exact = EXACT_TYPES[spec.kind] if spec.choices is None else frozenset({NoneType})
        self.convert = scalar_converter(spec, json)

    def build(
        self, values: list[Any], owners: Sequence[int], misfits: FirstMisfits, kinds: set[type] | None = None
    ) -> Any:
        if kinds is None:
            kinds = set(map(type, values))
        if kinds <= self.exact:
            if kinds == _ONLY_NONE:
                return pa.nulls(len(values), type=self.arrow_type)
            try:
                return pa.array(values, type=self.arrow_type)
            except _ARROW_ERRORS:
                pass  # a number out of range: find it below
        elif kinds <= _STRINGS_AND_IDS and self.spec.kind is Kind.STRING and self.spec.choices is None:
            return pa.array([str(v) if type(v) is ObjectId else v for v in values], type=self.arrow_type)
        return pa.array(self.convert_each(values, owners, misfits), type=self.arrow_type)

    def convert_each(self, values: list[Any], owners: Sequence[int], misfits: FirstMisfits) -> list[Any]:
        convert = self.convert
        choices = self.spec.choices
        out: list[Any] = []
        append = out.append
        for value, owner in zip(values, owners, strict=True):
            if value is None:
                append(None)
                continue
            try:
                converted = convert(value)
                if choices is not None and converted not in choices:
                    raise Misfit(f"{converted!r} is not one of {sorted(map(repr, choices))}")
            except Misfit as misfit:
                misfits.add(owner, self.path, str(misfit))
                converted = None
            append(converted)
        return out


class _DecimalColumn(Column):
    """decimal(p,s) straight into Arrow's 128-bit buffer, each value rescaled to an integer by
    :func:`~flowwarden.spark.convert.values.decimal_unscaler`."""

    __slots__ = ("unscaled",)

    def __init__(self, spec: ValueSpec, path: str) -> None:
        super().__init__(spec, path)
        self.unscaled = decimal_unscaler(spec)

    def build(
        self, values: list[Any], owners: Sequence[int], misfits: FirstMisfits, kinds: set[type] | None = None
    ) -> Any:
        unscaled = self.unscaled
        words: list[bytes] = []
        valid: list[bool] = []
        for value, owner in zip(values, owners, strict=True):
            number = None
            if value is not None:
                try:
                    number = unscaled(value)
                except Misfit as misfit:
                    misfits.add(owner, self.path, str(misfit))
            if number is None:
                words.append(_ZERO_WORD)
                valid.append(False)
            else:
                words.append(number.to_bytes(16, "little", signed=True))
                valid.append(True)
        bitmap = None if False not in valid else pa.array(valid, type=pa.bool_()).buffers()[1]
        return pa.Array.from_buffers(self.arrow_type, len(values), [bitmap, pa.py_buffer(b"".join(words))])


class _ListColumn(Column):
    __slots__ = ("element",)

    def __init__(self, spec: ValueSpec, path: str, element: Column) -> None:
        super().__init__(spec, path)
        self.element = element

    def build(
        self, values: list[Any], owners: Sequence[int], misfits: FirstMisfits, kinds: set[type] | None = None
    ) -> Any:
        if kinds is None:
            kinds = set(map(type, values))
        if not kinds <= _LISTS:
            values = [self._array_or_none(v, o, misfits) for v, o in zip(values, owners, strict=True)]
            kinds = set(map(type, values))
        offsets = [0, *itertools.accumulate([len(v) if v is not None else 0 for v in values])]
        flat = list(itertools.chain.from_iterable(filter(None, values)))
        flat_owners = ChildEventIndexes(owners, offsets)
        if not self.spec.element_nullable and NoneType in set(map(type, flat)):
            for item, owner in zip(flat, flat_owners, strict=True):
                if item is None:
                    misfits.add(owner, self.element.path, "null element in an array of non-null elements")
        return pa.ListArray.from_arrays(
            pa.array(offsets, type=pa.int32()),
            self.element.build(flat, flat_owners, misfits),
            type=self.arrow_type,
            mask=_validity([v is None for v in values]) if NoneType in kinds else None,
        )

    def _array_or_none(self, value: Any, owner: int, misfits: FirstMisfits) -> Any:
        if value is None or type(value) is list:
            return value
        if isinstance(value, (list, tuple)):
            return list(value)
        misfits.add(owner, self.path, f"expected an array, got {describe_value(value)}")
        return None


class _MapColumn(Column):
    __slots__ = ("value",)

    def __init__(self, spec: ValueSpec, path: str, value: Column) -> None:
        super().__init__(spec, path)
        self.value = value

    def build(
        self, values: list[Any], owners: Sequence[int], misfits: FirstMisfits, kinds: set[type] | None = None
    ) -> Any:
        offsets = [0]
        keys: list[str] = []
        items: list[Any] = []
        nulls: list[bool] = []
        for value, owner in zip(values, owners, strict=True):
            if isinstance(value, Mapping):
                for key, item in value.items():
                    if type(key) is not str:
                        misfits.add(owner, self.path, f"map key {key!r} is not a string")
                        continue
                    if item is None and not self.spec.element_nullable:
                        misfits.add(owner, self.value.path, f"null value for key {key!r}")
                    keys.append(key)
                    items.append(item)
                nulls.append(False)
            else:
                if value is not None:
                    misfits.add(owner, self.path, f"expected a document (map), got {describe_value(value)}")
                nulls.append(True)
            offsets.append(len(keys))
        return pa.MapArray.from_arrays(
            pa.array(offsets, type=pa.int32()),
            pa.array(keys, type=pa.string()),
            self.value.build(items, ChildEventIndexes(owners, offsets), misfits),
            type=self.arrow_type,
            mask=_validity(nulls),
        )


class _StructColumn(Column):
    __slots__ = ("children", "fields", "read_columns")

    def __init__(self, spec: ValueSpec, path: str, children: list[Column]) -> None:
        super().__init__(spec, path)
        self.fields: tuple[FieldSpec, ...] = spec.fields
        self.children = children
        self.read_columns = columns_reader(tuple(f.key for f in spec.fields))

    def build(
        self, values: list[Any], owners: Sequence[int], misfits: FirstMisfits, kinds: set[type] | None = None
    ) -> Any:
        if kinds is None:
            kinds = set(map(type, values))
        if kinds == _ONLY_NONE:
            return pa.nulls(len(values), type=self.arrow_type)
        docs = values
        if not kinds <= _DICTS:
            docs = [self._document_or_none(v, o, misfits) for v, o in zip(values, owners, strict=True)]
            kinds = set(map(type, docs))
        null_count = sum(doc is None for doc in docs) if NoneType in kinds else 0
        arrays = []
        columns = self.read_columns(docs, _MISSING)
        for field, child, column in zip(self.fields, self.children, columns, strict=True):
            # Type sets, not `in`/count: those call __eq__ on every BSON value in the column.
            column_kinds = set(map(type, column))
            if _MISSING_TYPE in column_kinds or (not field.none_ok and NoneType in column_kinds):
                self._fill(field, child.path, column, docs, owners, misfits)
                arrays.append(child.build(column, owners, misfits))  # defaults replaced values
            else:
                arrays.append(child.build(column, owners, misfits, column_kinds))
        return pa.StructArray.from_arrays(
            arrays,
            fields=list(self.arrow_type),
            mask=_validity([doc is None for doc in docs]) if null_count else None,
        )

    def _document_or_none(self, value: Any, owner: int, misfits: FirstMisfits) -> Any:
        if value is None or isinstance(value, Mapping):
            return value
        misfits.add(owner, self.path, f"expected a document, got {describe_value(value)}")
        return None

    @staticmethod
    def _fill(
        field: FieldSpec,
        path: str,
        column: list[Any],
        docs: list[Any],
        owners: Sequence[int],
        misfits: FirstMisfits,
    ) -> None:
        """Defaults for missing keys; a missing or null required value is a misfit."""
        for i, value in enumerate(column):
            if value is _MISSING:
                if field.has_default:
                    column[i] = field.default_value()
                    continue
                column[i] = None
                if not field.none_ok:
                    misfits.add(owners[i], path, "required field is missing")
            elif value is None and not field.none_ok and docs[i] is not None:
                misfits.add(owners[i], path, "null in a required field")


def compile_column(spec: ValueSpec, path: str, json: Encoder) -> Column:
    if spec.kind is Kind.STRUCT:
        children = [compile_column(f.value, f"{path}.{f.name}", json) for f in spec.fields]
        return _StructColumn(spec, path, children)
    if spec.kind is Kind.LIST:
        assert spec.element is not None
        return _ListColumn(spec, path, compile_column(spec.element, f"{path}[]", json))
    if spec.kind is Kind.MAP:
        assert spec.element is not None
        return _MapColumn(spec, path, compile_column(spec.element, f"{path}{{}}", json))
    if spec.kind is Kind.DECIMAL:
        return _DecimalColumn(spec, path)
    return _ScalarColumn(spec, path, json)
