"""`flowwarden dlq` over entries written straight into the dead-letter collection: what list, show,
purge and replay print, which entries each one picks, in which order, and what replay hands each
method and writes back."""

from __future__ import annotations

import json
import logging
import sys
import textwrap
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pymongo
import pytest
from bson import ObjectId

from flowwarden.cli import ExitCode, main
from helpers import one_error_line

HANDLERS = """
    import asyncio
    import threading

    from flowwarden import change_stream, on_batch, on_insert, on_update, retry_policy

    SEEN = []


    @change_stream("orders", "shop", name="orders")
    @retry_policy(max_attempts=2, initial_delay_seconds=0.01)
    class Orders:
        @on_insert
        def created(self, event, ctx):
            key = event.document_key["_id"]
            on_main = threading.current_thread() is threading.main_thread()
            SEEN.append(("created", key, ctx.stream, ctx.batch_id, ctx.attempt, on_main))
            if event.full_document.get("fail") == "always" or (
                event.full_document.get("fail") == "once" and ctx.attempt == 1
            ):
                raise ValueError(f"order {key} refused")

        @on_update
        async def updated(self, event):
            await asyncio.sleep(0)
            SEEN.append(("updated", event.document_key["_id"]))


    @change_stream("orders", "shop", name="orders", partitions=2)
    class Buckets:
        @on_insert
        def created(self, event, ctx):
            SEEN.append(("bucket", event.document_key["_id"], ctx.stream))


    @change_stream("orders", "shop", name="orders")
    class Batches:
        @on_batch
        def many(self, events):
            on_main = threading.current_thread() is threading.main_thread()
            kinds = [type(e).__name__ for e in events]
            SEEN.append(("batch", kinds, [e.document_key["_id"] for e in events], on_main))
"""

T0 = datetime(2026, 11, 20, 8, 0, tzinfo=timezone.utc)


def entry(
    key: Any, *, stream: str = "orders", minutes: int = 0, operation: str = "insert", **more: Any
) -> dict[str, Any]:
    token = {"_data": f"82{key:08X}2B04" if isinstance(key, int) else "82FF"}
    event = {
        "_id": token,
        "operationType": operation,
        "documentKey": {"_id": key},
        "fullDocument": {"_id": key, **more.pop("document", {})},
        "ns": {"db": "shop", "coll": "orders"},
    }
    return {
        "_id": ObjectId(),
        "stream": stream,
        "token": token,
        "event": event,
        "errorType": "builtins.ValueError",
        "message": f"order {key} refused",
        "traceback": "Traceback (most recent call last): ...",
        "attempts": 2,
        "failedAt": T0 + timedelta(minutes=minutes),
        **more,
    }


@pytest.fixture
def dlq(client: pymongo.MongoClient[Any], db_name: str) -> Any:
    return client[db_name]["_fw_dlq"]


@pytest.fixture
def empty_dlq(dlq: Any) -> Any:
    """The dead-letter collection with no entry, in a database that exists: the commands refuse a
    database the deployment does not have."""
    dlq.database.create_collection(dlq.name)
    return dlq


@pytest.fixture
def handlers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    (tmp_path / "dlq_entry_handlers.py").write_text(textwrap.dedent(HANDLERS))
    monkeypatch.syspath_prepend(str(tmp_path))
    import dlq_entry_handlers  # type: ignore[import-not-found]

    yield dlq_entry_handlers
    sys.modules.pop("dlq_entry_handlers", None)


def dlq_command(uri: str, db: str, action: str, *arguments: str) -> list[str]:
    return ["dlq", action, *arguments, "--uri", uri, "--database", db]


def listed(capsys: pytest.CaptureFixture[str], uri: str, db: str, *options: str) -> list[dict]:
    assert main(dlq_command(uri, db, "list", "--json", *options)) == ExitCode.CLEAN_STOP
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


# -- list ------------------------------------------------------------------------------------------


def test_list_as_json_gives_each_entry_in_failure_order_with_its_replays(
    capsys: pytest.CaptureFixture[str], dlq: Any, mongodb_uri: str, db_name: str
) -> None:
    replayed_at = T0 + timedelta(hours=1)
    late, early = entry(1, minutes=5), entry(2, minutes=1, replayCount=2, replayedAt=replayed_at)
    dlq.insert_many([late, early])
    assert listed(capsys, mongodb_uri, db_name) == [
        {
            "id": str(early["_id"]),
            "stream": "orders",
            "failedAt": "2026-11-20T08:01:00+00:00",
            "operationType": "insert",
            "documentKey": 2,
            "errorType": "builtins.ValueError",
            "message": "order 2 refused",
            "attempts": 2,
            "replayCount": 2,
            "replayedAt": "2026-11-20T09:00:00+00:00",
        },
        {
            "id": str(late["_id"]),
            "stream": "orders",
            "failedAt": "2026-11-20T08:05:00+00:00",
            "operationType": "insert",
            "documentKey": 1,
            "errorType": "builtins.ValueError",
            "message": "order 1 refused",
            "attempts": 2,
            "replayCount": 0,
            "replayedAt": None,
        },
    ]
    assert [e["documentKey"] for e in listed(capsys, mongodb_uri, db_name, "--limit", "1")] == [2]


def test_an_entry_without_a_readable_event_lists_without_its_fields(
    capsys: pytest.CaptureFixture[str], dlq: Any, mongodb_uri: str, db_name: str
) -> None:
    dlq.insert_one({**entry(1), "event": "not a document", "failedAt": "yesterday"})
    (found,) = listed(capsys, mongodb_uri, db_name)
    assert (found["operationType"], found["documentKey"], found["failedAt"]) == (None, None, None)


def test_the_since_filter_takes_a_utc_time_with_z_in_either_case(
    capsys: pytest.CaptureFixture[str], dlq: Any, mongodb_uri: str, db_name: str
) -> None:
    dlq.insert_many([entry(1, minutes=0), entry(2, minutes=10)])
    for since in ("2026-11-20T08:05:00Z", "2026-11-20t08:05:00z", "2026-11-20T09:05:00+01:00"):
        assert [e["documentKey"] for e in listed(capsys, mongodb_uri, db_name, "--since", since)] == [2]


@pytest.mark.parametrize("since", ["yesterday", "2026-11-20T08:05:00"], ids=["not a time", "no time zone"])
def test_a_since_that_is_not_a_time_with_a_zone_is_refused(
    capsys: pytest.CaptureFixture[str], mongodb_uri: str, db_name: str, since: str
) -> None:
    # Refused before the command connects: the database does not exist, and that is not what it says.
    assert main(dlq_command(mongodb_uri, db_name, "list", "--since", since)) == ExitCode.USAGE
    assert one_error_line(capsys.readouterr().err) == (
        f"flowwarden: --since {since!r} is not an ISO-8601 date-time with a time zone; give one such as "
        "2026-11-20T08:00:00Z"
    )


def test_not_replayed_leaves_out_the_entries_replayed_once(
    capsys: pytest.CaptureFixture[str], dlq: Any, mongodb_uri: str, db_name: str
) -> None:
    dlq.insert_many([entry(1), entry(2, replayCount=1, replayedAt=T0)])
    assert [e["documentKey"] for e in listed(capsys, mongodb_uri, db_name, "--not-replayed")] == [1]


def test_the_list_table_shows_each_entry_on_one_row(
    capsys: pytest.CaptureFixture[str], dlq: Any, mongodb_uri: str, db_name: str
) -> None:
    long_message = "the sink refused the order because " + "x" * 60
    dlq.insert_many(
        [
            entry(1, minutes=1, errorType="sink.errors.Refused", message=long_message),
            entry(2, minutes=2, replayCount=1, replayedAt=T0 + timedelta(hours=1)),
            {**entry(3, minutes=3), "event": None, "failedAt": None},
        ]
    )
    assert main(dlq_command(mongodb_uri, db_name, "list", "--limit", "3")) == ExitCode.CLEAN_STOP
    lines = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert lines[0] == f"{db_name}._fw_dlq: 3 entries"
    header = next(line for line in lines if "document key" in line)
    assert [cell.strip() for cell in header.split("┃")[1:-1]] == [
        "id",
        "stream",
        "failed at",
        "operation",
        "document key",
        "error",
        "attempts",
        "replayed",
    ]
    rows: list[list[str]] = []
    for line in lines:
        if "│" not in line:
            continue
        cells = [cell.strip() for cell in line.split("│")[1:-1]]
        if cells[0]:  # a row's first line; the lines after it continue its wrapped cells
            rows.append(cells)
        else:
            rows[-1] = [" ".join(part for part in pair if part) for pair in zip(rows[-1], cells, strict=True)]
    # A missing failure time sorts first, as MongoDB sorts null.
    assert rows[0][1:5] == ["orders", "-", "-", "null"]
    assert rows[1][1:] == [
        "orders",
        "2026-11-20T08:01:00+00:00",
        "insert",
        "1",
        ("Refused: " + long_message)[:57] + "...",  # the error's last name part, cut to 60
        "2",
        "no",
    ]
    assert rows[2][5:] == ["ValueError: order 2 refused", "2", "1x, last 2026-11-20T09:00:00+00:00"]
    assert all(len(line) <= 200 for line in lines)
    assert not any(line.startswith("showing the first") for line in lines)


def test_the_list_table_says_when_the_limit_hides_entries(
    capsys: pytest.CaptureFixture[str], dlq: Any, mongodb_uri: str, db_name: str
) -> None:
    dlq.insert_many([entry(1), entry(2, minutes=1)])
    assert main(dlq_command(mongodb_uri, db_name, "list", "--limit", "1")) == ExitCode.CLEAN_STOP
    lines = [line.rstrip() for line in capsys.readouterr().out.splitlines()]
    assert lines[0] == f"{db_name}._fw_dlq: 2 entries"
    assert lines[-1] == "showing the first 1; --limit shows more, --stream/--error/--since fewer"
    dlq.delete_many({"documentKey": {"$exists": False}, "event.documentKey._id": 2})
    assert main(dlq_command(mongodb_uri, db_name, "list")) == ExitCode.CLEAN_STOP
    assert capsys.readouterr().out.splitlines()[0].rstrip() == f"{db_name}._fw_dlq: 1 entry"


def test_the_list_table_fits_200_columns_when_not_on_a_terminal(
    capsys: pytest.CaptureFixture[str], dlq: Any, mongodb_uri: str, db_name: str
) -> None:
    dlq.insert_one(entry(1, stream="orders-" + "s" * 200))
    assert main(dlq_command(mongodb_uri, db_name, "list")) == ExitCode.CLEAN_STOP
    assert max(len(line) for line in capsys.readouterr().out.splitlines()) == 200


# -- show and purge --------------------------------------------------------------------------------


def test_show_prints_each_entry_whole_in_id_order_as_relaxed_json(
    capsys: pytest.CaptureFixture[str], dlq: Any, mongodb_uri: str, db_name: str
) -> None:
    first, second = entry(1), entry(2)
    dlq.insert_many([first, second])
    ids = [str(second["_id"]), str(first["_id"])]
    assert main(dlq_command(mongodb_uri, db_name, "show", *ids)) == ExitCode.CLEAN_STOP
    out = capsys.readouterr().out
    shown = json.loads("[" + out.replace("}\n{", "},\n{") + "]")
    assert [s["_id"] for s in shown] == [{"$oid": str(first["_id"])}, {"$oid": str(second["_id"])}]
    assert shown[0]["attempts"] == 2 and shown[0]["failedAt"] == {"$date": "2026-11-20T08:00:00Z"}
    assert out.startswith('{\n  "_id": {\n    "$oid": ')


def test_show_names_every_id_it_did_not_find(
    capsys: pytest.CaptureFixture[str], empty_dlq: Any, mongodb_uri: str, db_name: str
) -> None:
    missing = ["0" * 24, "f" * 24]
    assert main(dlq_command(mongodb_uri, db_name, "show", *missing)) == ExitCode.USAGE
    assert one_error_line(capsys.readouterr().err) == (
        f"flowwarden: no entry {missing[0]}, {missing[1]} in {db_name}._fw_dlq (with the other options "
        "given); `flowwarden dlq list` shows the ids"
    )


def test_show_without_an_id_says_how_to_give_one(
    capsys: pytest.CaptureFixture[str], mongodb_uri: str, db_name: str
) -> None:
    assert main(dlq_command(mongodb_uri, db_name, "show")) == ExitCode.USAGE
    assert one_error_line(capsys.readouterr().err) == (
        "flowwarden: dlq show needs the entry's id: flowwarden dlq show ID ..."
    )


@pytest.mark.parametrize(("count", "noun"), [(1, "entry"), (2, "entries")])
def test_purge_says_how_many_it_would_delete_and_then_deleted(
    capsys: pytest.CaptureFixture[str], dlq: Any, mongodb_uri: str, db_name: str, count: int, noun: str
) -> None:
    dlq.insert_many([entry(key) for key in range(count)])
    assert main(dlq_command(mongodb_uri, db_name, "purge")) == ExitCode.USAGE
    assert one_error_line(capsys.readouterr().err) == (
        f"flowwarden: this would delete {count} {noun} from {db_name}._fw_dlq; run it again with --yes to "
        "delete them"
    )
    assert main(dlq_command(mongodb_uri, db_name, "purge", "--yes")) == ExitCode.CLEAN_STOP
    assert capsys.readouterr().out == f"deleted {count} {noun} from {db_name}._fw_dlq\n"


# -- replay ----------------------------------------------------------------------------------------


def replay(uri: str, db: str, handler: str, *options: str) -> list[str]:
    return dlq_command(uri, db, "replay", "--handler", f"dlq_entry_handlers:{handler}", *options)


def test_replay_needs_a_handler_class(
    capsys: pytest.CaptureFixture[str], mongodb_uri: str, db_name: str
) -> None:
    assert main(dlq_command(mongodb_uri, db_name, "replay")) == ExitCode.USAGE
    assert one_error_line(capsys.readouterr().err) == (
        "flowwarden: dlq replay needs --handler module:Class, the class to replay through"
    )


def test_replay_hands_each_entry_to_its_method_in_failure_order_with_its_context(
    capsys: pytest.CaptureFixture[str], dlq: Any, handlers: Any, mongodb_uri: str, db_name: str
) -> None:
    late, early = entry(1, minutes=5), entry(2, minutes=1)
    other_stream = entry(3, stream="payments")
    dlq.insert_many([late, early, other_stream])
    before = datetime.now(timezone.utc)
    assert main(replay(mongodb_uri, db_name, "Orders")) == ExitCode.CLEAN_STOP
    after = datetime.now(timezone.utc)
    assert capsys.readouterr().out.splitlines() == [
        "replaying 2 entries of stream 'orders' through Orders. Replay is at least once: an entry whose "
        "method returned but could not be marked is replayed again next time",
        f"  {early['_id']}: replayed",
        f"  {late['_id']}: replayed",
        "replayed 2, failed 0",
    ]
    # The method's own stream and a batch id from the event's token, on the replaying thread.
    assert handlers.SEEN == [
        ("created", 2, "orders", "dlq-8200000002" + "2B04", 1, True),
        ("created", 1, "orders", "dlq-8200000001" + "2B04", 1, True),
    ]
    marked = dlq.find_one({"_id": early["_id"]})
    assert marked["replayCount"] == 1 and "lastReplayError" not in marked
    replayed_at = marked["replayedAt"].replace(tzinfo=timezone.utc)
    assert before - timedelta(milliseconds=1) <= replayed_at <= after
    assert "replayedAt" not in dlq.find_one({"_id": other_stream["_id"]})


def test_replay_writes_the_time_in_utc_whatever_the_local_zone(
    capsys: pytest.CaptureFixture[str],
    dlq: Any,
    handlers: Any,
    mongodb_uri: str,
    db_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        dlq.insert_one(entry(1))
        before = datetime.now(timezone.utc)
        assert main(replay(mongodb_uri, db_name, "Orders")) == ExitCode.CLEAN_STOP
        after = datetime.now(timezone.utc)
    finally:
        monkeypatch.undo()
        time.tzset()
    replayed_at = dlq.find_one({})["replayedAt"].replace(tzinfo=timezone.utc)
    assert before - timedelta(milliseconds=1) <= replayed_at <= after


def test_replay_awaits_an_async_method(
    capsys: pytest.CaptureFixture[str], dlq: Any, handlers: Any, mongodb_uri: str, db_name: str
) -> None:
    dlq.insert_one(entry(1, operation="update"))
    assert main(replay(mongodb_uri, db_name, "Orders")) == ExitCode.CLEAN_STOP
    assert handlers.SEEN == [("updated", 1)]


def test_replay_retries_under_the_classs_policy_and_logs_each_retry(
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
    dlq: Any,
    handlers: Any,
    mongodb_uri: str,
    db_name: str,
) -> None:
    dlq.insert_one(entry(1, document={"fail": "once"}))
    caplog.set_level(logging.WARNING)
    assert main(replay(mongodb_uri, db_name, "Orders")) == ExitCode.CLEAN_STOP
    assert [attempt for *_, attempt, _ in handlers.SEEN] == [1, 2]
    (retry,) = [r for r in caplog.records if "retrying" in r.getMessage()]
    assert retry.name == "flowwarden.runtime.invoke"
    message = retry.getMessage()
    assert message.startswith("stream orders: Orders.created failed (attempt 1 of 2), retrying in ")


def test_entries_that_cannot_be_replayed_are_marked_and_counted_and_the_rest_go_on(
    capsys: pytest.CaptureFixture[str], dlq: Any, handlers: Any, mongodb_uri: str, db_name: str
) -> None:
    no_event = {**entry(1, minutes=1), "event": None}
    no_method = entry(2, minutes=2, operation="delete")
    refused = entry(3, minutes=3, document={"fail": "always"})
    fine = entry(4, minutes=4)
    dlq.insert_many([no_event, no_method, refused, fine])
    before = datetime.now(timezone.utc)
    assert main(replay(mongodb_uri, db_name, "Orders")) == ExitCode.FAILED
    captured = capsys.readouterr()
    assert captured.out.splitlines()[1:] == [
        f"  {no_event['_id']}: failed: the entry holds no event to replay",
        f"  {no_method['_id']}: failed: Orders has no method for 'delete'",
        f"  {refused['_id']}: failed: {dlq.find_one({'_id': refused['_id']})['lastReplayError']}",
        f"  {fine['_id']}: replayed",
        "replayed 1, failed 3",
    ]
    assert one_error_line(captured.err, logged=True) == (
        "flowwarden: 3 entries failed again (lastReplayError says why; they stay in the queue); fix the "
        "cause and replay them again"
    )
    for failed in (no_event, no_method, refused):
        marked = dlq.find_one({"_id": failed["_id"]})
        assert "replayedAt" not in marked
        attempted_at = marked["lastReplayAttemptAt"].replace(tzinfo=timezone.utc)
        assert attempted_at >= before - timedelta(milliseconds=1)
    assert "order 3 refused" in dlq.find_one({"_id": refused["_id"]})["lastReplayError"]


def test_one_entry_failing_again_is_said_in_the_singular(
    capsys: pytest.CaptureFixture[str], dlq: Any, handlers: Any, mongodb_uri: str, db_name: str
) -> None:
    dlq.insert_one(entry(1, document={"fail": "always"}))
    assert main(replay(mongodb_uri, db_name, "Orders")) == ExitCode.FAILED
    captured = capsys.readouterr()
    assert captured.out.splitlines()[0].startswith("replaying 1 entry of stream 'orders' through Orders.")
    assert one_error_line(captured.err, logged=True).startswith("flowwarden: 1 entry failed again (")


def test_replay_with_nothing_to_replay_says_so(
    capsys: pytest.CaptureFixture[str], empty_dlq: Any, handlers: Any, mongodb_uri: str, db_name: str
) -> None:
    assert main(replay(mongodb_uri, db_name, "Orders")) == ExitCode.CLEAN_STOP
    assert capsys.readouterr().out == (
        f"no entries of stream 'orders' in {db_name}._fw_dlq that were not replayed before (--again takes "
        "those too) match\n"
    )
    assert main(replay(mongodb_uri, db_name, "Orders", "--again")) == ExitCode.CLEAN_STOP
    assert capsys.readouterr().out == f"no entries of stream 'orders' in {db_name}._fw_dlq match\n"


def test_replay_through_a_partitioned_class_takes_its_buckets_entries_only(
    capsys: pytest.CaptureFixture[str], dlq: Any, handlers: Any, mongodb_uri: str, db_name: str
) -> None:
    dlq.insert_many(
        [entry(1, stream="orders[0/2]"), entry(2, stream="orders[1/2]", minutes=1), entry(3, minutes=2)]
    )
    assert main(replay(mongodb_uri, db_name, "Buckets")) == ExitCode.CLEAN_STOP
    assert handlers.SEEN == [("bucket", 1, "orders[0/2]"), ("bucket", 2, "orders[1/2]")]


def test_replay_refuses_a_stream_that_is_not_the_classs_unless_told(
    capsys: pytest.CaptureFixture[str], dlq: Any, handlers: Any, mongodb_uri: str, db_name: str
) -> None:
    dlq.insert_one(entry(1, stream="payments"))
    assert main(replay(mongodb_uri, db_name, "Buckets", "--stream", "payments")) == ExitCode.USAGE
    assert one_error_line(capsys.readouterr().err) == (
        "flowwarden: --stream 'payments' is not Buckets's stream ('orders[0/2]', 'orders[1/2]'); replay "
        "the entries of a stream through its own class, or give --any-stream to do it anyway"
    )
    assert main(replay(mongodb_uri, db_name, "Orders", "--stream", "payments", "--any-stream")) == 0
    assert handlers.SEEN[0][:3] == ("created", 1, "payments")


def test_a_batch_method_gets_the_event_as_a_batch_of_one_in_a_worker_thread(
    capsys: pytest.CaptureFixture[str], dlq: Any, handlers: Any, mongodb_uri: str, db_name: str
) -> None:
    dlq.insert_one(entry(1))
    assert main(replay(mongodb_uri, db_name, "Batches")) == ExitCode.CLEAN_STOP
    assert handlers.SEEN == [("batch", ["ChangeEvent"], [1], False)]


# -- ties, edges and the command line --------------------------------------------------------------


def test_entries_that_failed_at_the_same_time_are_listed_shown_and_replayed_in_id_order(
    capsys: pytest.CaptureFixture[str], dlq: Any, handlers: Any, mongodb_uri: str, db_name: str
) -> None:
    first, second = entry(1), entry(2)  # the same failedAt; second's id is the higher
    dlq.insert_many([second, first])  # stored in the other order
    assert [e["documentKey"] for e in listed(capsys, mongodb_uri, db_name)] == [1, 2]
    assert main(dlq_command(mongodb_uri, db_name, "show", str(second["_id"]), str(first["_id"]))) == 0
    shown = capsys.readouterr().out
    assert shown.index(str(first["_id"])) < shown.index(str(second["_id"]))
    assert main(replay(mongodb_uri, db_name, "Orders")) == ExitCode.CLEAN_STOP
    assert [key for _, key, *_ in handlers.SEEN] == [1, 2]


def test_the_table_shows_an_error_type_without_a_module_and_one_with_none(
    capsys: pytest.CaptureFixture[str], dlq: Any, mongodb_uri: str, db_name: str
) -> None:
    dlq.insert_many(
        [entry(1, errorType="Refused", message="no"), entry(2, minutes=1, errorType=None, message="no")]
    )
    assert main(dlq_command(mongodb_uri, db_name, "list")) == ExitCode.CLEAN_STOP
    cells = [line.split("│")[6].strip() for line in capsys.readouterr().out.splitlines() if "│" in line]
    assert cells == ["Refused: no", ": no"]


@pytest.mark.parametrize(("length", "shown"), [(60, 60), (61, 60)])
def test_an_error_of_more_than_60_characters_is_cut_to_60(
    capsys: pytest.CaptureFixture[str], dlq: Any, mongodb_uri: str, db_name: str, length: int, shown: int
) -> None:
    message = "m" * (length - len("Refused: "))
    dlq.insert_one(entry(1, errorType="Refused", message=message))
    assert main(dlq_command(mongodb_uri, db_name, "list")) == ExitCode.CLEAN_STOP
    (cell,) = [line.split("│")[6].strip() for line in capsys.readouterr().out.splitlines() if "│" in line]
    whole = "Refused: " + message
    assert cell == (whole if length <= 60 else whole[:57] + "...") and len(cell) == shown


def test_list_shows_50_entries_unless_told(
    capsys: pytest.CaptureFixture[str], dlq: Any, mongodb_uri: str, db_name: str
) -> None:
    dlq.insert_many([entry(key, minutes=key) for key in range(51)])
    assert len(listed(capsys, mongodb_uri, db_name)) == 50


def test_the_failed_count_counts_every_kind_of_failure(
    capsys: pytest.CaptureFixture[str], dlq: Any, handlers: Any, mongodb_uri: str, db_name: str
) -> None:
    dlq.insert_many(
        [
            entry(1, minutes=1, document={"fail": "always"}),
            {**entry(2, minutes=2), "event": None},
            {**entry(3, minutes=3), "event": None},
        ]
    )
    assert main(replay(mongodb_uri, db_name, "Orders")) == ExitCode.FAILED
    assert capsys.readouterr().out.splitlines()[-1] == "replayed 0, failed 3"


def test_an_event_whose_token_has_no_data_replays_without_a_batch_id(
    capsys: pytest.CaptureFixture[str], dlq: Any, handlers: Any, mongodb_uri: str, db_name: str
) -> None:
    odd = entry(1)
    odd["event"]["_id"] = {"not": "a token"}
    plain = entry(2, minutes=1)
    plain["event"]["_id"] = "82AB"
    dlq.insert_many([odd, plain])
    assert main(replay(mongodb_uri, db_name, "Orders")) == ExitCode.CLEAN_STOP
    assert [(key, batch_id) for _, key, _, batch_id, *_ in handlers.SEEN] == [(1, None), (2, None)]


def test_replay_of_one_bucket_of_a_partitioned_class(
    capsys: pytest.CaptureFixture[str], dlq: Any, handlers: Any, mongodb_uri: str, db_name: str
) -> None:
    dlq.insert_many([entry(1, stream="orders[0/2]"), entry(2, stream="orders[1/2]", minutes=1)])
    assert main(replay(mongodb_uri, db_name, "Buckets", "--stream", "orders[1/2]")) == ExitCode.CLEAN_STOP
    assert handlers.SEEN == [("bucket", 2, "orders[1/2]")]


def test_a_failed_replay_writes_its_time_in_utc_whatever_the_local_zone(
    capsys: pytest.CaptureFixture[str],
    dlq: Any,
    handlers: Any,
    mongodb_uri: str,
    db_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        dlq.insert_one({**entry(1), "event": None})
        before = datetime.now(timezone.utc)
        assert main(replay(mongodb_uri, db_name, "Orders")) == ExitCode.FAILED
        after = datetime.now(timezone.utc)
    finally:
        monkeypatch.undo()
        time.tzset()
    attempted_at = dlq.find_one({})["lastReplayAttemptAt"].replace(tzinfo=timezone.utc)
    assert before - timedelta(milliseconds=1) <= attempted_at <= after


class Converter:
    """flowwarden.spark's events_to_dataframe and session, without Spark: what replay asks of
    them; an event whose document's qty is not a number comes back as malformed."""

    def __init__(self, unfit: Any) -> None:
        self.unfit = unfit
        self.calls: list[tuple[Any, list[Any], Any, Any]] = []

    def session(self) -> str:
        return "session"

    def events_to_dataframe(
        self, spark: Any, events: list[Any], *, schema: Any, mode: Any
    ) -> tuple[Any, Any]:
        self.calls.append((spark, events, schema, mode))
        fits = all(isinstance(e["fullDocument"].get("qty", 0), int) for e in events)
        return f"a frame of {len(events)}", [] if fits else [self.unfit]


FRAMES = """
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
                SEEN.append(df)

        return Frames


    Dropping = frames("DROPMALFORMED")
    Keeping = frames("PERMISSIVE")
"""


@pytest.fixture
def frame_handlers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    (tmp_path / "dlq_fake_frames.py").write_text(textwrap.dedent(FRAMES))
    monkeypatch.syspath_prepend(str(tmp_path))
    import dlq_fake_frames  # type: ignore[import-not-found]

    yield dlq_fake_frames
    sys.modules.pop("dlq_fake_frames", None)


@pytest.mark.parametrize(("handler", "refused"), [("Dropping", True), ("Keeping", False)])
def test_a_dataframe_class_gets_the_event_converted_with_its_schema_and_mode(
    capsys: pytest.CaptureFixture[str],
    dlq: Any,
    frame_handlers: Any,
    mongodb_uri: str,
    db_name: str,
    monkeypatch: pytest.MonkeyPatch,
    handler: str,
    refused: bool,
) -> None:
    import flowwarden.spark
    from flowwarden.config import SchemaMode
    from flowwarden.spark.convert.misfits import MalformedRow

    unfit = MalformedRow(
        index=0, token={"_data": "82"}, field="full_document.qty", error="expected int, got str"
    )
    converter = Converter(unfit)
    monkeypatch.setattr(flowwarden.spark, "events_to_dataframe", converter.events_to_dataframe)
    monkeypatch.setattr(flowwarden.spark, "get_or_create_session", converter.session)
    stored = entry(1, document={"qty": "lots"})
    dlq.insert_many([stored, entry(2, minutes=1)])
    code = main(dlq_command(mongodb_uri, db_name, "replay", "--handler", f"dlq_fake_frames:{handler}"))
    assert code == (ExitCode.FAILED if refused else ExitCode.CLEAN_STOP)
    mode = SchemaMode.DROPMALFORMED if refused else SchemaMode.PERMISSIVE
    asked = [
        (spark, [e["documentKey"]["_id"] for e in events], schema, m)
        for spark, events, schema, m in converter.calls
    ]
    assert asked == [
        ("session", [1], frame_handlers.Item, mode),
        ("session", [2], frame_handlers.Item, mode),
    ]
    if refused:
        assert frame_handlers.SEEN == ["a frame of 1"]
        assert capsys.readouterr().out.splitlines()[1:] == [
            f"  {stored['_id']}: failed: field 'full_document.qty' does not fit the schema: expected "
            "int, got str; under mode=DROPMALFORMED the method would get no row for it. Fix the "
            "schema (or the document) and replay again",
            f"  {dlq.find_one({'event.documentKey._id': 2})['_id']}: replayed",
            "replayed 1, failed 1",
        ]
    else:
        assert frame_handlers.SEEN == ["a frame of 1", "a frame of 1"]


def test_an_entry_that_cannot_be_converted_is_marked_failed_and_the_rest_go_on(
    capsys: pytest.CaptureFixture[str],
    dlq: Any,
    frame_handlers: Any,
    mongodb_uri: str,
    db_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import flowwarden.spark

    def no_session() -> Any:
        raise RuntimeError("no Spark session can start here")

    monkeypatch.setattr(flowwarden.spark, "get_or_create_session", no_session)
    first, second = entry(1), entry(2, minutes=1)
    dlq.insert_many([first, second])
    code = main(dlq_command(mongodb_uri, db_name, "replay", "--handler", "dlq_fake_frames:Keeping"))
    assert code == ExitCode.FAILED
    assert capsys.readouterr().out.splitlines()[1:] == [
        f"  {first['_id']}: failed: no Spark session can start here",
        f"  {second['_id']}: failed: no Spark session can start here",
        "replayed 0, failed 2",
    ]
    assert dlq.find_one({"_id": second["_id"]})["lastReplayError"] == "no Spark session can start here"


def test_the_command_line_refuses_an_unknown_action_and_a_missing_database(
    capsys: pytest.CaptureFixture[str], mongodb_uri: str
) -> None:
    assert main(["dlq", "frobnicate", "--uri", mongodb_uri, "--database", "shop"]) == ExitCode.USAGE
    assert "invalid choice: 'frobnicate'" in capsys.readouterr().err
    assert main(["dlq", "list", "--uri", mongodb_uri]) == ExitCode.USAGE
    assert "the following arguments are required: --database" in capsys.readouterr().err


def test_the_dlq_command_is_listed_in_the_help_with_what_it_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--help"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("dlq ")]
    assert line.split(None, 1)[1] == "list, show, replay or purge dead-lettered events"
