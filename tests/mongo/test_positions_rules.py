"""flowwarden.mongo.positions on its own: which errors refuse a position, where a reply's cluster
time is, when a stored position is ahead of the server, where a stream goes on after lost
history, how a stream's opening token is read, and how the oplog's edges are read (and why not,
said once per reason) on clients of in-memory replica sets and sharded clusters."""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from types import SimpleNamespace
from typing import Any

import pytest
from bson import Timestamp
from pymongo.errors import ConnectionFailure, OperationFailure

from flowwarden.checkpoints.contract import sample_token
from flowwarden.config import OnHistoryLost
from flowwarden.errors import HistoryLostError
from flowwarden.events import InvalidTokenError
from flowwarden.mongo import positions
from flowwarden.mongo.positions import (
    FUTURE_TOLERANCE_SECONDS,
    SHARD_PRIVILEGES,
    ahead_of_server,
    cluster_time_of,
    open_change_stream,
    opening_token,
    oplog_edge,
    oplog_window_async,
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


class Database:
    """A database whose ``command`` returns ``reply``, or raises it when it is an error."""

    def __init__(self, reply: Any) -> None:
        self.reply = reply

    def command(self, *args: Any, **kwargs: Any) -> Any:
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply


class Mongos:
    """A client of a mongos (``hello`` says ``isdbgrid``) whose ``config`` database answers a
    command with ``config``."""

    def __init__(self, config: Any) -> None:
        self.admin = Database({"msg": "isdbgrid"})
        self.config = Database(config)

    def __getitem__(self, name: str) -> Database:
        assert name == "config", f"only config is read through the mongos, not {name}"
        return self.config


def positions_records(caplog: pytest.LogCaptureFixture) -> list[tuple[int, str]]:
    return [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "flowwarden.mongo.positions"]


@pytest.mark.parametrize(
    ("error", "said"),
    [
        (
            OperationFailure(
                "not authorized on config",
                13,
                {"ok": 0, "errmsg": "not authorized on config", "code": 13, "codeName": "Unauthorized"},
            ),
            "not authorized on config (Unauthorized 13)",
        ),
        (OperationFailure("not authorized on config", 13), "not authorized on config (code 13)"),
    ],
    ids=["server reply", "no details"],
)
def test_an_unreadable_shard_list_is_said_once_at_warning_with_the_servers_message_then_at_debug(
    error: OperationFailure, said: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(positions, "_REPORTED", set())
    caplog.set_level(logging.DEBUG, logger="flowwarden.mongo.positions")
    mongos = Mongos(error)
    assert oplog_edge(mongos, 1) is None
    assert oplog_edge(mongos, -1) is None
    message = f"cannot list the shards in config.shards: {said}; {SHARD_PRIVILEGES}"
    assert positions_records(caplog) == [(logging.WARNING, message), (logging.DEBUG, message)]
    # Another error is another reason: a WARNING again.
    assert oplog_edge(Mongos(OperationFailure("interrupted at shutdown", 11600)), 1) is None
    assert positions_records(caplog)[2:] == [
        (
            logging.WARNING,
            "cannot list the shards in config.shards: interrupted at shutdown (code 11600); "
            + SHARD_PRIVILEGES,
        )
    ]


class Oplog:
    def __init__(self, answer: Any) -> None:
        self.answer = answer

    def find_one(self, **kwargs: Any) -> Any:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


class Cluster:
    """A client of an in-memory sharded cluster, of the kind :func:`shard_client_for` derives a
    shard's client from: ``answers`` maps each host to what answers there (the mongos: its
    config.shards reply; a shard: its oplog entry, or the error a find on it raises)."""

    answers: dict[str, Any] = {}

    def __init__(self, host: str | list[str], **kwargs: Any) -> None:
        self._init_kwargs: Any = {"host": host, **kwargs}
        self.options = SimpleNamespace(pool_options=SimpleNamespace(_credentials=None))
        self.answer = self.answers[host if isinstance(host, str) else ",".join(host)]
        self.admin = Database({"msg": "isdbgrid"} if host == "mongos:27017" else {"ok": 1})

    def __getitem__(self, name: str) -> Any:
        if name == "config":
            return Database(self.answer)
        return {"oplog.rs": Oplog(self.answer)}

    def close(self) -> None:
        pass


def listing(*hosts: str) -> dict[str, Any]:
    shards = [{"_id": host.partition("/")[0], "host": host} for host in hosts]
    return {"cursor": {"firstBatch": shards}, "ok": 1}


@pytest.mark.parametrize(
    ("failure", "said"),
    [
        (
            OperationFailure("not authorized on local", 13),
            "cannot read local.oplog.rs on shard '{0}' ({0}/{1}): not authorized on local (code 13); "
            + SHARD_PRIVILEGES,
        ),
        (
            ConnectionFailure("connection refused"),
            "cannot reach shard '{0}' at {0}/{1}: connection refused; reading a shard's oplog needs the "
            "hosts config.shards names for it to be reachable from this process",
        ),
        (
            None,
            "cannot connect to shard '{0}' ({0}/{1}): cannot derive a client for the shard from a "
            "Cluster (it does not keep the arguments it was created with)",
        ),
    ],
    ids=["unauthorized", "unreachable", "no client"],
)
def test_each_shard_that_cannot_be_read_is_warned_about_once_then_logged_at_debug(
    failure: Exception | None,
    said: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(positions, "_REPORTED", set())
    caplog.set_level(logging.DEBUG, logger="flowwarden.mongo.positions")
    hosts = {"shard0": "db0:27018", "shard1": "db1:27018"}
    monkeypatch.setattr(Cluster, "answers", {"mongos:27017": None, **{h: failure for h in hosts.values()}})
    mongos = Cluster("mongos:27017")
    if failure is None:
        mongos._init_kwargs = None  # a client that does not keep its arguments
    for shard in ("shard0", "shard1", "shard0"):
        mongos.answer = listing(f"{shard}/{hosts[shard]}")
        assert oplog_edge(mongos, 1) is None
    assert positions_records(caplog) == [
        (logging.WARNING, said.format("shard0", hosts["shard0"])),
        (logging.WARNING, said.format("shard1", hosts["shard1"])),
        (logging.DEBUG, said.format("shard0", hosts["shard0"])),
    ]


def test_through_a_mongos_the_edge_is_the_newest_of_the_shards_and_unknown_when_one_has_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    older, newer = Timestamp(1_700_000_000, 1), Timestamp(1_700_000_050, 1)
    answers = {"mongos:27017": listing("shard0/db0:27018", "shard1/db1:27018")}
    monkeypatch.setattr(
        Cluster, "answers", {**answers, "db0:27018": {"ts": newer}, "db1:27018": {"ts": older}}
    )
    assert oplog_edge(Cluster("mongos:27017"), 1) == newer
    monkeypatch.setattr(Cluster, "answers", {**answers, "db0:27018": {"ts": newer}, "db1:27018": None})
    assert oplog_edge(Cluster("mongos:27017"), 1) is None


class OplogCollection:
    """``local.oplog.rs`` as ``find_one`` reads it: entries in ``$natural`` order, either way."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries

    def find_one(
        self, filter: Any = None, projection: Any = None, sort: list[tuple[str, int]] | None = None
    ) -> Any:
        entries = self.entries
        if sort and sort[0][0] == "$natural" and sort[0][1] < 0:
            entries = entries[::-1]
        if not entries:
            return None
        entry = entries[0]
        return {k: v for k, v in entry.items() if k == "_id" or not projection or projection.get(k)}


class Member:
    """A client of a replica set member: answers ``hello`` (and no other command, as MongoDB answers
    an unknown one) and reads its ``local.oplog.rs``."""

    def __init__(self, entries: list[dict[str, Any]]) -> None:
        self.entries = entries
        self.admin = self

    def command(self, name: str, *args: Any, **kwargs: Any) -> Any:
        if name != "hello":
            raise OperationFailure(f"no such command: '{name}'", 59)
        return {"isWritablePrimary": True, "setName": "rs0", "ok": 1}

    def __getitem__(self, name: str) -> dict[str, OplogCollection]:
        return {"oplog.rs": OplogCollection(self.entries if name == "local" else [])}


def test_on_a_replica_set_the_edges_are_its_oldest_and_newest_entries_or_unknown() -> None:
    oldest, middle, newest = (Timestamp(1_700_000_000 + i, 1) for i in range(3))
    member = Member([{"ts": oldest, "op": "n"}, {"ts": middle, "op": "i"}, {"ts": newest, "op": "i"}])
    assert (oplog_edge(member, 1), oplog_edge(member, -1)) == (oldest, newest)
    assert asyncio.run(oplog_window_async(member)) == (oldest, newest)
    assert oplog_edge(Member([]), 1) is None, "an empty oplog"
    assert oplog_edge(Member([{"op": "n"}]), -1) is None, "an entry without a ts"


def test_on_a_replica_set_an_oplog_this_user_cannot_read_is_unknown(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: OplogCollection, **kwargs: Any) -> Any:
        raise OperationFailure("not authorized on local", 13)

    monkeypatch.setattr(OplogCollection, "find_one", refuse)
    assert asyncio.run(oplog_window_async(Member([{"ts": SERVER}]))) == (None, None)


class OpeningStream:
    def __init__(self, token: Any, entered: BaseException | None = None) -> None:
        self.resume_token = token
        self.entered = entered
        self.entered_at_open = False
        self.closed = False

    def close(self) -> None:
        self.closed = True


class AsyncOpeningStream(OpeningStream):
    """motor's kind of stream: the server's answer to the open comes when its context is entered."""

    async def __aenter__(self) -> AsyncOpeningStream:
        if self.entered is not None:
            raise self.entered
        self.entered_at_open = True
        return self


class Watched:
    def __init__(self, stream: OpeningStream) -> None:
        self.stream = stream
        self.options: dict[str, Any] = {}

    def watch(self, **options: Any) -> OpeningStream:
        self.options = options
        return self.stream


def test_the_opening_token_is_the_empty_first_batchs_resume_token_and_the_stream_is_closed() -> None:
    token = {"_data": "8265A1B2C3000000012B0429296E1404"}
    target = Watched(OpeningStream(token))
    start = {"start_at_operation_time": SERVER}
    opened = asyncio.run(opening_token(target, start, batch_size=500, full_document="updateLookup"))
    assert opened == token and type(opened) is dict
    # batchSize 0 replaces the stream's own, so that the first batch is empty.
    assert target.options == {
        "batch_size": 0,
        "full_document": "updateLookup",
        "start_at_operation_time": SERVER,
    }
    assert target.stream.closed


def test_a_first_batch_without_a_resume_token_fails_the_open_and_closes_the_stream() -> None:
    target = Watched(OpeningStream(None))
    with pytest.raises(OperationFailure) as raised:
        asyncio.run(opening_token(target, {}))
    assert str(raised.value) == (
        "the server returned no postBatchResumeToken for a change stream's first batch; "
        "MongoDB 4.0.7+ replica sets and sharded clusters send one"
    )
    assert target.stream.closed


def test_a_stream_that_opens_on_entering_its_context_is_opened_before_open_change_stream_returns() -> None:
    stream = AsyncOpeningStream({"_data": "82"})
    assert asyncio.run(open_change_stream(Watched(stream), batch_size=1)) is stream
    assert stream.entered_at_open
    refused = AsyncOpeningStream(None, entered=OperationFailure("resume token not found", 280))
    with pytest.raises(OperationFailure, match="resume token not found"):
        asyncio.run(open_change_stream(Watched(refused)))
