"""Views: read-only namespaces that show a pipeline's output over another collection or view.

mongod keeps a database's view definitions as documents of its ``system.views`` collection,
``{_id: "<db>.<view>", viewOn: <name>, pipeline: [...]}``, and so does this module: creating a
view inserts its definition, ``collMod`` replaces it and ``drop`` deletes it. Those are ordinary
document writes, logged to the oplog as mongod logs them (the first view of a database also
creates ``system.views``), and change streams turn them into the view's DDL events.

Rules this module keeps, as mongod does:

* a view never holds documents: every write to one fails with CommandNotSupportedOnView (166);
* a read resolves the chain of views down to the collection it ends at, running the innermost
  view's pipeline first; a chain deeper than :data:`MAX_VIEW_DEPTH` fails with 149, and a
  definition that would make a chain loop is refused when it is made (160);
* the definition events (``create``, ``modify``, ``drop``) reach only database and cluster
  streams opened with ``showExpandedEvents``, and carry no ``collectionUUID``: views have none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.keys import value_key
from flowwarden_embedded.oplog import DOCUMENT_OPS, OplogOp, OplogRecord
from flowwarden_embedded.storage import Catalog, Document

if TYPE_CHECKING:
    from flowwarden_embedded.crud import Scope

VIEWS_COLLECTION = "system.views"
MAX_VIEW_DEPTH = 20
"""mongod's limit on how many views one read may pass through before reaching a collection."""

_ID_INDEX = {"v": 2, "key": {"_id": 1}, "name": "_id_"}
_EVENT_TYPES = {"insert": "create", "replace": "modify", "update": "modify", "delete": "drop"}


def not_a_collection(db: str, name: str) -> CommandError:
    """What mongod answers a write, an index command or a change stream addressed to a view."""
    return CommandError(
        166, f"Namespace {db}.{name} is a view, not a collection", code_name="CommandNotSupportedOnView"
    )


def definition(catalog: Catalog, db: str, name: str) -> Document | None:
    """The stored definition of view ``db.name``; None when no view has that name."""
    views = catalog.get(db, VIEWS_COLLECTION)
    if views is None or not views.docs:
        return None
    found = views.docs.get(value_key(f"{db}.{name}"))
    return found if found is not None and _well_formed(found) else None


def _well_formed(stored: Document) -> bool:
    """A ``system.views`` document that defines a view (a hand-written one may not)."""
    return isinstance(stored.get("viewOn"), str) and isinstance(stored.get("pipeline"), list)


def is_view(catalog: Catalog, db: str, name: str) -> bool:
    return definition(catalog, db, name) is not None


def definitions(catalog: Catalog, db: str) -> list[Document]:
    """Every view definition of ``db``, by view name."""
    views = catalog.get(db, VIEWS_COLLECTION)
    if views is None:
        return []
    prefix = f"{db}."
    found = [
        d
        for d in views.docs.values()
        if isinstance(d.get("_id"), str) and d["_id"].startswith(prefix) and _well_formed(d)
    ]
    return sorted(found, key=lambda d: str(d["_id"]))


def view_name(stored: Document) -> str:
    """The view's name (without its database) in a stored definition."""
    return str(stored["_id"]).partition(".")[2]


def resolve(catalog: Catalog, db: str, name: str) -> tuple[str, list[Document]] | None:
    """For a view: the collection its chain ends at and the pipeline of the whole chain, innermost
    view's stages first. None when ``name`` is not a view."""
    found = definition(catalog, db, name)
    if found is None:
        return None
    stages: list[Document] = []
    depth = 0
    source = name
    while found is not None:
        depth += 1
        if depth > MAX_VIEW_DEPTH:
            raise CommandError(
                149,
                f"View depth too deep or view cycle detected. Maximum depth is {MAX_VIEW_DEPTH}",
                code_name="ViewDepthLimitExceeded",
            )
        stages[:0] = found.get("pipeline") or []
        source = str(found["viewOn"])
        found = definition(catalog, db, source)
    return source, stages


def _check_chain(catalog: Catalog, db: str, name: str, view_on: str) -> None:
    """Refuse a definition of ``name`` on ``view_on`` that loops or nests too deep."""
    chain = [f"{db}.{name}"]
    current = view_on
    while True:
        chain.append(f"{db}.{current}")
        if current == name:
            raise CommandError(
                160, f"View cycle detected: [{' => '.join(chain)}]", code_name="GraphContainsCycle"
            )
        if len(chain) > MAX_VIEW_DEPTH + 1:
            raise CommandError(
                149,
                f"View depth too deep or view cycle detected. Maximum depth is {MAX_VIEW_DEPTH}",
                code_name="ViewDepthLimitExceeded",
            )
        found = definition(catalog, db, current)
        if found is None:
            return
        current = str(found["viewOn"])


def _stored(db: str, name: str, view_on: str, pipeline: list[Any], collation: Any) -> Document:
    stored: Document = {"_id": f"{db}.{name}", "viewOn": view_on, "pipeline": list(pipeline)}
    if collation is not None:
        stored["collation"] = collation
    return stored


def define(
    scope: Scope, db: str, name: str, view_on: str, pipeline: list[Any], collation: Any = None
) -> None:
    """Create view ``db.name``: store its definition, making ``system.views`` first if needed."""
    _check_chain(scope.catalog, db, name, view_on)
    views = scope.catalog.get(db, VIEWS_COLLECTION)
    if views is None:
        views = scope.catalog.create(db, VIEWS_COLLECTION)
        scope.emit(OplogOp("create", db, VIEWS_COLLECTION, description={"idIndex": dict(_ID_INDEX)}))
    stored = _stored(db, name, view_on, pipeline, collation)
    key = {"_id": stored["_id"]}
    views.put(value_key(stored["_id"]), stored)
    scope.emit(OplogOp("insert", db, VIEWS_COLLECTION, document_key=key, after=stored))


def redefine(scope: Scope, db: str, name: str, view_on: str | None, pipeline: list[Any] | None) -> None:
    """``collMod`` of a view: replace what it is on and/or its pipeline, keeping the rest."""
    old = definition(scope.catalog, db, name)
    views = scope.catalog.get(db, VIEWS_COLLECTION)
    assert old is not None and views is not None
    target = view_on if view_on is not None else str(old["viewOn"])
    _check_chain(scope.catalog, db, name, target)
    stored = _stored(
        db, name, target, pipeline if pipeline is not None else old["pipeline"], old.get("collation")
    )
    views.put(value_key(stored["_id"]), stored)
    # mongod logs the change as a whole replacement: change streams read the new definition from it.
    scope.emit(
        OplogOp(
            "replace", db, VIEWS_COLLECTION, document_key={"_id": stored["_id"]}, before=old, after=stored
        )
    )


def undefine(scope: Scope, db: str, name: str) -> bool:
    """Drop view ``db.name``; False when there is no such view."""
    views = scope.catalog.get(db, VIEWS_COLLECTION)
    if views is None:
        return False
    ns = f"{db}.{name}"
    old = views.remove(value_key(ns))
    if old is None:
        return False
    scope.emit(OplogOp("delete", db, VIEWS_COLLECTION, document_key={"_id": ns}, before=old))
    return True


def listing(stored: Document, name_only: bool) -> Document:
    """A view as ``listCollections`` shows it."""
    entry: Document = {"name": view_name(stored), "type": "view"}
    if name_only:
        return entry
    options: Document = {"viewOn": stored["viewOn"], "pipeline": stored["pipeline"]}
    if "collation" in stored:
        options["collation"] = stored["collation"]
    entry["options"] = options
    entry["info"] = {"readOnly": True}
    return entry


# ---------------------------------------------------------------------------------------------
# change events


def is_definition_write(record: OplogRecord) -> bool:
    """True for a write to a ``system.views`` document naming a view: the oplog records a
    database or cluster stream with ``showExpandedEvents`` turns into a view's DDL event."""
    if record.coll != VIEWS_COLLECTION or record.kind not in DOCUMENT_OPS:
        return False
    key = record.op.document_key or {}
    return isinstance(key.get("_id"), str) and "." in key["_id"]


def definition_event(record: OplogRecord) -> dict[str, Any]:
    """The view DDL event of a definition write (see :func:`is_definition_write`).

    Shaped as mongod builds it: an insert is the view's ``create`` (``operationDescription`` the
    definition without ``_id``, ``nsType: "view"``), a replacement its ``modify``, a delete its
    ``drop`` (no ``operationDescription``); ``ns`` names the view, and there is no
    ``collectionUUID``, ``lsid`` or ``txnNumber``.
    """
    op = record.op
    assert op.document_key is not None
    db, _, name = str(op.document_key["_id"]).partition(".")
    kind = _EVENT_TYPES[record.kind]
    event: dict[str, Any] = {
        "_id": record.token(),
        "operationType": kind,
        "clusterTime": record.ts,
        "wallTime": record.wall,
        "ns": {"db": db, "coll": name},
    }
    if kind != "drop":
        event["operationDescription"] = {k: v for k, v in (op.after or {}).items() if k != "_id"}
    if kind == "create":
        event["nsType"] = "view"
    return event
