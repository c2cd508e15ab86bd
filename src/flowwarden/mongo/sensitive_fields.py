"""Fields of the documents no handler may see as they are: ``exclude_fields`` and ``hash_fields``.

A field is a dotted path under the document (``ssn``, ``address.zip``); where the path meets an
array of documents it applies to each of them (``items.secret``), as a projection does.

Excluded fields are removed by the server and never cross the network:
:func:`exclusion_stages` are the last stages of the change stream's pipeline (after the user's
``@pipeline``, which may still ``$match`` on them), removing each path from ``fullDocument`` and
``fullDocumentBeforeChange`` and from the update description, whose ``updatedFields`` keys are
dotted paths themselves (``"address.zip": ...``, ``"items.0.secret": ...``): a key equal to an
excluded path or under it goes, and a key above one keeps its value without the excluded part
(``"address": {"zip": ..., "city": ...}`` keeps ``city``). Paths in ``removedFields``,
``truncatedArrays`` and ``disambiguatedPaths`` equal to or under an excluded path go too. The
initial snapshot reads documents with :func:`snapshot_projection`.

Hashed fields are replaced by the client, before any method, filter or DataFrame sees them:
:class:`FieldHasher` puts the hex SHA-256 of the salt followed by the value in place of the value
(a string's UTF-8 bytes, any other value's relaxed Extended JSON; null stays null), in
``fullDocument``, ``fullDocumentBeforeChange`` and ``updatedFields`` (with the key rules above), in
decoded events and in raw BSON ones alike: the same value hashes the same everywhere and across
restarts, for as long as the salt stays the same.

The rule this module keeps: the server stages and the client-side hashing read a path the same
way (:class:`SensitivePath`), and nothing here runs per event unless hashed fields are declared.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Iterable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any

import bson
from bson import json_util
from bson.codec_options import CodecOptions, DatetimeConversion
from bson.raw_bson import RawBSONDocument

from flowwarden.errors import ConfigurationError
from flowwarden.mongo.raw_events import RawEvent

DOCUMENT_FIELDS = ("fullDocument", "fullDocumentBeforeChange")
"""The fields of a change event that hold a whole document."""

# Array indexes in an updatedFields key ("items.0.secret") sit between the path's own names.
_INDEXES = r"(?:\.[0-9]+)*"

_RELAXED = json_util.RELAXED_JSON_OPTIONS

# Events read as raw BSON are decoded to be hashed with every value kept as the server sent it
# (an int64 stays an int64, a date out of Python's range stays a date).
_RAW_DECODING: CodecOptions[Any] = CodecOptions(
    tz_aware=True, datetime_conversion=DatetimeConversion.DATETIME_AUTO
)


def path_problem(path: Any) -> str | None:
    """Why ``path`` cannot name a field under the document (None when it can)."""
    if not isinstance(path, str) or not path:
        return f"{path!r} is not a dotted field path"
    parts = path.split(".")
    if any(not part for part in parts):
        return f"{path!r} has an empty part"
    if any(part.startswith("$") for part in parts):
        return f"{path!r} has a part starting with '$'"
    if parts[0] == "_id":
        return f"{path!r} is the document's _id, which keys the document and its changes"
    return None


@dataclass(frozen=True)
class SensitivePath:
    """One dotted path, and how the keys of ``updatedFields`` relate to it."""

    parts: tuple[str, ...]

    @classmethod
    def of(cls, path: str) -> SensitivePath:
        return cls(tuple(path.split(".")))

    @property
    def dotted(self) -> str:
        return ".".join(self.parts)

    def covering(self) -> str:
        """The regular expression of the keys equal to this path or under it, array indexes
        allowed between its parts."""
        return "^" + (_INDEXES + r"\.").join(re.escape(part) for part in self.parts) + r"(?:\.|$)"

    def above(self) -> list[tuple[str, tuple[str, ...]]]:
        """For each proper prefix of the path: the regular expression of the keys naming it (array
        indexes allowed), and the rest of the path, found inside such a key's value."""
        prefixes = []
        for length in range(1, len(self.parts)):
            names = (re.escape(part) + _INDEXES for part in self.parts[:length])
            prefixes.append(("^" + r"\.".join(names) + "$", self.parts[length:]))
        return prefixes


def covering_any(paths: Iterable[SensitivePath]) -> str:
    """One regular expression of the keys equal to or under any of ``paths``."""
    return "|".join(f"(?:{path.covering()})" for path in paths)


# ----------------------------------------------------------------------------------------------
# Excluded fields: server stages


def exclusion_stages(paths: Iterable[str]) -> list[dict[str, Any]]:
    """The stages that remove ``paths`` from every change event (none for no path)."""
    parsed = [SensitivePath.of(path) for path in paths]
    if not parsed:
        return []
    document_paths = [f"{field}.{path.dotted}" for field in DOCUMENT_FIELDS for path in parsed]
    description = "$updateDescription"
    cleaned = {
        "updatedFields": _when_object(f"{description}.updatedFields", _clean_updated_fields(parsed)),
        "removedFields": _when_array(
            f"{description}.removedFields", _drop_covered(f"{description}.removedFields", parsed, "")
        ),
        "truncatedArrays": _when_array(
            f"{description}.truncatedArrays",
            _drop_covered(f"{description}.truncatedArrays", parsed, ".field"),
        ),
        "disambiguatedPaths": _when_object(
            f"{description}.disambiguatedPaths",
            _drop_covered_keys(f"{description}.disambiguatedPaths", parsed),
        ),
    }
    update = {
        "$cond": [
            {"$eq": [{"$type": description}, "object"]},
            {"$mergeObjects": [description, cleaned]},
            "$$REMOVE",
        ]
    }
    return [{"$unset": document_paths}, {"$set": {"updateDescription": update}}]


def snapshot_projection(paths: Iterable[str]) -> dict[str, int] | None:
    """The find projection that leaves ``paths`` out of the copied documents (None: no path)."""
    projection = {path: 0 for path in paths}
    return projection or None


def _when_object(value: str, expression: Any) -> dict[str, Any]:
    return {"$cond": [{"$eq": [{"$type": value}, "object"]}, expression, "$$REMOVE"]}


def _when_array(value: str, expression: Any) -> dict[str, Any]:
    return {"$cond": [{"$isArray": value}, expression, "$$REMOVE"]}


def _covered(key: str, paths: list[SensitivePath]) -> dict[str, Any]:
    return {"$regexMatch": {"input": key, "regex": covering_any(paths)}}


def _drop_covered(array: Any, paths: list[SensitivePath], field: str) -> dict[str, Any]:
    """``array`` without the entries (or the entries whose ``field``) name a covered path."""
    keep = {"$not": [_covered(f"$$entry{field}", paths)]}
    return {"$filter": {"input": array, "as": "entry", "cond": keep}}


def _drop_covered_keys(document: str, paths: list[SensitivePath]) -> dict[str, Any]:
    pairs = {"$objectToArray": document}
    return {"$arrayToObject": _drop_covered(pairs, paths, ".k")}


def _clean_updated_fields(paths: list[SensitivePath]) -> dict[str, Any]:
    """``updatedFields`` without covered keys, and with the covered part removed from the value
    of each key above an excluded path."""
    kept: Any = _drop_covered({"$objectToArray": "$updateDescription.updatedFields"}, paths, ".k")
    prefixes = [prefix for path in paths for prefix in path.above()]
    if prefixes:
        value: Any = "$$entry.v"
        for index, (regex, rest) in enumerate(prefixes):
            name = f"value{index}"
            value = {
                "$let": {
                    "vars": {name: value},
                    "in": {
                        "$cond": [
                            {"$regexMatch": {"input": "$$entry.k", "regex": regex}},
                            _without(f"$${name}", rest, index, arrays=True),
                            f"$${name}",
                        ]
                    },
                }
            }
        kept = {"$map": {"input": kept, "as": "entry", "in": {"k": "$$entry.k", "v": value}}}
    return {"$arrayToObject": kept}


def _without(value: str, rest: tuple[str, ...], tag: int, *, arrays: bool, depth: int = 0) -> dict[str, Any]:
    """An expression of ``value`` with the path ``rest`` removed: from a document, and from each
    document of an array (``arrays``), as a projection removes it; other values stay."""
    name = f"v{tag}_{depth}"
    field = f"f{tag}_{depth}"
    head, tail = rest[0], rest[1:]
    pairs = {"$objectToArray": f"$${name}"}
    if tail:
        inner = _without(f"$${field}.v", tail, tag, arrays=True, depth=depth + 1)
        key, value_of = f"$${field}.k", f"$${field}.v"
        entry = {"k": key, "v": {"$cond": [{"$eq": [key, head]}, inner, value_of]}}
        document: Any = {"$arrayToObject": {"$map": {"input": pairs, "as": field, "in": entry}}}
    else:
        keep = {"$ne": [f"$${field}.k", head]}
        document = {"$arrayToObject": {"$filter": {"input": pairs, "as": field, "cond": keep}}}
    branches: list[dict[str, Any]] = [{"case": {"$eq": [{"$type": f"$${name}"}, "object"]}, "then": document}]
    if arrays:
        element = f"e{tag}_{depth}"
        each = _without(f"$${element}", rest, tag, arrays=False, depth=depth + 1)
        each_one = {"$map": {"input": f"$${name}", "as": element, "in": each}}
        branches.append({"case": {"$isArray": f"$${name}"}, "then": each_one})
    choice = {"$switch": {"branches": branches, "default": f"$${name}"}}
    return {"$let": {"vars": {name: value}, "in": choice}}


# ----------------------------------------------------------------------------------------------
# Hashed fields: client side


def salted_hasher(paths: Iterable[str], variable: str | None, *, owner: str) -> FieldHasher | None:
    """The hasher of ``paths`` with the salt read from environment variable ``variable`` now;
    None when no path is hashed. A ConfigurationError naming the variable when it is unset or
    empty: hashing with no salt would make the values easy to guess back."""
    paths = tuple(paths)
    if not paths:
        return None
    salt = os.environ.get(variable) if variable else None
    if not salt:
        raise ConfigurationError(
            f"the environment variable {variable} that holds the salt of hash_fields is not set or "
            "empty; set it, to the same secret wherever the stream runs (the same value hashes the "
            "same only under the same salt)",
            owner=owner,
            option="hash_salt_env",
            value=variable,
            allowed="the name of an environment variable set to a non-empty secret",
        )
    return FieldHasher(paths, salt.encode())


class FieldHasher:
    """Replaces the values of hashed fields by their salted SHA-256, in one change event at a
    time: decoded events in place, raw ones as a new :class:`RawEvent` (only those that carry a
    hashed field are decoded at all). Call it as ``event = hasher(event)``."""

    __slots__ = ("_above", "_covering", "_first_parts", "_paths", "_salt")

    def __init__(self, paths: Iterable[str], salt: bytes) -> None:
        self._paths = tuple(SensitivePath.of(path) for path in paths)
        if not self._paths:
            raise ValueError("a FieldHasher needs at least one path")
        self._salt = salt
        self._first_parts = frozenset(path.parts[0] for path in self._paths)
        self._covering = re.compile(covering_any(self._paths))
        self._above = [(re.compile(regex), rest) for path in self._paths for regex, rest in path.above()]

    def __repr__(self) -> str:
        # Never the salt: this object travels in logs and pickles of the streaming source.
        return f"FieldHasher({[path.dotted for path in self._paths]!r})"

    def hash_value(self, value: Any) -> Any:
        """The salted SHA-256 (hex) of ``value``; null stays null."""
        if value is None:
            return None
        text = value if isinstance(value, str) else json_util.dumps(value, json_options=_RELAXED)
        return hashlib.sha256(self._salt + text.encode("utf-8", "surrogatepass")).hexdigest()

    def __call__(self, change: Any) -> Any:
        if isinstance(change, RawBSONDocument):
            return self._raw(change)
        self.apply(change)
        return change

    def apply(self, change: MutableMapping[str, Any]) -> None:
        """Hash the fields of a decoded event, in place."""
        for field in DOCUMENT_FIELDS:
            document = change.get(field)
            if isinstance(document, MutableMapping):
                for path in self._paths:
                    self._hash_at(document, path.parts)
        description = change.get("updateDescription")
        updated = description.get("updatedFields") if isinstance(description, Mapping) else None
        if isinstance(updated, MutableMapping):
            for key in list(updated):
                if self._covering.match(key):
                    updated[key] = self.hash_value(updated[key])
                    continue
                for regex, rest in self._above:
                    if regex.match(key):
                        self._hash_at(updated[key], rest)

    def _hash_at(self, node: Any, parts: tuple[str, ...]) -> None:
        if isinstance(node, list):
            for item in node:
                if isinstance(item, MutableMapping):
                    self._hash_at(item, parts)
            return
        if not isinstance(node, MutableMapping) or parts[0] not in node:
            return
        if len(parts) == 1:
            node[parts[0]] = self.hash_value(node[parts[0]])
        else:
            self._hash_at(node[parts[0]], parts[1:])

    def _raw(self, change: RawBSONDocument) -> Any:
        if not self._carries(change):
            return change
        event = bson.decode(change.raw, codec_options=_RAW_DECODING)
        self.apply(event)
        return RawEvent(bson.encode(event))

    def _carries(self, change: RawBSONDocument) -> bool:
        """Whether a raw event may hold a hashed field (reads only top-level names)."""
        for field in DOCUMENT_FIELDS:
            document = change.get(field)
            if isinstance(document, Mapping) and not self._first_parts.isdisjoint(document.keys()):
                return True
        description = change.get("updateDescription")
        updated = description.get("updatedFields") if isinstance(description, Mapping) else None
        if isinstance(updated, Mapping):
            for key in updated.keys():
                if self._covering.match(key) or any(regex.match(key) for regex, _ in self._above):
                    return True
        return False


__all__ = [
    "DOCUMENT_FIELDS",
    "FieldHasher",
    "SensitivePath",
    "exclusion_stages",
    "path_problem",
    "salted_hasher",
    "snapshot_projection",
]
