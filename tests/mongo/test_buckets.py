"""flowwarden.mongo.buckets: the message that stops a stream whose checkpoints have another layout."""

from __future__ import annotations

from flowwarden.mongo.buckets import layout_conflict


def test_a_layout_conflict_names_every_stored_layout_and_what_to_do() -> None:
    # The unpartitioned checkpoint first: the buckets listed after it are still counted.
    assert layout_conflict("orders", 2, ["orders", "orders[0/4]", "orders[3/4]"]) == (
        "stream 'orders' is run with partitions=2, but its checkpoints are stored without partitions "
        "and with partitions=4; a bucket's position says nothing about another layout's events, so it "
        "would start somewhere else and miss or repeat events. Run it with the layout its checkpoints "
        "have, or move them by hand (see 'Partitioned streams' in the runtime docs)"
    )
