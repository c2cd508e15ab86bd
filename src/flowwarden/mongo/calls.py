"""One procedure for every client: MongoDB work written once, run on sync and asyncio clients alike.

A procedure is a generator that yields each driver call it needs as a :class:`Call`, receives
the call's result (or has the driver's exception thrown into it, where ``except`` clauses catch
what they expect) and returns its own result. :func:`run` makes the calls blocking, for
PyMongo's sync client; :func:`run_async` awaits them, for PyMongo's asyncio client and motor's.
The rule this module keeps: the runners hold no logic of their own, so a procedure behaves the
same whichever client runs it; every decision (what to retry, what an error means) is in the
procedure.

An error the runner meets is thrown into the procedure whatever its kind, a cancellation or an
interrupt included, so that a procedure's ``finally`` can still yield the calls that release what
it opened (a shard's client), and the error goes on once they ran.
"""

from __future__ import annotations

import inspect
from collections.abc import Generator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

T = TypeVar("T")


@dataclass(frozen=True)
class Call:
    """``getattr(target, method)(*args, **kwargs)``; with ``every_document``, that call returns a
    cursor and the result is the list of its documents."""

    target: Any
    method: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    every_document: bool = False


Procedure = Generator[Call, Any, T]
"""A generator of the calls it needs, returning a ``T``."""


def call(target: Any, method: str, *args: Any, **kwargs: Any) -> Call:
    """``target.method(*args, **kwargs)``, as a procedure yields it."""
    return Call(target, method, args, kwargs)


def find_all(collection: Any, *args: Any, **kwargs: Any) -> Call:
    """Every document of ``collection.find(*args, **kwargs)``, as a list."""
    return Call(collection, "find", args, kwargs, every_document=True)


def run(procedure: Procedure[T]) -> T:
    """The procedure's result, its calls made with blocking (PyMongo sync) calls."""
    reply: Any = None
    failure: BaseException | None = None
    while True:
        try:
            step = procedure.throw(failure) if failure is not None else procedure.send(reply)
        except StopIteration as done:
            return cast(T, done.value)
        reply, failure = None, None
        try:
            result = getattr(step.target, step.method)(*step.args, **step.kwargs)
            reply = list(result) if step.every_document else result
        except BaseException as error:  # thrown into the procedure: see the module docstring
            failure = error


async def run_async(procedure: Procedure[T]) -> T:
    """The procedure's result, its calls awaited (PyMongo's asyncio client, motor's)."""
    reply: Any = None
    failure: BaseException | None = None
    while True:
        try:
            step = procedure.throw(failure) if failure is not None else procedure.send(reply)
        except StopIteration as done:
            return cast(T, done.value)
        reply, failure = None, None
        try:
            result = getattr(step.target, step.method)(*step.args, **step.kwargs)
            if step.every_document:
                reply = [document async for document in result]
            else:
                reply = await maybe_await(result)
        except BaseException as error:  # thrown into the procedure: see the module docstring
            failure = error


async def maybe_await(value: Any) -> Any:
    """``value``, awaited when it is awaitable (asyncio and motor clients return coroutines or
    futures; some of motor's methods, such as ``close``, return plain values)."""
    return await value if inspect.isawaitable(value) else value


__all__ = ["Call", "Procedure", "call", "find_all", "maybe_await", "run", "run_async"]
