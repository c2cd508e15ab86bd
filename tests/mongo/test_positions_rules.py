"""flowwarden.mongo.positions on its own: which errors refuse a position, where a reply's cluster
time is, when a stored position is ahead of the server, and where a stream goes on after lost
history."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pytest
from bson import Timestamp
from pymongo.errors import OperationFailure

from flowwarden.checkpoints.contract import sample_token
from flowwarden.config import OnHistoryLost
from flowwarden.errors import HistoryLostError
from flowwarden.events import InvalidTokenError
from flowwarden.mongo.positions import (
    FUTURE_TOLERANCE_SECONDS,
    ahead_of_server,
    cluster_time_of,
    reachable,
    recover_from_history_loss,
    refused_position,
)

SERVER = Timestamp(1_700_000_000, 5)


class Description:
    def __init__(self, writable: bool | Exception) -> None:
        self.writable = writable

    def has_writable_server(self) -> bool:
        if isinstance(self.writable, Exception):
            raise self.writable
        return self.writable


class Client:
    def __init__(self, description: Any) -> None:
        self.topology_description = description


def test_a_client_is_reachable_while_its_monitors_know_a_writable_server() -> None:
    assert reachable(Client(Description(True))) is True
    assert reachable(Client(Description(False))) is False
    assert reachable(object()) is True, "a client without a topology description"
    assert reachable(Client(Description(RuntimeError("unfamiliar")))) is True


@pytest.mark.parametrize(
    ("code", "message", "refused"),
    [
        (9, "FailedToParse", True),
        (260, "InvalidResumeToken", True),
        (40649, "token too short", True),
        (280, "cannot resume stream; the Resume Token was not found", True),
        (280, "change stream fatal error", False),
        (286, "ChangeStreamHistoryLost", False),
        (13, "Unauthorized", False),
    ],
)
def test_a_position_is_refused_by_the_server_on_these_codes_only(
    code: int, message: str, refused: bool
) -> None:
    assert refused_position(OperationFailure(message, code)) is refused


def test_the_cluster_time_of_a_reply_is_its_cluster_time_else_its_operation_time() -> None:
    later = Timestamp(1_700_000_100, 1)
    assert cluster_time_of({"$clusterTime": {"clusterTime": SERVER}, "operationTime": later}) == SERVER
    assert cluster_time_of({"$clusterTime": {"signature": {}}, "operationTime": later}) == later
    assert cluster_time_of({"$clusterTime": "not a document", "operationTime": later}) == later
    assert cluster_time_of({"operationTime": later}) == later
    assert cluster_time_of({"$clusterTime": {"clusterTime": 5}, "operationTime": "now"}) is None
    assert cluster_time_of({"ok": 1}) is None


def test_a_position_more_than_30_seconds_ahead_of_the_server_is_refused_with_both_times() -> None:
    assert FUTURE_TOLERANCE_SECONDS == 30
    at_the_limit = sample_token(SERVER.time + FUTURE_TOLERANCE_SECONDS, 9)
    assert ahead_of_server(at_the_limit, SERVER) is None
    assert ahead_of_server(sample_token(SERVER.time - 100), SERVER) is None
    assert ahead_of_server(sample_token(SERVER.time + 31), None) is None, "no server time: nothing to compare"
    assert ahead_of_server(sample_token(SERVER.time + 31), SERVER) == (
        "its cluster time 2023-11-14T22:13:51+00:00 is ahead of the server's (2023-11-14T22:13:20+00:00); it "
        "was written by another deployment or by hand, and the server would wait until then before "
        "delivering anything"
    )


def test_a_position_that_is_not_a_token_is_refused_before_any_comparison() -> None:
    with pytest.raises(InvalidTokenError):
        ahead_of_server({"_data": "zz"}, SERVER)


OLDEST = Timestamp(1_700_000_000, 1)
NEWEST = Timestamp(1_700_003_600, 1)
LOST_FROM = datetime(2023, 11, 14, 21, 0, tzinfo=timezone.utc)


def recover(strategy: OnHistoryLost, oldest: Timestamp | None, newest: Timestamp | None = NEWEST) -> Any:
    return recover_from_history_loss(
        strategy,
        stream="orders",
        lost_from=LOST_FROM,
        oldest=oldest,
        newest=newest,
        error=OperationFailure("resume point no longer in the oplog", 286),
    )


def test_fail_raises_history_lost_naming_the_last_position_and_the_oplog_window() -> None:
    with pytest.raises(HistoryLostError) as raised:
        recover(OnHistoryLost.FAIL, OLDEST)
    error = raised.value
    assert (error.stream, error.checkpoint_time) == ("orders", LOST_FROM)
    assert (error.oplog_start, error.oplog_end) == (
        datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc),
        datetime(2023, 11, 14, 23, 13, 20, tzinfo=timezone.utc),
    )
    assert error.server_message == "resume point no longer in the oplog"
    assert isinstance(error.__cause__, OperationFailure)
    with pytest.raises(HistoryLostError) as unread:
        recover(OnHistoryLost.FAIL, None, None)
    assert (unread.value.oplog_start, unread.value.oplog_end) == (None, None)


def test_resume_from_oplog_start_goes_on_at_the_oldest_entry() -> None:
    recovery = recover(OnHistoryLost.RESUME_FROM_OPLOG_START, OLDEST)
    assert recovery.start == {"start_at_operation_time": OLDEST}
    assert recovery.lost_to == datetime(2023, 11, 14, 22, 13, 20, tzinfo=timezone.utc)
    assert recovery.fell_back is False


@pytest.mark.parametrize(
    ("strategy", "fell_back"),
    [(OnHistoryLost.RESUME_FROM_OPLOG_START, True), (OnHistoryLost.RESUME_FROM_NOW, False)],
    ids=["oplog start unreadable", "from now"],
)
def test_without_the_oldest_entry_or_from_now_a_stream_goes_on_now(
    strategy: OnHistoryLost, fell_back: bool
) -> None:
    before = datetime.now(timezone.utc)
    recovery = recover(strategy, None if fell_back else OLDEST)
    after = datetime.now(timezone.utc)
    assert recovery.start == {}
    assert before <= recovery.lost_to <= after and recovery.lost_to.tzinfo is not None
    assert recovery.fell_back is fell_back
