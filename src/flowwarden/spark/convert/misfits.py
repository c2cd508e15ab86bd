"""Values that do not fit their column, and the events they make malformed.

Owns how the Python conversion path reports a misfit: a converter raises :class:`Misfit` for
one value (its message says what was expected and what was found, see :func:`describe_value`),
the column builder records it in :class:`FirstMisfits` under the event the value came from,
and each event with a misfit becomes one :class:`MalformedRow` of the batch.

Hard rule: an event is reported once, with its first misfit (in column order: the full
document before the pre-image, fields in schema order); later misfits of the same event are
not recorded. This module never decides what happens to a malformed row (the schema mode
does, in :func:`flowwarden.spark.convert.arrow.events_to_arrow`) and never imports pyarrow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

__all__ = ["FirstMisfits", "MalformedRow", "Misfit", "describe_value"]


@dataclasses.dataclass(frozen=True)
class MalformedRow:
    """An event whose full document did not fit the schema."""

    index: int
    """Position of the event in the batch given to :func:`~flowwarden.spark.convert.arrow.events_to_arrow`."""
    token: Mapping[str, Any]
    """The event's resume token (its ``_id``)."""
    field: str
    """The first field that did not fit, as a column path: ``full_document.items[].qty``."""
    error: str
    """What was expected and what was found."""


class Misfit(Exception):
    """One value does not fit its column; the message says what was expected and found."""


def describe_value(value: Any) -> str:
    """A value as misfit messages quote it: its type name and its repr, cut to 80 characters
    (``str 'twelve'``, ``Decimal128 Decimal128('1.5')``)."""
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"


class FirstMisfits:
    """The first misfit of each event of a batch: ``by_event[index] = (path, reason)``.

    Column builders call :meth:`add` for every value that does not fit; only an event's first
    call counts, so the report names the first field that did not fit.
    """

    __slots__ = ("by_event",)

    def __init__(self) -> None:
        self.by_event: dict[int, tuple[str, str]] = {}

    def add(self, event: int, path: str, reason: str) -> None:
        """Record that a value of event ``event`` at column path ``path`` did not fit, unless
        that event already has a misfit."""
        if event not in self.by_event:
            self.by_event[event] = (path, reason)
