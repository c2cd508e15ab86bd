"""Schema hints: a Spark DDL field list whose names may be dotted paths ("qty BIGINT, addr.zip
STRING"), read without a JVM into (path, ValueSpec) pairs.

The option models check hints when a decorator is applied, so this module imports nothing of
flowwarden but the value specs and the errors: the options can use it without importing Spark.
"""

from __future__ import annotations

import re
from typing import NoReturn

from flowwarden.errors import ConfigurationError
from flowwarden.spark.convert.valuespec import FieldSpec, Kind, ValueSpec

_TOKEN = re.compile(r"\s*(?:(`(?:[^`]|``)*`)|([A-Za-z_][\w.]*)|(\d+)|(.))")
_SCALAR_NAMES = {
    "string": Kind.STRING,
    "varchar": Kind.STRING,
    "char": Kind.STRING,
    "boolean": Kind.BOOL,
    "bool": Kind.BOOL,
    "tinyint": Kind.INT8,
    "byte": Kind.INT8,
    "smallint": Kind.INT16,
    "short": Kind.INT16,
    "int": Kind.INT32,
    "integer": Kind.INT32,
    "bigint": Kind.INT64,
    "long": Kind.INT64,
    "float": Kind.FLOAT,
    "real": Kind.FLOAT,
    "double": Kind.DOUBLE,
    "date": Kind.DATE,
    "timestamp": Kind.TIMESTAMP,
    "timestamp_ltz": Kind.TIMESTAMP,
    "timestamp_ntz": Kind.TIMESTAMP_NTZ,
    "binary": Kind.BINARY,
}
_HINTS_ALLOWED = 'fields like "qty BIGINT, addr.zip STRING, tags ARRAY<STRING>" (Spark DDL types)'


class _Tokens:
    """Spark DDL, read without a JVM: identifiers (plain, dotted or in backticks), numbers and
    punctuation."""

    def __init__(self, text: str) -> None:
        self.text = text
        self.items: list[tuple[str, str]] = []
        position = 0
        while position < len(text):
            match = _TOKEN.match(text, position)
            if match is None or match.end() == position:
                break
            quoted, word, number, other = match.groups()
            if quoted is not None:
                self.items.append(("name", quoted[1:-1].replace("``", "`")))
            elif word is not None:
                self.items.append(("word", word))
            elif number is not None:
                self.items.append(("number", number))
            elif other is not None:
                self.items.append(("punct", other))
            position = match.end()
        self.at = 0

    def peek(self) -> tuple[str, str] | None:
        return self.items[self.at] if self.at < len(self.items) else None

    def take(self) -> tuple[str, str]:
        token = self.peek()
        if token is None:
            self.fail("the hints end too early")
        self.at += 1
        return token

    def expect(self, punct: str) -> None:
        token = self.take()
        if token != ("punct", punct):
            self.fail(f"expected {punct!r}, found {token[1]!r}")

    def fail(self, why: str) -> NoReturn:
        raise ConfigurationError(
            f"cannot read the schema hints {self.text!r}: {why}",
            option="schema_hints",
            value=self.text,
            allowed=_HINTS_ALLOWED,
        )


def parse_hints(text: str) -> list[tuple[tuple[str, ...], ValueSpec]]:
    """A DDL field list whose names may be dotted paths, as (path, spec) pairs; no JVM needed."""
    tokens = _Tokens(text)
    hints: list[tuple[tuple[str, ...], ValueSpec]] = []
    while tokens.peek() is not None:
        kind, name = tokens.take()
        if kind == "word":
            path = tuple(name.split("."))
        elif kind == "name":
            path = (name,)
            while tokens.peek() == ("punct", "."):
                tokens.take()
                part = tokens.take()
                if part[0] not in ("name", "word"):
                    tokens.fail(f"expected a field name after '.', found {part[1]!r}")
                path += (part[1],) if part[0] == "name" else tuple(part[1].split("."))
        else:
            tokens.fail(f"expected a field name, found {name!r}")
        if tokens.peek() == ("punct", ":"):
            tokens.take()
        hints.append((path, _ddl_type(tokens)))
        _no_constraints(tokens)
        if tokens.peek() is not None:
            tokens.expect(",")
    if not hints:
        tokens.fail("no field")
    return hints


def _no_constraints(tokens: _Tokens) -> None:
    token = tokens.peek()
    if token is not None and token[0] == "word" and token[1].upper() in ("NOT", "COMMENT"):
        tokens.fail(f"{token[1].upper()} is not taken in hints: every inferred field is nullable")


def _ddl_type(tokens: _Tokens) -> ValueSpec:
    kind, word = tokens.take()
    if kind != "word":
        tokens.fail(f"expected a type, found {word!r}")
    name = word.lower()
    if name in ("decimal", "dec", "numeric"):
        precision, scale = 10, 0
        if tokens.peek() == ("punct", "("):
            tokens.take()
            precision = int(tokens.take()[1])
            if tokens.peek() == ("punct", ","):
                tokens.take()
                scale = int(tokens.take()[1])
            tokens.expect(")")
        if not (1 <= precision <= 38 and 0 <= scale <= precision):
            tokens.fail(f"decimal({precision},{scale}) is not a Spark decimal")
        return ValueSpec(Kind.DECIMAL, precision=precision, scale=scale)
    if name in ("varchar", "char") and tokens.peek() == ("punct", "("):
        tokens.take()
        tokens.take()
        tokens.expect(")")
    if name in _SCALAR_NAMES:
        return ValueSpec(_SCALAR_NAMES[name])
    if name == "array":
        tokens.expect("<")
        element = _ddl_type(tokens)
        tokens.expect(">")
        return ValueSpec(Kind.LIST, element=element)
    if name == "map":
        tokens.expect("<")
        key = _ddl_type(tokens)
        if key.kind is not Kind.STRING:
            tokens.fail("a map's keys are document keys: MAP<STRING, ...>")
        tokens.expect(",")
        value = _ddl_type(tokens)
        tokens.expect(">")
        return ValueSpec(Kind.MAP, element=value)
    if name == "struct":
        tokens.expect("<")
        fields: list[FieldSpec] = []
        while tokens.peek() != ("punct", ">"):
            field_kind, field_name = tokens.take()
            if field_kind not in ("word", "name"):
                tokens.fail(f"expected a field name, found {field_name!r}")
            if tokens.peek() == ("punct", ":"):
                tokens.take()
            fields.append(FieldSpec(field_name, field_name, _ddl_type(tokens), none_ok=True))
            _no_constraints(tokens)
            if tokens.peek() == ("punct", ","):
                tokens.take()
        tokens.expect(">")
        return ValueSpec(Kind.STRUCT, fields=tuple(fields))
    tokens.fail(f"{word!r} is not a Spark type")


__all__ = ["parse_hints"]
