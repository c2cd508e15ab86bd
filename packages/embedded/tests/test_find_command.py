"""The find command's fields, checked as MongoDB checks them: a field it does not know is refused
(40415), not ignored, and ``$natural`` takes 1 or -1 only (BadValue otherwise, MongoDB 7.0+), on a
collection and on a member's ``local.oplog.rs``."""

from __future__ import annotations

from typing import Any

import pymongo
import pytest
from bson import Decimal128, Int64
from pymongo.errors import OperationFailure


@pytest.fixture
def coll(client: pymongo.MongoClient, db_name: str) -> Any:
    collection = client[db_name].items
    collection.insert_many([{"_id": i, "n": i} for i in range(5)])
    return collection


def test_every_option_pymongo_sends_with_a_find_is_accepted(coll: Any) -> None:
    found = coll.find(
        {"n": {"$gte": 1}},
        projection={"n": 1},
        sort=[("n", -1)],
        skip=1,
        limit=2,
        batch_size=1,
        comment="every option",
        max_time_ms=10_000,
        allow_disk_use=True,
        let={"x": 1},
        no_cursor_timeout=True,
        allow_partial_results=True,
    )
    assert [document["n"] for document in found] == [3, 2]


def test_a_field_find_does_not_know_is_refused_by_name(client: pymongo.MongoClient, coll: Any) -> None:
    with pytest.raises(OperationFailure) as refused:
        client[coll.database.name].command({"find": coll.name, "filtre": {"n": 1}})
    assert refused.value.code == 40415
    assert "BSON field 'find.filtre' is an unknown field." in str(refused.value)


def _find(client: pymongo.MongoClient, db: str, collection: str, **fields: Any) -> list[Any]:
    """A find sent as the command (PyMongo's find() refuses some sort values itself)."""
    reply = client[db].command({"find": collection, **fields})
    return list(reply["cursor"]["firstBatch"])


@pytest.mark.parametrize("direction", [-1, Int64(-1), Decimal128("-1"), -1.0])
def test_natural_minus_one_in_any_numeric_type_reads_newest_first(
    client: pymongo.MongoClient, coll: Any, direction: Any
) -> None:
    found = _find(client, coll.database.name, coll.name, sort={"$natural": direction})
    assert [document["_id"] for document in found] == [4, 3, 2, 1, 0]


@pytest.mark.parametrize("direction", [2, -2, 0, 1.5, "1", True])
def test_natural_takes_one_or_minus_one_only(
    client: pymongo.MongoClient, coll: Any, direction: Any
) -> None:
    with pytest.raises(OperationFailure) as on_collection:
        _find(client, coll.database.name, coll.name, sort={"$natural": direction})
    assert on_collection.value.code == 2
    with pytest.raises(OperationFailure) as on_the_oplog:
        _find(client, "local", "oplog.rs", sort={"$natural": direction}, limit=1)
    assert on_the_oplog.value.code == 2
    (newest,) = _find(client, "local", "oplog.rs", sort={"$natural": -1}, limit=1)
    (oldest,) = _find(client, "local", "oplog.rs", sort={"$natural": 1}, limit=1)
    assert oldest["ts"] < newest["ts"]
