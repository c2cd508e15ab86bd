"""One error tree: every public error is defined in flowwarden.errors and names its stream as ``stream``."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import re
from pathlib import Path

import pytest

import flowwarden
from flowwarden import errors
from flowwarden.errors import (
    CheckpointError,
    CheckpointSaveFailedError,
    CommitterClosedError,
    ConfigurationError,
    FencedError,
    FlowWardenError,
    HandlerError,
    HistoryLostError,
    RestartsExhaustedError,
    ResumePositionError,
    StreamError,
    StreamInvalidatedError,
    UnreadableCheckpointError,
)


def every_error() -> set[type[FlowWardenError]]:
    """Every subclass of FlowWardenError in flowwarden, with every module imported."""
    for module in pkgutil.walk_packages(flowwarden.__path__, "flowwarden."):
        if module.name.endswith("__main__"):
            continue
        importlib.import_module(module.name)
    found: set[type[FlowWardenError]] = set()
    todo: list[type[FlowWardenError]] = [FlowWardenError]
    while todo:
        cls = todo.pop()
        found.add(cls)
        todo.extend(cls.__subclasses__())
    return found


def test_every_error_is_defined_and_exported_in_flowwarden_errors() -> None:
    found = every_error()
    elsewhere = sorted(f"{c.__module__}.{c.__qualname__}" for c in found if c.__module__ != errors.__name__)
    assert not elsewhere, f"public errors live in flowwarden.errors: {elsewhere}"
    assert {cls.__name__ for cls in found} == set(errors.__all__)
    assert len(found) > 15


def test_every_error_names_its_stream_as_stream_and_nothing_else() -> None:
    for cls in every_error():
        assert "stream_id" not in inspect.signature(cls.__init__).parameters, cls
        assert cls.stream is None or isinstance(cls.stream, str)  # the attribute every error has
    assert StreamError("x").stream is None


@pytest.mark.parametrize(
    "error",
    [
        ConfigurationError("layout conflict", owner="stream 'orders'", option="partitions", stream="orders"),
        CheckpointError("load failed", stream="orders"),
        UnreadableCheckpointError("damaged", stream="orders"),
        CommitterClosedError("closed", stream="orders"),
        FencedError("orders", epoch=1, stored_epoch=2),
        CheckpointSaveFailedError("orders", failures=3, last_error=OSError("disk")),
        StreamError("cannot go on", stream="orders"),
        ResumePositionError("orders", token={"_data": "82"}, reason="refused"),
        RestartsExhaustedError("orders", restarts=3, last_error=ValueError("x")),
        HistoryLostError("orders", checkpoint_time=None, oplog_start=None, oplog_end=None),
        StreamInvalidatedError("orders", operation="drop", token=None),
        HandlerError("orders", token=None, attempts=3, cause=ValueError("x")),
    ],
    ids=lambda error: type(error).__name__,
)
def test_an_error_about_a_stream_carries_its_name(error: FlowWardenError) -> None:
    assert error.stream == "orders"
    assert not hasattr(error, "stream_id")


def test_the_moved_errors_are_importable_from_flowwarden_errors() -> None:
    from flowwarden.errors import InvalidTokenError, UndecodableEventError
    from flowwarden.events import token_data

    with pytest.raises(InvalidTokenError):
        token_data({"no": "token"})
    assert issubclass(UndecodableEventError, FlowWardenError)
    assert UndecodableEventError(2, "bad UTF-8").index == 2


def test_every_error_that_is_no_base_is_raised_somewhere() -> None:
    """An exported error nothing raises would promise users a failure they never see."""
    source = "\n".join(
        path.read_text(encoding="utf-8")
        for path in Path(flowwarden.__file__).parent.rglob("*.py")
        if path.name != "errors.py"
    )
    leaves = [cls for cls in every_error() if not cls.__subclasses__()]
    never = sorted(cls.__name__ for cls in leaves if not re.search(rf"\b{cls.__name__}\(", source))
    assert not never, f"exported but never raised: {never}"
