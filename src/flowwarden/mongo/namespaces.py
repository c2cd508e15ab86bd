"""Which collections a database or cluster stream covers: ``collections`` and ``exclude_collections``.

Each entry is a name or, prefixed with ``re:``, a regular expression that must match the whole
name: a pattern is anchored at both ends, so ``re:order`` selects ``order`` and nothing else,
and ``re:order.*`` every name starting with ``order``. A database stream names its collections
(``orders``); a cluster stream names them with their database (``shop.orders``), and its
patterns match that ``db.coll`` text.

The rules this module keeps:

- the server filters: :meth:`NamespaceSelection.stage` is a ``$match`` on ``ns.coll`` (and
  ``ns.db`` for a cluster stream), run before any user stage, so events of collections left out
  never cross the network;
- events without a collection (dropDatabase, invalidate) always pass: the stream must see them;
- the initial snapshot copies exactly the collections whose events pass
  (:meth:`NamespaceSelection.selects` answers what the stage answers).

Nothing here runs per event.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

PATTERN_PREFIX = "re:"
"""An entry starting with this is a regular expression, not a name."""


def anchored(pattern: str) -> str:
    """``pattern`` made to match whole names only, the same way in Python and in MongoDB's PCRE."""
    return f"^(?:{pattern})$"


def is_pattern(entry: str) -> bool:
    return entry.startswith(PATTERN_PREFIX)


def pattern_of(entry: str) -> str:
    """The regular expression of a ``re:`` entry, anchored."""
    return anchored(entry[len(PATTERN_PREFIX) :])


def pattern_problem(entry: str) -> str | None:
    """Why a ``re:`` entry is not a regular expression (None when it is, or is a name)."""
    if not is_pattern(entry):
        return None
    body = entry[len(PATTERN_PREFIX) :]
    if not body:
        return f"{entry!r} has no pattern after 're:'"
    try:
        re.compile(anchored(body))
    except re.error as error:
        return f"{entry!r} is not a regular expression: {error}"
    return None


@dataclass(frozen=True)
class NamespaceSelection:
    """The collections a stream selects: ``include`` (None: every one) minus ``exclude``.

    ``cluster``: entries are ``db.coll`` names and patterns over that text, else collection
    names within the stream's database.
    """

    include: tuple[str, ...] | None
    exclude: tuple[str, ...]
    cluster: bool

    @property
    def selects_all(self) -> bool:
        return self.include is None and not self.exclude

    def stage(self) -> dict[str, Any] | None:
        """The ``$match`` stage that keeps the events of the selected collections and those
        without a collection; None when every collection is selected."""
        conditions: list[dict[str, Any]] = []
        if self.include is not None:
            conditions.append({"$or": [{"ns.coll": {"$exists": False}}, *self._matching(self.include)]})
        if self.exclude:
            conditions.append({"$nor": self._matching(self.exclude)})
        if not conditions:
            return None
        return {"$match": conditions[0] if len(conditions) == 1 else {"$and": conditions}}

    def _matching(self, entries: Iterable[str]) -> list[dict[str, Any]]:
        """One query per way an event's namespace can match one of ``entries``."""
        names = [entry for entry in entries if not is_pattern(entry)]
        patterns = [pattern_of(entry) for entry in entries if is_pattern(entry)]
        queries: list[dict[str, Any]] = []
        if self.cluster:
            for name in names:
                database, _, collection = name.partition(".")
                queries.append({"ns.db": database, "ns.coll": collection})
            full_name = {"$concat": ["$ns.db", ".", "$ns.coll"]}
            queries.extend(
                {"$expr": {"$regexMatch": {"input": full_name, "regex": pattern}}} for pattern in patterns
            )
        else:
            if names:
                queries.append({"ns.coll": {"$in": names}})
            queries.extend({"ns.coll": {"$regex": pattern}} for pattern in patterns)
        return queries

    def selects(self, database: str, collection: str) -> bool:
        """Whether the stream covers ``database.collection`` (what :meth:`stage` lets through)."""
        name = f"{database}.{collection}" if self.cluster else collection
        if self.include is not None and not _any_match(self.include, name):
            return False
        return not _any_match(self.exclude, name)


def _any_match(entries: Iterable[str], name: str) -> bool:
    for entry in entries:
        if is_pattern(entry):
            if re.search(pattern_of(entry), name):
                return True
        elif entry == name:
            return True
    return False


__all__ = [
    "PATTERN_PREFIX",
    "NamespaceSelection",
    "anchored",
    "is_pattern",
    "pattern_of",
    "pattern_problem",
]
