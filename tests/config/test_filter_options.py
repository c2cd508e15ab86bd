"""@event_filter, collections/exclude_collections, exclude_fields and hash_fields: what decoration
accepts, what it refuses (a ConfigurationError naming the option), and the stages it makes."""

from __future__ import annotations

from typing import Any

import pytest

from flowwarden import ChangeEvent, change_stream, event_filter, on_batch, on_change, on_insert, stream_spec
from flowwarden.errors import ConfigurationError


def refusal(decorate: Any) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as caught:

        @decorate
        class Handler:
            @on_change
            def handle(self, event: ChangeEvent) -> None: ...

    return caught.value


@pytest.mark.parametrize(
    ("options", "option", "said"),
    [
        ({"database": "shop", "collections": ["re:orders("]}, "collections", "not a regular expression"),
        ({"database": "shop", "exclude_collections": ["re:[a-"]}, "exclude_collections", "not a regular"),
        ({"database": "shop", "collections": ["re:"]}, "collections", "no pattern"),
        ({"database": "shop", "collections": []}, "collections", "select no collection"),
        ({"database": "shop", "collections": "orders"}, "collections", "not a single value"),
        ({"database": "shop", "collections": ["or$ders"]}, "collections", "contains '$'"),
        (
            {"collection": "orders", "database": "shop", "collections": ["orders"]},
            "collections",
            "one collection",
        ),
        (
            {"collection": "orders", "database": "shop", "exclude_collections": ["x"]},
            "exclude_collections",
            "one collection",
        ),
        ({"collections": ["orders"]}, "collections", "'shop.orders'"),
        ({"exclude_collections": ["a/b.orders"]}, "exclude_collections", "database name"),
        ({"database": "shop", "exclude_fields": ["_id"]}, "exclude_fields", "_id"),
        ({"database": "shop", "exclude_fields": ["a..b"]}, "exclude_fields", "empty part"),
        ({"database": "shop", "exclude_fields": ["a.$b"]}, "exclude_fields", "'$'"),
        ({"database": "shop", "hash_fields": ["email"]}, "hash_salt_env", "hash_salt_env"),
        ({"database": "shop", "hash_salt_env": "SALT"}, "hash_salt_env", "there are none"),
        ({"database": "shop", "hash_salt_env": "A=B", "hash_fields": ["x"]}, "hash_salt_env", "cannot name"),
        (
            {
                "database": "shop",
                "exclude_fields": ["contact"],
                "hash_fields": ["contact.email"],
                "hash_salt_env": "SALT",
            },
            "hash_fields",
            "one or the other",
        ),
    ],
)
def test_bad_selections_and_fields_are_refused_naming_the_option(
    options: dict[str, Any], option: str, said: str
) -> None:
    error = refusal(change_stream(**options))
    assert error.option == option
    assert said in str(error)
    assert "Handler" in (error.owner or "")


def test_names_and_patterns_are_kept_once_in_order() -> None:
    @change_stream(
        database="shop",
        collections=["orders", "re:order_.*", "orders"],
        exclude_collections={"re:.*_old"},
        exclude_fields=("ssn", "address.zip"),
        hash_fields=["email"],
        hash_salt_env="SHOP_SALT",
    )
    class Shop:
        @on_change
        def handle(self, event: ChangeEvent) -> None: ...

    stream = stream_spec(Shop).stream
    assert stream.collections == ("orders", "re:order_.*")
    assert stream.exclude_collections == ("re:.*_old",)
    assert stream.exclude_fields == ("ssn", "address.zip")
    assert stream.hash_fields == ("email",)


def test_the_selection_follows_the_own_collections_stage_and_field_removal_comes_last() -> None:
    from flowwarden import pipeline

    user_stage = {"$match": {"fullDocument.status": "paid"}}

    @change_stream(database="shop", collections=["orders"], exclude_fields=["ssn"])
    @pipeline([user_stage])
    class Shop:
        @on_change
        def handle(self, event: ChangeEvent) -> None: ...

    stages = stream_spec(Shop).pipeline
    assert stages[0] == {"$match": {"ns.coll": {"$not": {"$regex": "^_fw_"}}}}  # flowwarden's own
    selected = {"$or": [{"ns.coll": {"$exists": False}}, {"ns.coll": {"$in": ["orders"]}}]}
    assert stages[1] == {"$match": selected}
    assert stages[2] == user_stage
    assert stages[3] == {"$unset": ["fullDocument.ssn", "fullDocumentBeforeChange.ssn"]}
    assert list(stages[4]) == ["$set"]


def test_a_cluster_stream_names_collections_with_their_database() -> None:
    @change_stream(collections=["shop.orders", r"re:shop\.inv.*"])
    class Cluster:
        @on_change
        def handle(self, event: ChangeEvent) -> None: ...

    (selection,) = [s for s in stream_spec(Cluster).pipeline if "$or" in s["$match"]]
    branches = selection["$match"]["$or"]
    assert {"ns.db": "shop", "ns.coll": "orders"} in branches
    assert {
        "$expr": {
            "$regexMatch": {"input": {"$concat": ["$ns.db", ".", "$ns.coll"]}, "regex": r"^(?:shop\.inv.*)$"}
        }
    } in branches


# ----------------------------------------------------------------------------------------------
# @event_filter


def test_event_filter_is_recorded_bare_and_called() -> None:
    @change_stream("orders", "shop")
    class Bare:
        @event_filter
        def keep(self, event: ChangeEvent) -> bool:
            return True

        @on_insert
        def created(self, event: ChangeEvent) -> None: ...

    @change_stream("orders", "shop")
    class Called:
        @event_filter()
        def wanted(self, event: ChangeEvent) -> bool:
            return True

        @on_batch
        def handle(self, events: list[ChangeEvent]) -> None: ...

    assert stream_spec(Bare).event_filter == "keep"
    assert stream_spec(Called).event_filter == "wanted"


def test_a_class_without_a_filter_has_none() -> None:
    @change_stream("orders", "shop")
    class Plain:
        @on_insert
        def created(self, event: ChangeEvent) -> None: ...

    assert stream_spec(Plain).event_filter is None


def test_an_async_filter_is_refused() -> None:
    with pytest.raises(ConfigurationError) as caught:

        class Handler:
            @event_filter
            async def keep(self, event: ChangeEvent) -> bool:
                return True

    assert caught.value.option == "event_filter"
    assert "async" in str(caught.value)
    assert "read loop" in str(caught.value)


@pytest.mark.parametrize(
    "method",
    [
        lambda self: True,
        lambda self, event, ctx: True,
        lambda self, event, *, strict: True,
    ],
    ids=["no-event", "required-ctx", "required-keyword"],
)
def test_a_filter_called_otherwise_than_with_the_event_is_refused(method: Any) -> None:
    with pytest.raises(ConfigurationError) as caught:
        event_filter(method)
    assert caught.value.option == "event_filter"


def test_a_filter_is_not_a_handler() -> None:
    def both(self: object, event: ChangeEvent) -> bool:
        return True

    with pytest.raises(ConfigurationError) as first_filter:
        on_insert(event_filter(both))
    assert first_filter.value.option == "on_insert"

    def again(self: object, event: ChangeEvent) -> bool:
        return True

    with pytest.raises(ConfigurationError) as first_handler:
        event_filter(on_change(again))
    assert first_handler.value.option == "event_filter"


def test_two_filters_are_refused() -> None:
    with pytest.raises(ConfigurationError) as caught:

        @change_stream("orders", "shop")
        class Twice:
            @event_filter
            def one(self, event: ChangeEvent) -> bool:
                return True

            @event_filter
            def two(self, event: ChangeEvent) -> bool:
                return True

            @on_insert
            def created(self, event: ChangeEvent) -> None: ...

    assert caught.value.option == "event_filter"
    assert "'one'" in str(caught.value) and "'two'" in str(caught.value)


def test_a_filter_alone_handles_nothing() -> None:
    with pytest.raises(ConfigurationError) as caught:

        @change_stream("orders", "shop")
        class OnlyAFilter:
            @event_filter
            def keep(self, event: ChangeEvent) -> bool:
                return True

    assert caught.value.option == "handlers"


def test_a_subclass_inherits_its_bases_filter() -> None:
    class Base:
        @event_filter
        def keep(self, event: ChangeEvent) -> bool:
            return True

    @change_stream("orders", "shop")
    class Child(Base):
        @on_insert
        def created(self, event: ChangeEvent) -> None: ...

    assert stream_spec(Child).event_filter == "keep"
