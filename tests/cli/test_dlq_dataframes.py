"""`flowwarden dlq replay` through an ``@on_dataframe`` class: each entry as a DataFrame of one row,
typed by the class's schema, and an entry whose document does not fit that schema failed again,
never marked replayed while the method did not see it."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pymongo
import pytest

from flowwarden.cli import ExitCode, main

from .test_dlq_entries import dlq_command, entry

pytestmark = pytest.mark.spark

HANDLERS = """
    from pydantic import BaseModel

    from flowwarden import change_stream, on_dataframe

    SEEN = []


    class Item(BaseModel):
        qty: int


    def frames(mode):
        @change_stream("orders", "shop", name="orders")
        class Frames:
            @on_dataframe(schema=Item, mode=mode)
            def write(self, df):
                for row in df.collect():
                    fields = row.asDict()
                    SEEN.append((fields["full_document"]["qty"], fields.get("_corrupt_record")))

        return Frames


    Dropping = frames("DROPMALFORMED")
    Failing = frames("FAILFAST")
    Keeping = frames("PERMISSIVE")
"""


@pytest.fixture
def handlers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spark: Any) -> Iterator[Any]:
    (tmp_path / "dlq_frame_handlers.py").write_text(textwrap.dedent(HANDLERS))
    monkeypatch.syspath_prepend(str(tmp_path))
    import dlq_frame_handlers  # type: ignore[import-not-found]

    yield dlq_frame_handlers
    sys.modules.pop("dlq_frame_handlers", None)


@pytest.fixture
def entries(client: pymongo.MongoClient[Any], db_name: str) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    dlq = client[db_name]["_fw_dlq"]
    fits, unfit = entry(1, document={"qty": 2}), entry(2, minutes=1, document={"qty": "lots"})
    dlq.insert_many([fits, unfit])
    return dlq, fits, unfit


def replay(uri: str, db: str, handler: str) -> list[str]:
    return dlq_command(uri, db, "replay", "--handler", f"dlq_frame_handlers:{handler}")


@pytest.mark.parametrize("handler", ["Dropping", "Failing"])
def test_an_entry_whose_document_does_not_fit_the_schema_fails_again(
    capsys: pytest.CaptureFixture[str],
    handlers: Any,
    entries: Any,
    mongodb_uri: str,
    db_name: str,
    handler: str,
) -> None:
    dlq, fits, unfit = entries
    assert main(replay(mongodb_uri, db_name, handler)) == ExitCode.FAILED
    assert "replayed 1, failed 1" in capsys.readouterr().out
    assert handlers.SEEN == [(2, None)]
    assert dlq.find_one({"_id": fits["_id"]})["replayCount"] == 1
    refused = dlq.find_one({"_id": unfit["_id"]})
    assert "replayedAt" not in refused
    assert "full_document.qty" in refused["lastReplayError"]


def test_a_permissive_class_gets_the_unfit_document_as_its_corrupt_record(
    capsys: pytest.CaptureFixture[str], handlers: Any, entries: Any, mongodb_uri: str, db_name: str
) -> None:
    assert main(replay(mongodb_uri, db_name, "Keeping")) == ExitCode.CLEAN_STOP
    (fitting, unfit) = handlers.SEEN
    assert fitting == (2, None)
    assert unfit[0] is None and '"lots"' in unfit[1]
