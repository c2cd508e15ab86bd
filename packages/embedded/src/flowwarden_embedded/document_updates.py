"""What an update statement makes of one document: replacements, update operators, pipelines.

:func:`validate_update` refuses a malformed update with MongoDB's codes before any document is
read; :func:`apply_update` computes the new document. Operators come from the query engine,
except ``$mul`` and ``$bit``, done here as MongoDB does them, and ``$[]``/``$[<id>]`` paths, which
are rewritten into concrete array indexes first. An upsert starts from :func:`upsert_seed`.

Hard rules: the old document is never modified (a new one is returned), and ``_id`` never
changes: an update that would alter it fails with ImmutableField (66).
"""

from __future__ import annotations

import copy
from typing import Any

from flowwarden_embedded import engine
from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.keys import value_key
from flowwarden_embedded.storage import Document

UPDATE_OPERATORS = frozenset(
    {
        "$set",
        "$unset",
        "$inc",
        "$mul",
        "$max",
        "$min",
        "$pop",
        "$rename",
        "$setOnInsert",
        "$currentDate",
        "$addToSet",
        "$pull",
        "$pullAll",
        "$push",
        "$bit",
    }
)
_OWN_OPERATORS = frozenset({"$mul", "$bit"})


def is_replacement(update: Any) -> bool:
    """True for a whole new document (no ``$`` operator at the top), as opposed to operators."""
    return isinstance(update, dict) and not any(str(k).startswith("$") for k in update)


def validate_update(update: Any) -> None:
    """Refuse a malformed update document or pipeline with MongoDB's code and message."""
    if isinstance(update, list):
        for stage in update:
            if not isinstance(stage, dict) or len(stage) != 1:
                raise CommandError(
                    40323, "A pipeline stage specification object must contain exactly one field."
                )
            (name,) = stage
            if name not in ("$addFields", "$set", "$project", "$unset", "$replaceRoot", "$replaceWith"):
                raise CommandError(
                    72,
                    f"{name} is not allowed to be used within an update",
                    code_name="InvalidOptions",
                )
        return
    if not isinstance(update, dict):
        raise CommandError(14, "Update argument must be either an object or an array")
    keys = list(update)
    dollar = [k for k in keys if k.startswith("$")]
    if dollar and len(dollar) != len(keys):
        plain = next(k for k in keys if not k.startswith("$"))
        raise CommandError(
            9,
            f"Unknown modifier: {plain}. Expected a valid update modifier or pipeline-style update "
            "specified as an array",
        )
    for op in dollar:
        if op not in UPDATE_OPERATORS:
            raise CommandError(
                9,
                f"Unknown modifier: {op}. Expected a valid update modifier or pipeline-style update "
                "specified as an array",
            )
        if not isinstance(update[op], dict):
            raise CommandError(
                9,
                f"Modifiers operate on fields but we found type {type(update[op]).__name__} instead. "
                f"For example: {{$mod: {{<field>: ...}}}} not {{{op}: {update[op]!r}}}",
            )
    if is_replacement(update):
        for key in keys:
            if key.startswith("$"):
                raise CommandError(52, f"The dollar ($) prefixed field '{key}' is not valid for storage.")


def _mul(doc: Any, name: str, value: Any) -> None:
    if isinstance(doc, dict):
        current = doc.get(name, 0)
        if current is None or isinstance(current, (str, dict, list, bool)):
            raise CommandError(
                14, f"Cannot apply $mul to a value of non-numeric type. {name} is not a number"
            )
        doc[name] = current * value
    elif isinstance(doc, list):
        doc[int(name)] = doc[int(name)] * value


def _bit(doc: Any, name: str, value: Any) -> None:
    if not isinstance(doc, dict):
        return
    current = doc.get(name, 0)
    if not isinstance(current, int) or isinstance(current, bool):
        raise CommandError(14, f"Cannot apply $bit to a value of non-integral type. {name} is not an integer")
    for op, operand in value.items():
        if op == "and":
            current &= operand
        elif op == "or":
            current |= operand
        elif op == "xor":
            current ^= operand
        else:
            raise CommandError(2, f"The $bit modifier only supports 'and', 'or', and 'xor', not '{op}'")
    doc[name] = current


def _expand_array_filters(doc: Document, update: Document, array_filters: list[Document] | None) -> Document:
    """Rewrite ``$[]`` and ``$[<id>]`` paths into the concrete array indexes they select in ``doc``."""
    filters: dict[str, Document] = {}
    for spec in array_filters or []:
        if not isinstance(spec, dict) or not spec:
            raise CommandError(9, "Cannot use an expression without a top-level field name in arrayFilters")
        for field_name, condition in spec.items():
            identifier, _, rest = field_name.partition(".")
            filters.setdefault(identifier, {})[rest or ""] = condition
    used: set[str] = set()
    out: Document = {}
    for op, fields in update.items():
        if not isinstance(fields, dict) or not any("$[" in path for path in fields):
            out[op] = fields
            continue
        expanded: Document = {}
        for path, value in fields.items():
            for concrete in _concrete_paths(doc, path.split("."), filters, used):
                expanded[concrete] = value
        out[op] = expanded
    unused = set(filters) - used
    if unused:
        name = sorted(unused)[0]
        raise CommandError(9, f"The array filter for identifier '{name}' was not used in the update { {} }")
    return out


def _element_matches(element: Any, conditions: Document) -> bool:
    for rest, condition in conditions.items():
        if rest == "":
            if not engine.matches({"v": condition}, {"v": element}):
                return False
        elif not isinstance(element, dict) or not engine.matches({rest: condition}, element):
            return False
    return True


def _concrete_paths(node: Any, parts: list[str], filters: dict[str, Document], used: set[str]) -> list[str]:
    if not parts:
        return [""]
    head, tail = parts[0], parts[1:]
    if head.startswith("$[") and head.endswith("]"):
        identifier = head[2:-1]
        if not isinstance(node, list):
            raise CommandError(
                2, f"The path '{head}' must exist in the document in order to apply array updates."
            )
        if identifier and identifier not in filters:
            raise CommandError(
                2, f"No array filter found for identifier '{identifier}' in path '{'.'.join(parts)}'"
            )
        if identifier:
            used.add(identifier)
        result = []
        for index, element in enumerate(node):
            if identifier and not _element_matches(element, filters[identifier]):
                continue
            for sub in _concrete_paths(element, tail, filters, used):
                result.append(f"{index}.{sub}" if sub else str(index))
        return result
    child = None
    if isinstance(node, dict):
        child = node.get(head)
    elif isinstance(node, list) and head.isdigit() and int(head) < len(node):
        child = node[int(head)]
    return [f"{head}.{sub}" if sub else head for sub in _concrete_paths(child, tail, filters, used)]


def apply_update(
    tools: Any,
    old: Document,
    query: Document,
    update: Any,
    *,
    inserting: bool,
    array_filters: list[Document] | None = None,
) -> Document:
    """The document ``update`` makes of ``old`` (``old`` itself is left untouched)."""
    if is_replacement(update):
        new = (
            {"_id": old["_id"], **{k: v for k, v in update.items() if k != "_id"}}
            if "_id" in old
            else dict(update)
        )
        if "_id" in update and "_id" in old and value_key(update["_id"]) != value_key(old["_id"]):
            raise _immutable_id(update["_id"])
        return copy.deepcopy(new)
    new = copy.deepcopy(old)
    try:
        if isinstance(update, list):
            engine.apply_update_pipeline(tools, new, update)
        else:
            if array_filters is not None or any(
                isinstance(fields, dict) and any("$[" in path for path in fields)
                for fields in update.values()
            ):
                update = _expand_array_filters(new, update, array_filters)
            own = {op: update[op] for op in _OWN_OPERATORS if op in update}
            rest = {op: fields for op, fields in update.items() if op not in _OWN_OPERATORS}
            if rest:
                engine.apply_update_document(tools, new, query, rest, inserting)
            for field_name, value in own.get("$mul", {}).items():
                engine.update_field(tools, new, field_name, value, _mul)
            for field_name, value in own.get("$bit", {}).items():
                engine.update_field(tools, new, field_name, value, _bit)
    except CommandError:
        raise
    except engine.ENGINE_ERRORS as exc:
        raise engine.command_error(exc, 2) from None
    if "_id" in old and ("_id" not in new or value_key(new["_id"]) != value_key(old["_id"])):
        raise _immutable_id(new.get("_id"))
    return new


def _immutable_id(value: Any) -> CommandError:
    return CommandError(
        66,
        "After applying the update, the (immutable) field '_id' was found to have been altered to "
        f"_id: {value!r}",
        code_name="ImmutableField",
    )


def upsert_seed(tools: Any, query: Document) -> Document:
    """The document an upsert starts from: the equality fields of ``query`` (and of its ``$and``)."""
    seed = {k: v for k, v in query.items() if not k.startswith("$")}
    for clause in query.get("$and", []) if isinstance(query.get("$and"), list) else []:
        if isinstance(clause, dict):
            seed.update({k: v for k, v in clause.items() if not k.startswith("$")})
    try:
        return engine.upsert_seed(tools, seed)
    except engine.ENGINE_ERRORS as exc:
        raise engine.command_error(exc, 2) from None
