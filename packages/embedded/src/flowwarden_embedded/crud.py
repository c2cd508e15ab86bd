"""Document reads and writes with MongoDB's semantics and reply shapes.

Every function here works on a :class:`Scope`: the catalog to read and write (the server's, or a
transaction's copy) and where the oplog entries of successful writes go. A write reports each
document change through ``scope.emit`` right after it is stored, one op per document, so a batch
that fails half-way has logged exactly the documents it changed.

Filter matching and aggregation stages come from the query engine, and what an update makes of a
document from :mod:`~flowwarden_embedded.document_updates`; this module adds what MongoDB
does around them: ``_id`` first, unique indexes, upserts, write errors with their indexes, ordered
and unordered batches, and the 16 MiB document limit. A write that would store a document over the
limit fails before that document is stored or logged.

A plain (non-transactional) write never changes a document an open transaction has written: the
statement raises :class:`TransactionLocked` before it changes anything, and the command runs it
again once that transaction has ended, which is how mongod makes such a write wait. Reads of a
view run the view's pipeline over the collection it is on (:mod:`~flowwarden_embedded.views`).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass
from typing import Any

from bson import Decimal128, ObjectId

from flowwarden_embedded import engine, views
from flowwarden_embedded.document_updates import (
    apply_update,
    is_replacement,
    upsert_seed,
    validate_update,
)
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.keys import value_key
from flowwarden_embedded.limits import MAX_BSON_OBJECT_SIZE
from flowwarden_embedded.oplog import OplogOp
from flowwarden_embedded.rawstrings import encode
from flowwarden_embedded.storage import Catalog, Collection, Document, DuplicateKey

_ENGINE_ERRORS = engine.ENGINE_ERRORS
# Stages that make the pipeline's documents themselves: only ever its first stage.
FIRST_STAGES = frozenset({"$changeStream", "$collStats", "$currentOp"})


def write_conflict() -> CommandError:
    return CommandError(
        112,
        "Caused by :: Write conflict during plan execution and yielding is disabled. :: "
        "Please retry your operation or multi-document transaction.",
        labels=["TransientTransactionError"],
    )


class TransactionLocked(Exception):
    """A plain write met a document an open transaction has written; raised before the statement
    changed anything, so the statement can run again once that transaction ends."""

    def __init__(self, ns: str, key: Hashable) -> None:
        super().__init__(f"{ns}: document {key!r} is written by an open transaction")
        self.ns = ns
        self.key = key


@dataclass(slots=True)
class Scope:
    """Where one command reads and writes, and where the oplog ops of its writes go.

    ``txn_id`` is set inside a transaction: a first write to a document then claims it, and fails
    with WriteConflict when another transaction holds it or a commit changed it since the
    transaction's snapshot, as MongoDB's snapshot isolation does. Outside a transaction, a write
    to a document a transaction holds raises :class:`TransactionLocked` instead.
    """

    catalog: Catalog
    emit: Callable[[OplogOp], None]
    txn_id: int | None = None

    def check_unlocked(self, coll: Collection, keys: Iterable[Hashable]) -> None:
        """Outside a transaction: raise :class:`TransactionLocked` if a transaction holds any of ``keys``."""
        locks = coll.locks
        if self.txn_id is not None or not locks:
            return
        for key in keys:
            if key in locks:
                raise TransactionLocked(coll.ns, key)

    def claim(self, coll: Collection, key: Hashable) -> None:
        if self.txn_id is None:
            self.check_unlocked(coll, (key,))
            return
        if coll.origin is None or key in coll.base:
            return
        main = coll.origin
        current = coll.docs.get(key)
        if main.docs.get(key) is not current:
            raise write_conflict()
        owner = main.locks.get(key)
        if owner is not None and owner != self.txn_id:
            raise write_conflict()
        main.locks[key] = self.txn_id
        coll.base[key] = current


# ---------------------------------------------------------------------------------------------
# reads


def _is_plain_value(value: Any) -> bool:
    return not (isinstance(value, dict) and any(str(k).startswith("$") for k in value))


def select(
    coll: Collection | None,
    query: Document | None,
    sort: Document | None = None,
    skip: int = 0,
    limit: int = 0,
) -> list[Document]:
    """The stored documents matching ``query`` in ``sort`` order, sliced by skip and limit.

    The returned dicts are the stored ones (never mutated by the storage), not copies.
    """
    if coll is None:
        if query:
            _validate_filter(query)
        return []
    query = _checked_filter(query)
    try:
        if len(query) == 1 and "_id" in query and _is_plain_value(query["_id"]):
            found = coll.docs.get(value_key(query["_id"]))
            docs = [found] if found is not None else []
        elif query:
            docs = [doc for doc in coll.docs.values() if engine.matches(query, doc)]
        else:
            docs = list(coll.docs.values())
    except _ENGINE_ERRORS as exc:
        raise engine.command_error(exc) from None
    return _ordered(docs, sort, skip, limit)


def select_in(
    catalog: Catalog,
    db: str,
    name: str,
    query: Document | None,
    sort: Document | None = None,
    skip: int = 0,
    limit: int = 0,
) -> list[Document]:
    """:func:`select` on a collection or a view: a view's filter, sort, skip and limit apply to
    what its pipeline outputs, as mongod appends them to the view's pipeline."""
    shown = view_documents(catalog, db, name)
    if shown is None:
        return select(catalog.get(db, name), query, sort, skip, limit)
    return select_from(shown, query, sort, skip, limit)


def select_from(
    docs: list[Document],
    query: Document | None,
    sort: Document | None = None,
    skip: int = 0,
    limit: int = 0,
) -> list[Document]:
    """:func:`select` on documents no collection holds: a view's output, or ``config.shards`` as
    a mongos answers it."""
    query = _checked_filter(query)
    if query:
        try:
            docs = [doc for doc in docs if engine.matches(query, doc)]
        except _ENGINE_ERRORS as exc:
            raise engine.command_error(exc) from None
    return _ordered(docs, sort, skip, limit)


def _checked_filter(query: Any) -> Document:
    query = query or {}
    if not isinstance(query, dict):
        raise CommandError(
            14, "BSON field 'filter' is the wrong type, expected type 'object'", code_name=None
        )
    return query


def _ordered(docs: list[Document], sort: Document | None, skip: int, limit: int) -> list[Document]:
    if sort:
        docs = sort_documents(docs, sort)
    if skip:
        docs = docs[skip:]
    if limit:
        docs = docs[: abs(limit)]
    return docs


def view_documents(catalog: Catalog, db: str, name: str) -> list[Document] | None:
    """What view ``db.name`` shows (its chain's pipeline over the collection it ends at); None
    when ``name`` is not a view."""
    resolved = views.resolve(catalog, db, name)
    if resolved is None:
        return None
    source, stages = resolved
    return _run_stages(catalog, db, source, stages)


def _validate_filter(query: Document) -> None:
    try:
        engine.matches(query, {})
    except _ENGINE_ERRORS as exc:
        raise engine.command_error(exc) from None


def natural_direction(value: Any) -> int:
    """The direction of a ``$natural`` sort or hint: 1 or -1, as MongoDB (7.0+) accepts no other
    value (BadValue for 2, 0, 1.1, "1"...)."""
    if not isinstance(value, bool) and isinstance(value, (int, float, Decimal128)):
        number = value.to_decimal() if isinstance(value, Decimal128) else value
        if number in (1, -1):
            return 1 if number == 1 else -1
    raise CommandError(2, f"$natural must be 1 or -1, not {value!r}", code_name="BadValue")


def sort_documents(docs: list[Document], sort: Document) -> list[Document]:
    for key, direction in reversed(list(sort.items())):
        if isinstance(direction, dict):
            raise CommandError(2, f"$meta sort by {direction} is not supported by the embedded replica set")
        if key == "$natural":
            if natural_direction(direction) < 0:
                docs = list(reversed(docs))
            continue
        if direction not in (1, -1):
            raise CommandError(15974, "Illegal key in $sort specification: " + f"{key}: {direction!r}")
        docs = sorted(docs, key=functools.partial(_sort_key, key), reverse=direction < 0)
    return docs


def _sort_key(path: str, doc: Document) -> Any:
    return engine.sort_key(path, doc)


def project(tools: Any, docs: Iterable[Document], projection: Document | None) -> list[Document]:
    """Apply a find projection; without one the stored documents are returned as they are."""
    if not projection:
        return list(docs)
    try:
        return [engine.project(tools, doc, projection) for doc in docs]
    except _ENGINE_ERRORS as exc:
        raise engine.command_error(exc, 2) from None


def distinct(catalog: Catalog, db: str, name: str, key: str, query: Document | None) -> list[Any]:
    """The distinct values of ``key`` in the matching documents of a collection or view."""
    values: list[Any] = []
    seen: set[Hashable] = set()
    for doc in select_in(catalog, db, name, query):
        try:
            found = engine.dotted_values(doc, key)
        except KeyError:
            continue
        for value in found if isinstance(found, list) else [found]:
            marker = value_key(value)
            if marker not in seen:
                seen.add(marker)
                values.append(value)
    return values


def run_pipeline(
    catalog: Catalog, db: str, coll_name: str | None, pipeline: list[Document]
) -> list[Document]:
    """An ordinary (non change-stream) aggregation over a collection or a view, or over nothing
    for ``aggregate: 1``. A view's own pipeline runs first."""
    pipeline = _checked_stages(pipeline)
    if coll_name is not None:
        resolved = views.resolve(catalog, db, coll_name)
        if resolved is not None:
            coll_name, stages = resolved
            pipeline = _checked_stages(stages) + pipeline
    return _run_stages(catalog, db, coll_name, pipeline)


def _checked_stages(pipeline: list[Document]) -> list[Document]:
    """The stages of an ordinary aggregation, checked as MongoDB checks them; a ``$sample`` is
    given to the engine as a copy holding its size as an int (the engine consumes its spec)."""
    checked = []
    for stage in pipeline:
        if not isinstance(stage, dict) or len(stage) != 1:
            raise CommandError(40323, "A pipeline stage specification object must contain exactly one field.")
        (name,) = stage
        if name in ("$out", "$merge"):
            raise CommandError(
                2, f"{name} is not supported by the embedded replica set; read the results and write them"
            )
        if name in FIRST_STAGES:
            raise CommandError(40602, f"{name} is only valid as the first stage in a pipeline.")
        if name == "$sample":
            stage = {"$sample": {"size": _sample_size(stage["$sample"])}}
        checked.append(stage)
    return checked


def _sample_size(spec: Any) -> int:
    """The size of a ``$sample`` stage, with MongoDB's errors (a double's fraction is dropped)."""
    if not isinstance(spec, dict):
        raise CommandError(28745, "the $sample stage specification must be an object")
    size: int | None = None
    for field, value in spec.items():
        if field != "size":
            raise CommandError(28748, f"unrecognized option to $sample: {field}")
        if isinstance(value, bool) or not isinstance(value, (int, float, Decimal128)):
            raise CommandError(28746, "size argument to $sample must be a number")
        number = float(value.to_decimal()) if isinstance(value, Decimal128) else value
        if number != number:  # NaN converts to 0, as numberLong() does
            number = 0
        size = int(max(min(number, 2**63 - 1), -(2**63)))
        if size < 0:
            raise CommandError(28747, "size argument to $sample must not be negative")
    if size is None:
        raise CommandError(28749, "$sample stage must specify a size")
    return size


def run_pipeline_over(
    catalog: Catalog, db: str, docs: list[Document], pipeline: list[Document]
) -> list[Document]:
    """The rest of a pipeline whose first stage made ``docs`` (``$collStats``, ``$currentOp``)."""
    if not pipeline:
        return docs
    pipeline = _checked_stages(pipeline)
    try:
        return list(engine.run_stages(docs, catalog.engine[db], pipeline))
    except CommandError:
        raise
    except _ENGINE_ERRORS as exc:
        raise engine.command_error(exc, 2) from None


def _run_stages(catalog: Catalog, db: str, coll_name: str | None, pipeline: list[Document]) -> list[Document]:
    engine_db = catalog.engine[db]
    try:
        if coll_name is None:
            result = engine.run_stages([], engine_db, pipeline)
        else:
            source = catalog.get(db, coll_name)
            docs = [copy.deepcopy(doc) for doc in source.docs.values()] if source is not None else []
            result = engine.run_stages(docs, engine_db, pipeline)
        return list(result)
    except CommandError:
        raise
    except _ENGINE_ERRORS as exc:
        raise engine.command_error(exc, 2) from None


# ---------------------------------------------------------------------------------------------
# writes


def id_first(doc: Document) -> Document:
    """``doc`` with ``_id`` as its first field (generated when missing), as MongoDB stores it."""
    if "_id" not in doc:
        return {"_id": ObjectId(), **doc}
    if next(iter(doc)) != "_id":
        return {"_id": doc["_id"], **{k: v for k, v in doc.items() if k != "_id"}}
    return doc


def _validate_new_document(doc: Document) -> None:
    _id = doc.get("_id")
    if isinstance(_id, list):
        raise CommandError(53, "The '_id' value cannot be of type array", code_name="InvalidIdField")
    if isinstance(_id, dict) and any(str(k).startswith("$") for k in _id):
        raise CommandError(
            52,
            f"_id fields may not contain '$'-prefixed fields: {next(iter(_id))} is not valid for storage.",
            code_name="DollarPrefixedFieldName",
        )


def _bson_size(doc: Document) -> int:
    return len(encode(doc))


def _check_inserted_size(doc: Document) -> None:
    size = _bson_size(doc)
    if size > MAX_BSON_OBJECT_SIZE:
        raise CommandError(
            2, f"object to insert too large. size in bytes: {size}, max size: {MAX_BSON_OBJECT_SIZE}"
        )


def _check_updated_size(doc: Document) -> None:
    if _bson_size(doc) > MAX_BSON_OBJECT_SIZE:
        raise CommandError(17419, f"Resulting document after update is larger than {MAX_BSON_OBJECT_SIZE}")


def _check_upserted_size(doc: Document) -> None:
    if _bson_size(doc) > MAX_BSON_OBJECT_SIZE:
        raise CommandError(17420, f"Document to upsert is larger than {MAX_BSON_OBJECT_SIZE}")


def ensure_collection(scope: Scope, db: str, name: str) -> Collection:
    """The collection, created (and logged as MongoDB logs an implicit create) when missing."""
    coll = scope.catalog.get(db, name)
    if coll is not None:
        return coll
    validate_collection_name(db, name)
    coll = scope.catalog.create(db, name)
    scope.emit(
        OplogOp(
            "create",
            db,
            name,
            description={"idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}},
        )
    )
    return coll


def validate_collection_name(db: str, name: str) -> None:
    if not isinstance(name, str) or not name or "$" in name or "\x00" in name or name.startswith("."):
        raise CommandError(73, f"Invalid namespace specified '{db}.{name}'", code_name="InvalidNamespace")
    if name.startswith("system.") and name not in ("system.js", "system.views", "system.profile"):
        raise CommandError(73, f"Invalid system namespace: {db}.{name}", code_name="InvalidNamespace")


def pre_image_recorded(coll: Collection) -> bool:
    setting = coll.options.get("changeStreamPreAndPostImages")
    return isinstance(setting, dict) and bool(setting.get("enabled"))


def insert_documents(
    scope: Scope, db: str, name: str, documents: list[Document], *, ordered: bool = True
) -> tuple[int, list[Document]]:
    """Insert a batch; returns ``(n inserted, writeErrors)``. Ordered batches stop at the first error.

    Outside a transaction the whole batch waits (:class:`TransactionLocked`, before anything is
    inserted) while an open transaction holds one of the ``_id`` values it inserts.
    """
    coll = ensure_collection(scope, db, name)
    if coll.locks and scope.txn_id is None:
        scope.check_unlocked(
            coll, [value_key(raw["_id"]) for raw in documents if isinstance(raw, dict) and "_id" in raw]
        )
    inserted = 0
    errors: list[Document] = []
    emit = scope.emit
    in_txn = scope.txn_id is not None
    docs = coll.docs
    has_unique = any(index.unique for index in coll.indexes.values())
    for position, raw in enumerate(documents):
        try:
            if not isinstance(raw, dict):
                raise CommandError(14, "documents must be objects")
            # The size as sent, before a generated _id: what MongoDB measures.
            _check_inserted_size(raw)
            doc = id_first(raw)
            _id = doc["_id"]
            if type(_id) in (list, dict):
                _validate_new_document(doc)
            key = value_key(_id)
            if key in docs:
                raise DuplicateKey(coll.ns, coll.indexes["_id_"], {"_id": _id})
            if in_txn:
                scope.claim(coll, key)
            if has_unique:
                coll.put(key, doc)
            else:
                docs[key] = doc
        except DuplicateKey as dup:
            errors.append(dup.write_error(position))
        except CommandError as exc:
            if exc.code == 112:
                raise
            errors.append({"index": position, "code": exc.code, "errmsg": exc.errmsg})
        else:
            inserted += 1
            emit(OplogOp("insert", db, name, document_key={"_id": _id}, after=doc))
            continue
        if ordered:
            break
    return inserted, errors


@dataclass(slots=True)
class UpdateResult:
    matched: int = 0
    modified: int = 0
    upserted_id: Any = None
    upserted: bool = False
    before: Document | None = None
    after: Document | None = None


def update_one_statement(
    scope: Scope,
    db: str,
    name: str,
    query: Document,
    update: Any,
    *,
    multi: bool,
    upsert: bool,
    array_filters: list[Document] | None = None,
    sort: Document | None = None,
) -> UpdateResult:
    """One update statement (one entry of an ``update`` command, or findAndModify's update).

    Outside a transaction it raises :class:`TransactionLocked` before changing anything while an
    open transaction holds a document it matches (or the ``_id`` an upsert would insert).
    """
    validate_update(update)
    if multi and is_replacement(update) and update:
        raise CommandError(9, "multi update is not supported for replacement-style update")
    coll = scope.catalog.get(db, name)
    result = UpdateResult()
    matches = select(coll, query, sort=sort, limit=0 if multi else 1)
    if coll is not None and coll.locks:
        scope.check_unlocked(coll, [value_key(old["_id"]) for old in matches])
    tools = scope.catalog.engine[db][name]
    replacement = is_replacement(update)
    for old in matches:
        assert coll is not None
        result.matched += 1
        new = apply_update(tools, old, query, update, inserting=False, array_filters=array_filters)
        result.before, result.after = old, new
        if new == old and list(new) == list(old):
            continue
        _check_updated_size(new)
        key = value_key(old["_id"])
        scope.claim(coll, key)
        coll.put(key, new)
        result.modified += 1
        scope.emit(
            OplogOp(
                "replace" if replacement else "update",
                db,
                name,
                document_key={"_id": old["_id"]},
                before=old,
                after=new,
                pre_image_recorded=pre_image_recorded(coll),
            )
        )
    if result.matched or not upsert:
        return result
    coll = ensure_collection(scope, db, name)
    if replacement:
        seed_id = upsert_seed(tools, query).get("_id")
        doc = dict(update)
        if "_id" not in doc and seed_id is not None:
            doc = {"_id": seed_id, **doc}
    else:
        seed = upsert_seed(tools, query)
        doc = apply_update(tools, seed, query, update, inserting=True, array_filters=array_filters)
    doc = id_first(doc)
    _validate_new_document(doc)
    _check_upserted_size(doc)
    key = value_key(doc["_id"])
    if key in coll.docs:
        raise DuplicateKey(coll.ns, coll.indexes["_id_"], {"_id": doc["_id"]})
    scope.claim(coll, key)
    coll.put(key, doc)
    result.upserted = True
    result.upserted_id = doc["_id"]
    result.after = doc
    scope.emit(OplogOp("insert", db, name, document_key={"_id": doc["_id"]}, after=doc))
    return result


def delete_statement(
    scope: Scope, db: str, name: str, query: Document, *, limit: int, sort: Document | None = None
) -> list[Document]:
    """Delete the matching documents (at most one when ``limit`` is 1); returns the deleted ones.

    Outside a transaction it raises :class:`TransactionLocked` before deleting anything while an
    open transaction holds a document it matches.
    """
    coll = scope.catalog.get(db, name)
    if coll is None:
        select(None, query)
        return []
    deleted = []
    matches = select(coll, query, sort=sort, limit=limit)
    if coll.locks:
        scope.check_unlocked(coll, [value_key(old["_id"]) for old in matches])
    for old in matches:
        key = value_key(old["_id"])
        scope.claim(coll, key)
        coll.remove(key)
        deleted.append(old)
        scope.emit(
            OplogOp(
                "delete",
                db,
                name,
                document_key={"_id": old["_id"]},
                before=old,
                pre_image_recorded=pre_image_recorded(coll),
            )
        )
    return deleted
