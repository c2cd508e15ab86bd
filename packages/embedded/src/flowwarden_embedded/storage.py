"""Collections, indexes and the namespace catalog of the embedded replica set.

The storage owns documents and index entries, nothing else: it knows no commands, sessions or
oplog. Two rules make the rest of the server cheap and correct:

- A stored document is never mutated. A write stores a new dict and the old one stays valid, so
  readers (cursors, oplog before/after images, transaction snapshots) hold references instead of
  copies, and a transaction snapshot is a shallow copy of a collection's dict.
- Unique indexes are hash maps kept in step with every put and remove, so a duplicate check costs
  one lookup per index key instead of a scan.

Document dicts live in a query-engine store so that aggregation stages reading other collections
(``$lookup``, ``$unionWith``) see the same data.
"""

from __future__ import annotations

import itertools
import uuid
from collections import OrderedDict
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

from bson import Binary
from bson.binary import UuidRepresentation

from flowwarden_embedded import engine
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.keys import format_document, value_key

Document = dict[str, Any]

_MISSING = object()
# MongoDB indexes an empty array as `undefined`, so two documents with `a: []` collide in a
# unique index on `a` while `a: null` and a missing `a` collide with each other.
_UNDEFINED_KEY = ("undefined",)

INDEX_OPTION_FIELDS = (
    "unique",
    "sparse",
    "expireAfterSeconds",
    "partialFilterExpression",
    "hidden",
    "collation",
    "weights",
    "default_language",
    "language_override",
    "textIndexVersion",
    "2dsphereIndexVersion",
    "bits",
    "min",
    "max",
    "wildcardProjection",
)


class DuplicateKey(Exception):
    """A put would give a unique index the same key twice; carries MongoDB's write-error fields."""

    def __init__(self, ns: str, index: IndexSpec, key_value: Document) -> None:
        self.errmsg = (
            f"E11000 duplicate key error collection: {ns} index: {index.name} "
            f"dup key: {format_document(key_value)}"
        )
        super().__init__(self.errmsg)
        self.key_pattern = dict(index.key)
        self.key_value = key_value

    def write_error(self, index: int) -> Document:
        return {
            "index": index,
            "code": 11000,
            "errmsg": self.errmsg,
            "keyPattern": self.key_pattern,
            "keyValue": self.key_value,
        }

    def command_error(self, prefix: str = "") -> CommandError:
        return CommandError(
            11000,
            prefix + self.errmsg,
            extra={"keyPattern": self.key_pattern, "keyValue": self.key_value},
        )


@dataclass(slots=True)
class IndexSpec:
    """One index as ``listIndexes`` shows it; unique ones also hold their key -> ``_id`` map."""

    name: str
    key: dict[str, Any]
    spec: Document
    unique: bool = False
    sparse: bool = False
    partial: Document | None = None
    entries: dict[Hashable, Hashable] = field(default_factory=dict)

    @classmethod
    def from_spec(cls, spec: Document) -> IndexSpec:
        key = dict(spec["key"])
        full: Document = {"v": 2, "key": key, "name": spec["name"]}
        for option in INDEX_OPTION_FIELDS:
            if option in spec:
                full[option] = spec[option]
        return cls(
            name=spec["name"],
            key=key,
            spec=full,
            unique=bool(spec.get("unique", False)) and spec["name"] != "_id_",
            sparse=bool(spec.get("sparse", False)),
            partial=spec.get("partialFilterExpression"),
        )

    def copy(self) -> IndexSpec:
        return IndexSpec(
            self.name, self.key, dict(self.spec), self.unique, self.sparse, self.partial, dict(self.entries)
        )

    def keys_of(self, doc: Document) -> list[tuple[Hashable, tuple[Any, ...]]]:
        """Every ``(hashable key, key values)`` this index holds for ``doc`` (several if multikey)."""
        if self.partial is not None and not engine.matches(self.partial, doc):
            return []
        per_field: list[list[tuple[Hashable, Any]]] = []
        all_missing = True
        for path in self.key:
            values = path_values(doc, path)
            if values:
                all_missing = False
                per_field.append([(_UNDEFINED_KEY if v is _UNDEFINED else value_key(v), v) for v in values])
            else:
                per_field.append([(None, None)])
        if self.sparse and all_missing:
            return []
        if len(per_field) == 1:
            return [(k, (v,)) for k, v in per_field[0]]
        return [
            (tuple(k for k, _ in combo), tuple(v for _, v in combo))
            for combo in itertools.product(*per_field)
        ]


class _Undefined:
    def __repr__(self) -> str:
        return "undefined"


_UNDEFINED: Any = _Undefined()


def path_values(doc: Any, path: str) -> list[Any]:
    """The values a dotted path reaches, arrays expanded as MongoDB's multikey indexes do."""
    nodes = [doc]
    for part in path.split("."):
        found: list[Any] = []
        for node in nodes:
            if isinstance(node, dict):
                if part in node:
                    found.append(node[part])
            elif isinstance(node, list):
                if part.isdigit() and int(part) < len(node):
                    found.append(node[int(part)])
                for item in node:
                    if isinstance(item, dict) and part in item:
                        found.append(item[part])
        nodes = found
        if not nodes:
            return []
    values: list[Any] = []
    for node in nodes:
        if isinstance(node, list):
            values.extend(node if node else [_UNDEFINED])
        else:
            values.append(node)
    return values


def new_uuid() -> Binary:
    return Binary.from_uuid(uuid.uuid4(), UuidRepresentation.STANDARD)


class Collection:
    """One collection: documents by ``_id`` key, indexes, options and its UUID.

    ``put`` and ``remove`` are the only ways documents change; both keep unique indexes exact.
    A collection copied for a transaction remembers the main collection it came from
    (``origin``) and, per written ``_id``, the document it saw before its first write (``base``),
    which is what commit compares against to detect write conflicts.
    """

    __slots__ = ("base", "db", "docs", "indexes", "locks", "name", "options", "origin", "uuid")

    def __init__(
        self,
        db: str,
        name: str,
        docs: OrderedDict[Hashable, Document],
        *,
        options: Document | None = None,
        coll_uuid: Binary | None = None,
        origin: Collection | None = None,
    ) -> None:
        self.db = db
        self.name = name
        self.docs = docs
        self.options: Document = dict(options or {})
        self.uuid = coll_uuid if coll_uuid is not None else new_uuid()
        self.indexes: dict[str, IndexSpec] = {
            "_id_": IndexSpec(name="_id_", key={"_id": 1}, spec={"v": 2, "key": {"_id": 1}, "name": "_id_"})
        }
        self.origin = origin
        self.base: dict[Hashable, Document | None] = {}
        # On a main collection: which open transaction has written which document (by _id key).
        self.locks: dict[Hashable, int] = {}

    @property
    def ns(self) -> str:
        return f"{self.db}.{self.name}"

    def unique_indexes(self) -> list[IndexSpec]:
        return [index for index in self.indexes.values() if index.unique]

    def get(self, key: Hashable) -> Document | None:
        return self.docs.get(key)

    def put(self, key: Hashable, doc: Document) -> Document | None:
        """Store ``doc`` under ``key`` (insert or replace); returns the previous document.

        Raises :class:`DuplicateKey` and changes nothing when a unique index would collide.
        """
        old = self.docs.get(key)
        for index in self.indexes.values():
            if not index.unique:
                continue
            entries = index.entries
            for index_key, values in index.keys_of(doc):
                owner = entries.get(index_key, _MISSING)
                if owner is not _MISSING and owner != key:
                    key_value = {path: _printable(v) for path, v in zip(index.key, values, strict=True)}
                    raise DuplicateKey(self.ns, index, key_value)
        if old is not None:
            self._unindex(key, old)
        for index in self.indexes.values():
            if index.unique:
                for index_key, _ in index.keys_of(doc):
                    index.entries[index_key] = key
        self.docs[key] = doc
        return old

    def remove(self, key: Hashable) -> Document | None:
        old = self.docs.pop(key, None)
        if old is not None:
            self._unindex(key, old)
        return old

    def _unindex(self, key: Hashable, doc: Document) -> None:
        for index in self.indexes.values():
            if index.unique:
                for index_key, _ in index.keys_of(doc):
                    if index.entries.get(index_key) == key:
                        del index.entries[index_key]

    def add_index(self, index: IndexSpec) -> None:
        """Build ``index`` over the current documents; :class:`DuplicateKey` if unique and violated."""
        if index.unique:
            entries: dict[Hashable, Hashable] = {}
            for key, doc in self.docs.items():
                for index_key, values in index.keys_of(doc):
                    owner = entries.get(index_key, _MISSING)
                    if owner is not _MISSING and owner != key:
                        key_value = {path: _printable(v) for path, v in zip(index.key, values, strict=True)}
                        raise DuplicateKey(self.ns, index, key_value)
                    entries[index_key] = key
            index.entries = entries
        self.indexes[index.name] = index

    def copy_for_transaction(self, docs: OrderedDict[Hashable, Document]) -> Collection:
        clone = Collection(self.db, self.name, docs, options=self.options, coll_uuid=self.uuid, origin=self)
        docs.update(self.docs)
        clone.indexes = {name: index.copy() for name, index in self.indexes.items()}
        return clone

    def iter_docs(self) -> Iterator[Document]:
        return iter(list(self.docs.values()))


def _printable(value: Any) -> Any:
    return None if value is _UNDEFINED else value


class Catalog:
    """All namespaces of one view of the data: the server's main view or a transaction's copy.

    A transaction's catalog copies a collection from its parent on first access, so every read and
    write inside the transaction sees one stable state plus the transaction's own writes.
    """

    def __init__(self, parent: Catalog | None = None) -> None:
        self.engine: Any = engine.new_client()
        self.parent = parent
        self._collections: dict[tuple[str, str], Collection] = {}
        # Namespaces this transaction dropped or created, so parent copies are not re-fetched.
        self._hidden: set[tuple[str, str]] = set()
        self.created: list[tuple[str, str]] = []

    def _store_docs(self, db: str, name: str) -> OrderedDict[Hashable, Document]:
        store = self.engine._store[db][name]
        store._documents = OrderedDict()
        docs: OrderedDict[Hashable, Document] = store._documents
        return docs

    def get(self, db: str, name: str) -> Collection | None:
        coll = self._collections.get((db, name))
        if coll is not None or self.parent is None or (db, name) in self._hidden:
            return coll
        source = self.parent.get(db, name)
        if source is None:
            return None
        coll = source.copy_for_transaction(self._store_docs(db, name))
        self._collections[(db, name)] = coll
        return coll

    def touched(self) -> list[Collection]:
        """Collections this (transaction) catalog holds its own copy of."""
        return list(self._collections.values())

    def create(self, db: str, name: str, options: Document | None = None) -> Collection:
        if self.get(db, name) is not None:
            raise CommandError(48, f"Collection {db}.{name} already exists.")
        coll = Collection(db, name, self._store_docs(db, name), options=options)
        self._collections[(db, name)] = coll
        self._hidden.discard((db, name))
        if self.parent is not None:
            self.created.append((db, name))
        return coll

    def adopt(self, coll: Collection) -> None:
        """Install a collection built elsewhere (a transaction's new collection on commit)."""
        docs = self._store_docs(coll.db, coll.name)
        docs.update(coll.docs)
        coll.docs = docs
        coll.origin = None
        coll.base = {}
        self._collections[(coll.db, coll.name)] = coll

    def drop(self, db: str, name: str) -> Collection | None:
        coll = self.get(db, name)
        if coll is None:
            return None
        del self._collections[(db, name)]
        self.engine._store[db]._collections.pop(name, None)
        if self.parent is not None:
            self._hidden.add((db, name))
        return coll

    def rename(self, source: Collection, to_db: str, to_name: str) -> Collection:
        del self._collections[(source.db, source.name)]
        self.engine._store[source.db]._collections.pop(source.name, None)
        target = Collection(
            to_db, to_name, self._store_docs(to_db, to_name), options=source.options, coll_uuid=source.uuid
        )
        target.docs.update(source.docs)
        target.indexes = source.indexes
        # A move to another database is a copy there: MongoDB gives the copy a new UUID.
        if to_db != source.db:
            target.uuid = new_uuid()
        self._collections[(to_db, to_name)] = target
        return target

    def databases(self) -> list[str]:
        names = {db for db, _ in self._collections}
        if self.parent is not None:
            names.update(self.parent.databases())
        return sorted(names)

    def collections(self, db: str) -> list[Collection]:
        names = {name for d, name in self._collections if d == db}
        if self.parent is not None:
            names.update(c.name for c in self.parent.collections(db) if (db, c.name) not in self._hidden)
        found = [self.get(db, name) for name in sorted(names)]
        return [c for c in found if c is not None]
