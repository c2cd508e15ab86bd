"""collections and exclude_collections: the server's $match and the snapshot's choice of
collections say the same, patterns match whole names only, and events without a collection pass."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from flowwarden.mongo.namespaces import NamespaceSelection
from flowwarden_embedded.eventmatch import compile_match

NAMES = ["orders", "order_lines", "border", "orders_archive", "inventory", "orders.2024", "audit"]
ENTRIES = ["orders", "inventory", "re:order.*", "re:.*_archive", "re:orders\\.\\d+", "re:(audit|inventory)"]


def passes(selection: NamespaceSelection, ns: dict[str, Any]) -> bool:
    stage = selection.stage()
    if stage is None:
        return True
    return compile_match(stage["$match"])({"_id": {"_data": "82"}, "ns": ns}) is not None


@given(
    include=st.none() | st.lists(st.sampled_from(ENTRIES), min_size=1, max_size=3),
    exclude=st.lists(st.sampled_from(ENTRIES), max_size=2),
)
def test_the_stage_and_the_snapshot_select_the_same_collections(
    include: list[str] | None, exclude: list[str]
) -> None:
    selection = NamespaceSelection(None if include is None else tuple(include), tuple(exclude), cluster=False)
    for name in NAMES:
        assert passes(selection, {"db": "shop", "coll": name}) == selection.selects("shop", name), name


@given(
    include=st.none()
    | st.lists(st.sampled_from(["shop.orders", "re:shop\\.ord.*", "re:.*\\.audit"]), min_size=1),
    exclude=st.lists(st.sampled_from(["other.orders", "re:shop\\.order_.*"]), max_size=2),
)
def test_a_cluster_selection_reads_the_database_too(include: list[str] | None, exclude: list[str]) -> None:
    selection = NamespaceSelection(None if include is None else tuple(include), tuple(exclude), cluster=True)
    for database in ("shop", "other"):
        for name in NAMES:
            ns = {"db": database, "coll": name}
            assert passes(selection, ns) == selection.selects(database, name), ns


@pytest.mark.parametrize(
    ("entry", "selected"),
    [
        ("re:order.*", {"orders", "order_lines", "orders_archive", "orders.2024"}),
        ("re:order", set()),
        ("re:orders", {"orders"}),
        ("re:.*s", {"orders", "order_lines"}),
        ("re:orders|audit", {"orders", "audit"}),
    ],
)
def test_a_pattern_matches_whole_names_only(entry: str, selected: set[str]) -> None:
    selection = NamespaceSelection((entry,), (), cluster=False)
    assert {name for name in NAMES if passes(selection, {"db": "shop", "coll": name})} == selected
    assert {name for name in NAMES if selection.selects("shop", name)} == selected


def test_events_without_a_collection_always_pass() -> None:
    for selection in (
        NamespaceSelection(("orders",), ("re:.*",), cluster=False),
        NamespaceSelection(("shop.orders",), ("re:.*",), cluster=True),
    ):
        assert passes(selection, {"db": "shop"})  # dropDatabase
        assert passes(selection, {})  # an invalidate has no ns at all in a cluster stream


def test_selecting_everything_adds_no_stage() -> None:
    assert NamespaceSelection(None, (), cluster=False).stage() is None
