"""`flowwarden dlq`: entries a connector dead-lettered, listed, shown, replayed through a handler
class (at least once, each marked) and purged only when confirmed."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from flowwarden.cli import ExitCode, main
from helpers import flowwarden_command as flowwarden
from helpers import one_error_line, running, wait_until

HANDLERS = """
    import os
    from pathlib import Path

    from flowwarden import change_stream, checkpoint, dead_letter_queue, on_delete, on_insert, retry_policy

    HANDLED = Path(os.environ["FW_TEST_HANDLED"])


    @change_stream("orders", {db!r}, name="orders", max_await_time_ms=50)
    @checkpoint(save_every_n=1)
    @retry_policy(max_attempts=2, initial_delay_seconds=0.01, on_exhausted="DEAD_LETTER")
    @dead_letter_queue(retention_days=7)
    class Orders:
        @on_insert
        def created(self, event):
            if event.full_document.get("bad") and os.environ.get("FW_TEST_SINK") != "fixed":
                raise ValueError(f"the sink refused order {{event.document_key['_id']}}")
            with HANDLED.open("a") as log:
                log.write(f"insert {{event.document_key['_id']}}\\n")

        @on_delete
        def removed(self, event):
            raise LookupError("no such order in the sink")
"""


@pytest.fixture
def dead_letters(tmp_path, monkeypatch, mongodb_uri, client, db_name):
    """Five inserts of which two fail, and one delete that fails: three entries in _fw_dlq."""
    (tmp_path / "dlq_handlers.py").write_text(textwrap.dedent(HANDLERS.format(db=db_name)))
    handled = tmp_path / "handled.log"
    monkeypatch.setenv("FW_TEST_HANDLED", str(handled))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.chdir(tmp_path)
    from dlq_handlers import Orders  # type: ignore[import-not-found]

    with running(mongodb_uri, [Orders]) as connector:
        wait_until(lambda: client[db_name]["_fw_checkpoints"].find_one({"_id": "orders"}))
        client[db_name].orders.insert_many([{"_id": i, "bad": i in (1, 3)} for i in range(5)])
        client[db_name].orders.delete_one({"_id": 4})
        wait_until(lambda: connector.status()["orders"].events_processed == 6, what="six events")
    yield handled
    import sys

    sys.modules.pop("dlq_handlers", None)


def entries(capsys, uri: str, db: str, *options: str) -> list[dict]:
    assert main(["dlq", "list", "--uri", uri, "--database", db, "--json", *options]) == ExitCode.CLEAN_STOP
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def test_list_filters_and_shows_what_failed(capsys, dead_letters, mongodb_uri, db_name):
    listed = entries(capsys, mongodb_uri, db_name)
    assert [(e["operationType"], e["documentKey"]) for e in listed] == [
        ("insert", 1),
        ("insert", 3),
        ("delete", 4),
    ]
    assert listed[0]["stream"] == "orders" and listed[0]["attempts"] == 2
    assert listed[0]["errorType"] == "builtins.ValueError" and "refused order 1" in listed[0]["message"]
    assert [e["documentKey"] for e in entries(capsys, mongodb_uri, db_name, "--error", "lookuperror")] == [4]
    assert [e["documentKey"] for e in entries(capsys, mongodb_uri, db_name, "--error", "ORDER 3")] == [3]
    assert entries(capsys, mongodb_uri, db_name, "--stream", "payments") == []
    assert len(entries(capsys, mongodb_uri, db_name, "--since", "2000-01-01T00:00:00Z")) == 3
    assert entries(capsys, mongodb_uri, db_name, "--since", "2999-01-01T00:00:00Z") == []
    assert len(entries(capsys, mongodb_uri, db_name, "--limit", "2")) == 2
    # The table, for people.
    assert main(["dlq", "list", "--uri", mongodb_uri, "--database", db_name]) == ExitCode.CLEAN_STOP
    table = capsys.readouterr().out
    assert "3 entries" in table and "ValueError: the sink refused order 1" in table


def test_show_prints_the_whole_entry(capsys, dead_letters, mongodb_uri, db_name):
    first = entries(capsys, mongodb_uri, db_name)[0]
    assert main(["dlq", "show", first["id"], "--uri", mongodb_uri, "--database", db_name]) == 0
    entry = json.loads(capsys.readouterr().out)
    assert entry["event"]["documentKey"] == {"_id": 1} and entry["event"]["fullDocument"]["bad"] is True
    assert "Traceback" in entry["traceback"] and entry["token"]["_data"] == entry["event"]["_id"]["_data"]
    missing = "0" * 24
    assert main(["dlq", "show", missing, "--uri", mongodb_uri, "--database", db_name]) == ExitCode.USAGE
    assert missing in one_error_line(capsys.readouterr().err)
    assert main(["dlq", "show", "nope", "--uri", mongodb_uri, "--database", db_name]) == ExitCode.USAGE
    assert "24 hex digits" in one_error_line(capsys.readouterr().err)


def replay_command(uri: str, db: str) -> list[str]:
    """``dlq replay`` of every entry through ``dlq_handlers:Orders``."""
    return ["dlq", "replay", "--uri", uri, "--database", db, "--handler", "dlq_handlers:Orders"]


def test_replay_runs_entries_through_the_class_and_marks_them(
    capsys, dead_letters, monkeypatch, mongodb_uri, client, db_name
):
    replay = replay_command(mongodb_uri, db_name)
    # The sink still refuses: both inserts fail again, and so does the delete.
    assert main(replay) == ExitCode.FAILED
    out = capsys.readouterr().out
    assert "at least once" in out and "replayed 0, failed 3" in out
    assert all("lastReplayError" in doc for doc in client[db_name]["_fw_dlq"].find())
    # Fixed, the inserts go through; --error picks them.
    monkeypatch.setenv("FW_TEST_SINK", "fixed")
    assert main([*replay, "--error", "ValueError"]) == ExitCode.CLEAN_STOP
    assert "replayed 2, failed 0" in capsys.readouterr().out
    assert dead_letters.read_text().split("\n")[-3:] == ["insert 1", "insert 3", ""]
    replayed = {doc["event"]["documentKey"]["_id"]: doc for doc in client[db_name]["_fw_dlq"].find()}
    assert replayed[1]["replayCount"] == 1 and "lastReplayError" not in replayed[1]
    assert "replayedAt" not in replayed[4] and "LookupError" in replayed[4]["lastReplayError"]
    # A replay leaves the replayed ones alone; --again takes them too.
    assert main(replay) == ExitCode.FAILED
    assert "replaying 1 entry" in capsys.readouterr().out
    assert main([*replay, "--again", "--error", "ValueError"]) == ExitCode.CLEAN_STOP
    assert "replaying 2 entries" in capsys.readouterr().out
    assert client[db_name]["_fw_dlq"].find_one({"event.documentKey._id": 1})["replayCount"] == 2
    assert client[db_name]["_fw_dlq"].count_documents({"replayClaim": {"$exists": True}}) == 0


def test_two_replays_at_once_never_take_the_same_entry(
    capsys, dead_letters, monkeypatch, tmp_path, mongodb_uri, client, db_name
):
    # Two replays list the same entries; each entry goes to the first that claims it. The second
    # replay, a process of its own, runs from inside the first one's method while it holds entry 1.
    from dlq_handlers import Orders  # type: ignore[import-not-found]

    monkeypatch.setenv("FW_TEST_SINK", "fixed")
    replay = [
        "dlq",
        "replay",
        "--database",
        db_name,
        "--handler",
        "dlq_handlers:Orders",
        "--error",
        "ValueError",
    ]
    environment = {
        "FLOWWARDEN_URI": mongodb_uri,
        "FW_TEST_HANDLED": str(dead_letters),
        "FW_TEST_SINK": "fixed",
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
    }
    inner: list[subprocess.CompletedProcess[str]] = []
    created = Orders.created

    def created_then_a_second_replay(self, event):  # type: ignore[no-untyped-def]
        if not inner:
            inner.append(flowwarden(*replay, env=environment, cwd=tmp_path))
        created(self, event)

    monkeypatch.setattr(Orders, "created", created_then_a_second_replay)
    assert main(["--verbose", *replay[:1], *replay[1:], "--uri", mongodb_uri]) == ExitCode.CLEAN_STOP
    (second,) = inner
    assert second.returncode == ExitCode.CLEAN_STOP, second.stderr
    # The second replay took entry 3 (the first held 1), and left 1 to it; the first then found 3
    # taken.
    assert "replayed 1, failed 0, 1 taken by another replay" in second.stdout
    assert "replayed 1, failed 0, 1 taken by another replay" in capsys.readouterr().out
    handled = dead_letters.read_text().splitlines()
    assert handled.count("insert 1") == 1 and handled.count("insert 3") == 1  # each entry once
    counts = {
        d["event"]["documentKey"]["_id"]: d.get("replayCount") for d in client[db_name]["_fw_dlq"].find()
    }
    assert counts == {1: 1, 3: 1, 4: None}


def test_a_replay_takes_entries_whose_claim_lapsed_and_leaves_those_another_replay_holds(
    capsys, dead_letters, monkeypatch, far_from_utc, mongodb_uri, client, db_name
):
    # Entries 1 and 4 are held by a live replay elsewhere; the replay that claimed 3 was killed
    # and its claim lapsed. The process's local time is nine hours from UTC: claims are in UTC.
    from dlq_handlers import Orders  # type: ignore[import-not-found]

    from flowwarden.cli.dlq import CLAIM_SECONDS

    monkeypatch.setenv("FW_TEST_SINK", "fixed")
    letters = client[db_name]["_fw_dlq"]
    now = datetime.now(timezone.utc)
    for key, until in (
        (1, now + timedelta(hours=1)),
        (4, now + timedelta(minutes=1)),
        (3, now - timedelta(minutes=1)),
    ):
        claim = {"by": "elsewhere:1:0000", "until": until}
        letters.update_one({"event.documentKey._id": key}, {"$set": {"replayClaim": claim}})
    claims: list[dict] = []
    created = Orders.created

    def created_noting_the_claim(self, event):  # type: ignore[no-untyped-def]
        claims.append(letters.find_one({"event.documentKey._id": event.document_key["_id"]})["replayClaim"])
        created(self, event)

    monkeypatch.setattr(Orders, "created", created_noting_the_claim)
    replay = replay_command(mongodb_uri, db_name)
    assert main(replay) == ExitCode.CLEAN_STOP
    out = capsys.readouterr().out
    held = {d["event"]["documentKey"]["_id"]: d["_id"] for d in letters.find()}
    assert f"  {held[1]}: taken by another replay, or replayed since" in out
    assert f"  {held[4]}: taken by another replay, or replayed since" in out
    assert "replayed 1, failed 0, 2 taken by another replay" in out
    assert dead_letters.read_text().splitlines()[-1] == "insert 3"
    # While 3 was replayed, this replay held it: in its own name, for CLAIM_SECONDS from then.
    (claim,) = claims
    assert claim["by"].startswith(f"{socket.gethostname()}:{os.getpid()}:")
    until = claim["until"].replace(tzinfo=timezone.utc)
    assert (
        now + timedelta(seconds=CLAIM_SECONDS - 60)
        < until
        < datetime.now(timezone.utc) + timedelta(seconds=CLAIM_SECONDS)
    )
    # The others' claims stand; this replay's is gone with its entry replayed.
    assert letters.find_one({"event.documentKey._id": 1})["replayClaim"]["by"] == "elsewhere:1:0000"
    assert "replayClaim" not in letters.find_one({"event.documentKey._id": 3})


def test_replay_refuses_another_streams_class(capsys, dead_letters, mongodb_uri, db_name):
    code = main(
        [
            "dlq",
            "replay",
            "--stream",
            "payments",
            "--uri",
            mongodb_uri,
            "--database",
            db_name,
            "--handler",
            "dlq_handlers:Orders",
        ]
    )
    assert code == ExitCode.USAGE
    assert "not Orders's stream ('orders')" in one_error_line(capsys.readouterr().err)


def test_purge_deletes_only_when_confirmed(capsys, dead_letters, mongodb_uri, client, db_name):
    purge = ["dlq", "purge", "--uri", mongodb_uri, "--database", db_name, "--error", "ValueError"]
    assert main(purge) == ExitCode.USAGE
    assert "would delete 2 entries" in one_error_line(capsys.readouterr().err)
    assert client[db_name]["_fw_dlq"].count_documents({}) == 3
    assert main([*purge, "--yes"]) == ExitCode.CLEAN_STOP
    assert "deleted 2 entries" in capsys.readouterr().out
    assert [doc["event"]["documentKey"]["_id"] for doc in client[db_name]["_fw_dlq"].find()] == [4]


def test_dlq_in_a_process_of_its_own_with_the_uri_in_the_environment(dead_letters, mongodb_uri, db_name):
    done = flowwarden("dlq", "list", "--database", db_name, "--json", env={"FLOWWARDEN_URI": mongodb_uri})
    assert done.returncode == 0, done.stderr
    assert [json.loads(line)["documentKey"] for line in done.stdout.splitlines()] == [1, 3, 4]
    done = flowwarden(
        "dlq",
        "replay",
        "--database",
        db_name,
        "--handler",
        "dlq_handlers:Orders",
        env={"FLOWWARDEN_URI": mongodb_uri, "FW_TEST_SINK": "fixed", "FW_TEST_HANDLED": str(dead_letters)},
        cwd=Path(dead_letters).parent,
    )
    assert done.returncode == ExitCode.FAILED, done.stderr  # the delete still fails
    assert "replayed 2, failed 1" in done.stdout
