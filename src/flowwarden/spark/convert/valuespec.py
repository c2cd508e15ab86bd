"""The neutral description of a column type: :class:`ValueSpec`, :class:`FieldSpec`, :class:`Kind`.

Owns the tree every full-document schema is compiled into (by
:func:`~flowwarden.spark.convert.spec_compiler.document_spec`, from a pydantic model, a Spark
``StructType`` or an Arrow schema) and that everything downstream follows: the Arrow and
Spark types (:mod:`flowwarden.spark.schema`), the Python path's column builders
(:mod:`flowwarden.spark.convert.columns`) and the compiled converter's program
(:mod:`flowwarden.spark.convert.native`). One description, so those can never disagree.

Hard rule: a spec is a frozen value compiled once per schema; nothing here runs per event.
This module never imports pyarrow, pyspark or pydantic.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable
from typing import Any

__all__ = ["NO_DEFAULT", "FieldSpec", "Kind", "ValueSpec"]


class Kind(enum.Enum):
    """What a value becomes in Arrow and Spark."""

    STRING = "string"
    UUID = "uuid"  # a string column receiving uuid.UUID or subtype-4 binaries
    JSON = "json"  # a string column holding canonical Extended JSON of any value
    INT8 = "tinyint"
    INT16 = "smallint"
    INT32 = "int"
    INT64 = "bigint"
    FLOAT = "float"
    DOUBLE = "double"
    BOOL = "boolean"
    TIMESTAMP = "timestamp"
    TIMESTAMP_NTZ = "timestamp_ntz"
    DATE = "date"
    DECIMAL = "decimal"
    BINARY = "binary"
    LIST = "array"
    MAP = "map"
    STRUCT = "struct"


NO_DEFAULT: Any = object()
"""The :attr:`FieldSpec.default` of a field without a default value (None is a default)."""


@dataclasses.dataclass(frozen=True)
class ValueSpec:
    """The target type of one value, compiled once from a schema."""

    kind: Kind
    precision: int = 0
    scale: int = 0
    choices: frozenset[Any] | None = None
    """Allowed values after conversion (an Enum's or a Literal's values), None: any."""
    element: ValueSpec | None = None
    """The element type of a LIST, the value type of a MAP."""
    element_nullable: bool = True
    fields: tuple[FieldSpec, ...] = ()
    """The fields of a STRUCT."""

    def describe(self) -> str:
        """The Spark SQL spelling of this type, for error messages."""
        if self.kind is Kind.DECIMAL:
            return f"decimal({self.precision},{self.scale})"
        if self.kind is Kind.LIST and self.element is not None:
            return f"array<{self.element.describe()}>"
        if self.kind is Kind.MAP and self.element is not None:
            return f"map<string,{self.element.describe()}>"
        if self.kind is Kind.STRUCT:
            return "struct"
        if self.choices is not None:
            return f"{self.kind.value} in {sorted(map(repr, self.choices))}"
        return str(self.kind.value)


@dataclasses.dataclass(frozen=True)
class FieldSpec:
    """One struct field: its column name, the document key it is read from, and its rules."""

    name: str
    key: str
    value: ValueSpec
    none_ok: bool
    """None (or a missing key without default) is a fitting value: the column holds null."""
    default: Any = NO_DEFAULT
    """Used when the key is missing (a pydantic default, normalised to document form)."""
    default_factory: Callable[[], Any] | None = None

    @property
    def has_default(self) -> bool:
        return self.default is not NO_DEFAULT or self.default_factory is not None

    def default_value(self) -> Any:
        if self.default_factory is not None:
            return self.default_factory()
        return self.default
