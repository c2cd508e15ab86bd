"""Rescued data: the parts of a document its schema has no room for, kept beside the row.

Owns splitting a decoded document by its STRUCT spec into what the typed columns take and what
they cannot (:class:`Rescuer`): a key the schema does not name, and a value that does not fit
its field's type, leave the document for the rescued part, which keeps their place (a value
nested in a sub-document stays nested in the rescued part). An array or a map is kept or
rescued whole: one element that does not fit rescues its array. The typed column holds null
where a value was rescued. :func:`flowwarden.spark.convert.python.python_table` writes the rescued
parts of a row as the Extended JSON of ``{"full_document": {...}, "full_document_before_change":
{...}}`` in ``_rescued_data`` (null when nothing was rescued), so no value of a document is lost.

What rescue cannot take stays a misfit, and the schema mode decides its row: a document that
is not a document, a required field (``NOT NULL``, a required model field) that is missing or
whose value was rescued.

Hard rule: a value is rescued exactly when the column builders would call it a misfit (the
same converters decide), so the compiled converter, which leaves every event with a misfit
or an unknown key to Python, and this path give the same table. Never imports pyarrow.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from flowwarden.spark.convert.extjson import Encoder
from flowwarden.spark.convert.misfits import Misfit
from flowwarden.spark.convert.values import decimal_unscaler, scalar_converter
from flowwarden.spark.convert.valuespec import FieldSpec, Kind, ValueSpec

__all__ = ["NOTHING", "Rescuer"]

NOTHING: Any = type("_Nothing", (), {"__repr__": lambda self: "<nothing>"})()
"""What a split keeps of a value it rescued, and rescues of a value it kept."""

Fits = Callable[[Any], bool]


def _scalar_fits(spec: ValueSpec, json: Encoder) -> Fits:
    convert = decimal_unscaler(spec) if spec.kind is Kind.DECIMAL else scalar_converter(spec, json)
    choices = spec.choices

    def fits(value: Any) -> bool:
        try:
            converted = convert(value)
        except Misfit:
            return False
        return choices is None or spec.kind is Kind.DECIMAL or converted in choices

    return fits


def _fits(spec: ValueSpec, json: Encoder) -> Fits:
    """Whether a non-null value fits ``spec`` whole, nothing rescued from it."""
    if spec.kind is Kind.STRUCT:
        fields = {field.key: (field, _fits(field.value, json)) for field in spec.fields}

        def struct_fits(value: Any) -> bool:
            if not isinstance(value, Mapping):
                return False
            for key, item in value.items():
                found = fields.get(key)
                if found is None:
                    return False
                field, fits = found
                if item is None:
                    if not field.none_ok:
                        return False
                elif not fits(item):
                    return False
            return all(f.key in value or f.none_ok or f.has_default for f, _ in fields.values())

        return struct_fits
    if spec.kind in (Kind.LIST, Kind.MAP):
        assert spec.element is not None
        element = _fits(spec.element, json)
        nullable = spec.element_nullable
        if spec.kind is Kind.LIST:

            def list_fits(value: Any) -> bool:
                if not isinstance(value, (list, tuple)):
                    return False
                return all(element(item) if item is not None else nullable for item in value)

            return list_fits

        def map_fits(value: Any) -> bool:
            if not isinstance(value, Mapping):
                return False
            return all(
                type(key) is str and (element(item) if item is not None else nullable)
                for key, item in value.items()
            )

        return map_fits
    return _scalar_fits(spec, json)


class Rescuer:
    """Splits documents of one STRUCT spec into their typed and their rescued parts."""

    __slots__ = ("_split",)

    def __init__(self, spec: ValueSpec, json: Encoder) -> None:
        self._split = _struct_splitter(spec, json)

    def split(self, documents: list[Any]) -> tuple[list[Any], list[Any]]:
        """Each document's kept part (the document itself when nothing was rescued; anything
        that is not a document as it is, for the builders to report) and rescued part (a dict,
        or :data:`NOTHING`)."""
        split = self._split
        kept: list[Any] = []
        rescued: list[Any] = []
        for document in documents:
            if isinstance(document, Mapping):
                keep, rescue = split(document)
                kept.append(keep)
                rescued.append(rescue)
            else:
                kept.append(document)
                rescued.append(NOTHING)
        return kept, rescued


def _struct_splitter(spec: ValueSpec, json: Encoder) -> Callable[[Mapping[str, Any]], tuple[Any, Any]]:
    fields: dict[str, tuple[FieldSpec, Callable[[Any], tuple[Any, Any]]]] = {
        field.key: (field, _value_splitter(field.value, json)) for field in spec.fields
    }

    def split(document: Mapping[str, Any]) -> tuple[Any, Any]:
        rescued: dict[str, Any] | None = None
        kept: dict[str, Any] | None = None  # made only once something is rescued
        for index, (key, value) in enumerate(document.items()):
            found = fields.get(key)
            if found is None:
                keep, rescue = NOTHING, value
            elif value is None:
                keep, rescue = None, NOTHING
            else:
                keep, rescue = found[1](value)
            if rescue is not NOTHING:
                if rescued is None:
                    rescued = {}
                    kept = dict(list(document.items())[:index])
                rescued[key] = rescue
            if kept is not None and keep is not NOTHING:
                kept[key] = keep
        if rescued is None:
            return document, NOTHING
        return kept, rescued

    return split


def _value_splitter(spec: ValueSpec, json: Encoder) -> Callable[[Any], tuple[Any, Any]]:
    """(kept, rescued) of one non-null value: a sub-document splits; anything else is kept or
    rescued whole."""
    if spec.kind is Kind.STRUCT:
        split_struct = _struct_splitter(spec, json)

        def split_value(value: Any) -> tuple[Any, Any]:
            if isinstance(value, Mapping):
                return split_struct(value)
            return NOTHING, value

        return split_value
    fits = _fits(spec, json)

    def whole(value: Any) -> tuple[Any, Any]:
        return (value, NOTHING) if fits(value) else (NOTHING, value)

    return whole
