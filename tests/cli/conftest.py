"""Helpers of the command-line tests."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests set the FLOWWARDEN_* variables they mean to; none leak in from the shell."""
    for name in list(os.environ):
        if name.startswith("FLOWWARDEN_") and name != "FLOWWARDEN_TEST_MONGODB_URI":
            monkeypatch.delenv(name)


@pytest.fixture
def closed_port() -> int:
    """A port nothing listens on: connecting to it is refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
