"""Fixtures of the contract tests (the suite every MongoDB server here must pass)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pymongo
import pytest


@pytest.fixture
def fail_command(client: pymongo.MongoClient) -> Iterator[Callable[..., dict[str, Any]]]:
    """``fail_command(mode, **data)`` configures MongoDB's ``failCommand`` fail point.

    The fail point is server-wide and the run shares one server, so whatever the test did with it,
    passed or failed, it is switched off when the test ends.
    """

    def configure(mode: object, **data: object) -> dict[str, Any]:
        reply: dict[str, Any] = client.admin.command(
            "configureFailPoint", "failCommand", mode=mode, data=data
        )
        return reply

    yield configure
    client.admin.command("configureFailPoint", "failCommand", mode="off")


@pytest.fixture
def fail_get_more(client: pymongo.MongoClient) -> Iterator[Callable[..., dict[str, Any]]]:
    """``fail_get_more(mode, error_code)`` configures ``failGetMoreAfterCursorCheckout``; switched
    off when the test ends."""

    def configure(mode: object, error_code: int) -> dict[str, Any]:
        reply: dict[str, Any] = client.admin.command(
            "configureFailPoint",
            "failGetMoreAfterCursorCheckout",
            mode=mode,
            data={"errorCode": error_code},
        )
        return reply

    yield configure
    client.admin.command("configureFailPoint", "failGetMoreAfterCursorCheckout", mode="off")


@pytest.fixture
def requires_mongodb(client: pymongo.MongoClient) -> Callable[[int, str], None]:
    """``requires_mongodb(major, why)`` skips the test, saying why, when the deployment runs a
    MongoDB older than ``major``."""

    def check(major: int, why: str) -> None:
        found = client.server_info()["versionArray"][0]
        if found < major:
            pytest.skip(f"needs MongoDB {major}.0+ ({why}); the deployment runs {found}")

    return check
