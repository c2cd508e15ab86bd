"""The query engine behind the embedded replica set's data semantics, behind typed functions.

Filter matching, sort keys, dotted-path reads and aggregation stages are delegated to mongomock;
every call into it goes through here so the rest of the server stays typed and one module owns
the dependency.

mongomock is a fake client, not a query library: what the server needs of it (update operators
applied to one document, one expression evaluated, the BSON type order) is only reachable through
its private functions, listed in :data:`_PRIVATE_API`. That is why the ``embedded`` extra pins the
one mongomock release they are checked against (4.3.0; 4.2 lacks ``_apply_update_document``), and
why importing this module with another release that lacks one fails at once, naming it.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import re
from collections.abc import Mapping
from typing import Any

import mongomock
from bson import Binary, Code, Decimal128, Int64, MaxKey, MinKey, ObjectId, Regex, Timestamp
from bson.datetime_ms import DatetimeMS
from mongomock import aggregate as _aggregate
from mongomock import collection as _collection
from mongomock import filtering as _filtering
from mongomock import helpers as _helpers

from flowwarden_embedded.errors import CommandError
from flowwarden_embedded.hashing import hashed_index_key
from flowwarden_embedded.rawstrings import encode

Document = dict[str, Any]

ENGINE_ERRORS: tuple[type[BaseException], ...] = (
    mongomock.OperationFailure,
    ValueError,
    TypeError,
    KeyError,
    IndexError,
    AttributeError,
    NotImplementedError,
)
"""What the engine raises for a request it rejects; the server answers these as command errors."""


def command_error(exc: BaseException, code: int = 2) -> CommandError:
    """A query-engine exception as the command error MongoDB gives for the same mistake."""
    if isinstance(exc, CommandError):
        return exc
    found = getattr(exc, "code", None)
    message = exc.args[0] if exc.args and isinstance(exc.args[0], str) else str(exc)
    if isinstance(found, int) and found > 0:
        code = found
    return CommandError(code, message)


_PRIVATE_API: dict[Any, tuple[str, ...]] = {
    _filtering: (
        "_get_compare_type",
        "_combine_regex_options",
        "filter_applies",
        "resolve_sort_key",
        "_filterer_inst",
        "NOTHING",
    ),
    _helpers: ("get_value_by_dot",),
    _aggregate: ("_parse_expression", "process_pipeline", "_Parser"),
    _collection: ("BSON",),
    mongomock.Collection: (
        "_apply_update_document",
        "_apply_update_pipeline",
        "_update_document_single_field",
        "_copy_only_fields",
        "_expand_dots",
        "_discard_operators",
    ),
}
"""The mongomock functions this module calls (or, for ``_get_compare_type`` and
``_combine_regex_options``, extends)."""


def _check_private_api() -> None:
    missing = [
        f"{owner.__name__}.{name}"
        for owner, names in _PRIVATE_API.items()
        for name in names
        if not hasattr(owner, name)
    ]
    if missing:
        version = importlib.metadata.version("mongomock")
        raise ImportError(
            f"mongomock {version} lacks {', '.join(missing)}, which EmbeddedReplicaSet uses; "
            'install the release flowwarden-embedded pins: pip install "flowwarden-embedded"'
        )


_check_private_api()


def _extend_type_order() -> None:
    """Teach the engine's BSON comparison order the types it does not know.

    Without this, a filter such as ``{ts: {$gt: Timestamp(...)}}`` (how clients read the oplog
    window) fails. Only values that made the engine raise before get an order, at MongoDB's
    places: MinKey first, Timestamp between Date and Regex, MaxKey last.

    Why a replacement and not a hook: mongomock has no public way to register a type's order.
    ``bson_compare`` and ``BsonComparable`` (filters, sorts, ``$sort`` and ``$group`` stages) look
    ``_get_compare_type`` up in their module on every call, so replacing the module attribute
    reaches all of them; the original still answers for every type it knew.
    """
    original = _filtering._get_compare_type
    if getattr(original, "_flowwarden_extended", False):
        return

    def compare_type(value: Any) -> Any:
        if isinstance(value, Timestamp):
            return 47
        if isinstance(value, MinKey):
            return -1
        if isinstance(value, MaxKey):
            return 127
        return original(value)  # type: ignore[no-untyped-call]

    compare_type._flowwarden_extended = True  # type: ignore[attr-defined]
    _filtering._get_compare_type = compare_type


_extend_type_order()


# $type's aliases and numeric codes, as MongoDB names them; a test of the value for each.
_TYPE_CODES = {
    1: "double", 2: "string", 3: "object", 4: "array", 5: "binData", 6: "undefined", 7: "objectId",
    8: "bool", 9: "date", 10: "null", 11: "regex", 12: "dbPointer", 13: "javascript", 14: "symbol",
    15: "javascriptWithScope", 16: "int", 17: "timestamp", 18: "long", 19: "decimal", -1: "minKey",
    127: "maxKey",
}  # fmt: skip
_INT32 = range(-(2**31), 2**31)


def _is_int32(value: Any) -> bool:
    return type(value) is int and value in _INT32


def _is_int64(value: Any) -> bool:
    return isinstance(value, Int64) or (type(value) is int and value not in _INT32)


_TYPE_TESTS: dict[str, Any] = {
    "double": lambda v: isinstance(v, float),
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, Mapping),
    "array": lambda v: isinstance(v, (list, tuple)),
    "binData": lambda v: isinstance(v, (bytes, Binary)),
    "undefined": lambda v: False,
    "objectId": lambda v: isinstance(v, ObjectId),
    "bool": lambda v: isinstance(v, bool),
    "date": lambda v: isinstance(v, (datetime.datetime, DatetimeMS)),
    "null": lambda v: v is None,
    "regex": lambda v: isinstance(v, (Regex, re.Pattern)),
    "dbPointer": lambda v: False,
    "javascript": lambda v: isinstance(v, Code) and v.scope is None,
    "symbol": lambda v: False,  # PyMongo decodes symbols as str
    "javascriptWithScope": lambda v: isinstance(v, Code) and v.scope is not None,
    "int": _is_int32,
    "timestamp": lambda v: isinstance(v, Timestamp),
    "long": _is_int64,
    "decimal": lambda v: isinstance(v, Decimal128),
    "number": lambda v: isinstance(v, (float, Decimal128)) or _is_int32(v) or _is_int64(v),
    "minKey": lambda v: isinstance(v, MinKey),
    "maxKey": lambda v: isinstance(v, MaxKey),
}


def _extend_type_operator() -> None:
    """``$type`` as MongoDB takes it: an alias or a numeric code, or an array of them (any one
    matches), for every BSON type (mongomock knows neither arrays nor null, regex, timestamp,
    minKey, maxKey...). An array field also matches when one of its elements does.

    Why a replacement: the engine's filter operators live in one dict of its module's filterer
    instance, looked up on every filter; replacing the ``$type`` entry reaches every query.
    """
    operators = _filtering._filterer_inst._operator_map
    if getattr(operators["$type"], "_flowwarden_extended", False):
        return

    def tests_for(search: Any) -> list[Any]:
        wanted = list(search) if isinstance(search, (list, tuple)) else [search]
        tests = []
        for item in wanted:
            name = _TYPE_CODES.get(item) if isinstance(item, int) and not isinstance(item, bool) else item
            if not isinstance(name, str) or name not in _TYPE_TESTS:
                raise CommandError(2, f"Unknown type name alias: {item}", code_name="BadValue")
            tests.append(_TYPE_TESTS[name])
        return tests

    nothing = _filtering.NOTHING  # type: ignore[attr-defined]  # mongomock's "no such field"

    def type_operator(value: Any, search: Any) -> bool:
        if value is nothing:
            return False
        tests = tests_for(search)
        if any(test(value) for test in tests):
            return True
        return isinstance(value, (list, tuple)) and any(test(item) for item in value for test in tests)

    type_operator._flowwarden_extended = True  # type: ignore[attr-defined]
    operators["$type"] = type_operator


_extend_type_operator()


REGEX_OPTIONS = "imsux"
"""The ``$options`` letters mongod takes (``u`` is accepted and changes nothing: its regular
expressions are UTF-8 anyway)."""


def _refuse_unknown_regex_options() -> None:
    """``$regex`` with ``$options`` as mongod takes it: a letter outside :data:`REGEX_OPTIONS` is
    refused (Location51108), where the engine would skip it and match as if it were not there.

    Why a replacement: the engine combines ``$options`` into the pattern in one module function,
    looked up on every filter that has both; wrapping it reaches every query.
    """
    original = _filtering._combine_regex_options
    if getattr(original, "_flowwarden_checked", False):
        return

    def combine(search: Any) -> Any:
        options = search["$options"]
        if isinstance(options, str):  # another type: the engine's own error
            for letter in options:
                if letter not in REGEX_OPTIONS:
                    raise CommandError(
                        51108, f"invalid flag in regex options: {letter}", code_name="Location51108"
                    )
        return original(search)  # type: ignore[no-untyped-call]

    combine._flowwarden_checked = True  # type: ignore[attr-defined]
    _filtering._combine_regex_options = combine


_refuse_unknown_regex_options()


def _extend_expressions() -> None:
    """Teach the engine's expression parser what MongoDB has and it lacks or gets wrong:
    ``$toHashedIndexKey`` (MongoDB 7.0+); ``$type`` and ``$mergeObjects`` as expressions;
    ``$regexMatch`` of a null or missing input, which MongoDB answers false (the engine raises);
    ``$not`` of its one-element argument list (the engine negates the list, which is always true);
    and ``$mod`` of two integers, which it computes in floating point (so the remainder of a
    64-bit hash came out wrong).

    Every aggregation expression (``$expr`` in a filter, ``$addFields``, ``$project``) goes through
    ``_Parser.parse``; the replacement answers those and hands everything else (``$mod`` of
    doubles included) to the original. A missing operand hashes as null.
    """
    original = _aggregate._Parser.parse
    if getattr(original, "_flowwarden_extended", False):
        return

    def operand(parser: Any, expression: Any) -> Any:
        """The value of ``expression``, or ``_MISSING_VALUE`` for a field that is not there."""
        try:
            return parser.parse(expression)
        except KeyError:
            return _MISSING_VALUE

    def parse(self: Any, expression: Any) -> Any:
        if isinstance(expression, dict) and len(expression) == 1:
            if "$toHashedIndexKey" in expression:
                value = operand(self, expression["$toHashedIndexKey"])
                return hashed_index_key(None if value is _MISSING_VALUE else value)
            if "$type" in expression:
                return expression_type(operand(self, _single_argument(expression["$type"], "$type")))
            if "$mergeObjects" in expression:
                arguments = expression["$mergeObjects"]
                if not isinstance(arguments, list):
                    arguments = [arguments]
                return merge_objects([operand(self, argument) for argument in arguments])
            negated = expression.get("$not")
            if isinstance(negated, list) and len(negated) == 1:
                # {$not: [<expression>]}: the engine takes the list itself for the operand.
                return not _expression_truth(operand(self, negated[0]))
            spec = expression.get("$regexMatch")
            if isinstance(spec, dict) and "input" in spec:
                value = operand(self, spec["input"])
                if value is None or value is _MISSING_VALUE:
                    return False
            operands = expression.get("$mod")
            if isinstance(operands, list) and len(operands) == 2:
                dividend, divisor = self.parse_many(operands)
                if _integer(dividend) and _integer(divisor):
                    return _integer_mod(dividend, divisor)
        return original(self, expression)  # type: ignore[no-untyped-call]

    parse._flowwarden_extended = True  # type: ignore[attr-defined]
    _aggregate._Parser.parse = parse  # type: ignore[method-assign]


_MISSING_VALUE: Any = object()

# $type's answer for each type, in an order where no test answers for a value an earlier one
# should have (bool before the numbers: a Python bool is an int).
_EXPRESSION_TYPES = (
    "bool", "int", "long", "double", "decimal", "string", "object", "array", "binData", "objectId",
    "date", "null", "regex", "javascript", "javascriptWithScope", "timestamp", "minKey", "maxKey",
)  # fmt: skip


def _single_argument(argument: Any, operator: str) -> Any:
    if isinstance(argument, list):
        if len(argument) != 1:
            raise CommandError(
                16020, f"Expression {operator} takes exactly 1 arguments. {len(argument)} were passed in."
            )
        return argument[0]
    return argument


def expression_type(value: Any) -> str:
    """The ``$type`` expression's answer: the BSON type alias of ``value``, ``"missing"`` for a
    field that is not there."""
    if value is _MISSING_VALUE:
        return "missing"
    for name in _EXPRESSION_TYPES:
        if _TYPE_TESTS[name](value):
            return name
    raise CommandError(2, f"$type cannot name the type of {value!r}")


def _expression_truth(value: Any) -> bool:
    """How an aggregation expression reads ``value`` as a condition: false, null, missing and
    zero are false; everything else (an empty string or array too) is true."""
    if value is _MISSING_VALUE or value is None or value is False:
        return False
    if isinstance(value, Decimal128):
        return bool(value.to_decimal() != 0)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value != 0
    return True


def merge_objects(values: list[Any]) -> dict[str, Any]:
    """``$mergeObjects``: the documents merged left to right; null and missing ones are skipped."""
    merged: dict[str, Any] = {}
    for value in values:
        if value is None or value is _MISSING_VALUE:
            continue
        if not isinstance(value, Mapping):
            raise CommandError(
                40400,
                f"$mergeObjects requires object inputs, but input {value!r} is of type "
                f"{expression_type(value)}",
            )
        merged.update(value)
    return merged


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _integer_mod(dividend: int, divisor: int) -> int:
    """``$mod`` of two integers as mongod computes it: exact, with the dividend's sign, a long
    when either operand is one."""
    if divisor == 0:
        raise CommandError(16610, "can't $mod by zero")
    remainder = abs(dividend) % abs(divisor)
    if dividend < 0:
        remainder = -remainder
    return Int64(remainder) if isinstance(dividend, Int64) or isinstance(divisor, Int64) else remainder


_extend_expressions()


class _EncodableCheck:
    """What mongomock's update code calls ``BSON.encode`` on, to check that a value it sets or a
    replacement it stores can be written as BSON."""

    @staticmethod
    def encode(document: Mapping[str, Any], check_keys: bool = False) -> bytes:
        return encode(document)


def _keep_text_as_sent() -> None:
    """Let updates set text that is not UTF-8 (see :mod:`~flowwarden_embedded.rawstrings`).

    Why a replacement: mongomock checks each ``$set`` value and each replacement document with
    ``bson.BSON.encode``, which refuses such text, and reads ``BSON`` from its module on every
    call; the server's encoder writes that text back as the bytes the client sent, as mongod
    stores it, and refuses what ``bson.encode`` refuses otherwise.
    """
    _collection.BSON = _EncodableCheck  # type: ignore[attr-defined,assignment]


_keep_text_as_sent()


def new_client() -> Any:
    """An empty engine client; its store holds the documents of one catalog."""
    return mongomock.MongoClient()


def matches(query: Mapping[str, Any], doc: Any) -> bool:
    """True when ``doc`` matches the MongoDB filter ``query`` (raises on an invalid filter)."""
    return bool(_filtering.filter_applies(query, doc))  # type: ignore[no-untyped-call]


def sort_key(path: str, doc: Document) -> Any:
    """The key MongoDB sorts ``doc`` by for ``path`` (missing sorts as null, arrays by first element)."""
    return _filtering.resolve_sort_key(path, doc)  # type: ignore[no-untyped-call]


def dotted_values(doc: Document, path: str) -> Any:
    """The value at a dotted path, arrays of subdocuments expanded; KeyError when absent."""
    return _helpers.get_value_by_dot(doc, path, can_generate_array=True)  # type: ignore[no-untyped-call]


def evaluate_expression(expr: Any, doc: Document) -> Any:
    """An aggregation expression's value on ``doc``; KeyError when it reads a missing field."""
    return _aggregate._parse_expression(expr, doc, ignore_missing_keys=True)  # type: ignore[no-untyped-call]


def run_stages(docs: list[Document], database: Any, pipeline: list[Document]) -> list[Document]:
    """Run aggregation ``pipeline`` over ``docs``; ``database`` resolves ``$lookup`` and friends."""
    return list(_aggregate.process_pipeline(docs, database, pipeline, None))  # type: ignore[no-untyped-call]


# The engine's update, projection and upsert logic lives on its collection objects; ``tools`` is
# such an object for the namespace being written (it reads no data of its own here).


def apply_update_document(
    tools: Any, doc: Document, query: Document, update: Document, inserting: bool
) -> None:
    """Apply update operators to ``doc`` in place (``inserting``: honour ``$setOnInsert``)."""
    tools._apply_update_document(doc, query, update, inserting)


def apply_update_pipeline(tools: Any, doc: Document, pipeline: list[Document]) -> None:
    """Apply a pipeline-style update to ``doc`` in place."""
    tools._apply_update_pipeline(doc, pipeline, None)


def update_field(tools: Any, doc: Document, path: str, value: Any, updater: Any) -> None:
    """Call ``updater(parent, last_part, value)`` on the parent of a dotted path (created as needed)."""
    tools._update_document_single_field(doc, path, value, updater)


def project(tools: Any, doc: Document, projection: Document) -> Document:
    """A copy of ``doc`` with a find projection applied."""
    result: Document = tools._copy_only_fields(doc, dict(projection), dict)
    return result


def upsert_seed(tools: Any, equalities: Document) -> Document:
    """The document an upsert starts from: the filter's equality fields, dotted paths expanded."""
    expanded = tools._expand_dots(equalities)
    seed, _ = tools._discard_operators(expanded)
    return dict(seed)
