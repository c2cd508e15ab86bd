"""The store SPI moved to flowwarden.checkpoints; the old path works for one release, with a warning,
and never takes the name of the @checkpoint decorator."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import flowwarden
import flowwarden.checkpoints
import flowwarden.checkpoints.contract
from flowwarden.decorators import checkpoint as decorator


def test_the_decorator_and_the_package_have_names_of_their_own() -> None:
    assert flowwarden.checkpoint is decorator
    assert flowwarden.checkpoints.MongoCheckpointStore.__module__ == "flowwarden.checkpoints.mongo"
    assert not callable(flowwarden.checkpoints)


def test_the_old_path_warns_and_gives_the_same_objects() -> None:
    # A fresh interpreter: this one may have imported the old path already.
    code = """
import warnings
warnings.simplefilter("error", DeprecationWarning)
try:
    from flowwarden.checkpoint.contract import CheckpointStoreContract
except DeprecationWarning as warning:
    assert "import flowwarden.checkpoints" in str(warning), warning
else:
    raise AssertionError("no DeprecationWarning")
warnings.simplefilter("ignore", DeprecationWarning)
from flowwarden.checkpoint import MongoCheckpointStore
from flowwarden.checkpoint.contract import CheckpointStoreContract
import flowwarden.checkpoints.contract as new
import flowwarden
assert CheckpointStoreContract is new.CheckpointStoreContract
assert MongoCheckpointStore is flowwarden.checkpoints.MongoCheckpointStore
from flowwarden import checkpoint

@checkpoint(save_every_n=7)
class Handler:
    pass

assert flowwarden.stream_spec  # the decorator still decorates after the old path was imported
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "ok", done.stderr


def test_an_unknown_name_on_the_old_path_fails_as_usual() -> None:
    with pytest.warns(DeprecationWarning):
        old = importlib.import_module("flowwarden.checkpoint")
    with pytest.raises(AttributeError):
        old.NoSuchStore  # noqa: B018
