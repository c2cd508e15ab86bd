"""Partitioned streams: one change stream read as N, each the hash bucket of ``documentKey._id``.

``@change_stream(partitions=N)`` and the Spark source's ``.option("partitions", N)`` split a
stream the same way: bucket ``i`` of ``N`` is the change stream with :func:`bucket_stage` ahead of
every other stage, so the server filters it and each bucket travels once. Every event of one
document falls in one bucket, in stream order; buckets have no order between them.

In the connector each bucket is a stream of its own, named :func:`partition_name`: its own
checkpoint (lastSeen, lastProcessed), lease, handler instance, status and metrics. The hard
rule: a stream's checkpoints belong to one layout. A checkpoint stored under another number of
partitions (or none) is never read as a position of this one, because a bucket's token says
nothing about the events of another bucket; :func:`layout_conflict` finds such checkpoints and
the stream refuses to start rather than start somewhere else and skip events.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

MAX_PARTITIONS = 256
_PARTITION_NAME = re.compile(r"^(?P<base>.+)\[(?P<index>\d+)/(?P<count>\d+)\]$")


def bucket_stage(index: int, count: int) -> dict[str, Any]:
    """The ``$match`` keeping the events whose ``documentKey._id`` falls in hash bucket ``index``
    of ``count``: MongoDB's hashed index key of it (``$toHashedIndexKey``, the hash of hashed
    sharding, MongoDB 7.0+), modulo ``count`` and made non-negative. Every event of one document
    falls in the same bucket; events without a document key (drop, rename) hash as null, all in
    one bucket.

    ``invalidate`` passes in every bucket, as it passes ``operation_types``: it is not an event
    of a document but the end of each stream. The server closes every bucket's cursor after it;
    a bucket that did not see it would end as if stopped, neither stopping with the error nor
    restarting after it (``on_invalidate``)."""
    key = {"$toHashedIndexKey": "$documentKey._id"}
    bucket = {"$mod": [{"$add": [{"$mod": [key, count]}, count]}, count]}
    return {"$match": {"$or": [{"operationType": "invalidate"}, {"$expr": {"$eq": [bucket, index]}}]}}


def partition_name(name: str, index: int, count: int) -> str:
    """The name of bucket ``index`` of ``count`` of stream ``name``: ``orders[0/4]``."""
    return f"{name}[{index}/{count}]"


def layout_conflict(name: str, count: int, stored: Iterable[str]) -> str | None:
    """What is wrong when checkpoints of stream ``name`` are stored under another layout than
    ``count`` partitions (``stored``: every stream name with a checkpoint), or None."""
    others: set[int] = set()
    for stream_id in stored:
        if stream_id == name:
            others.add(1)
            continue
        match = _PARTITION_NAME.match(stream_id)
        if match is not None and match["base"] == name:
            others.add(int(match["count"]))
    others.discard(count)
    if not others:
        return None
    held = " and ".join("without partitions" if n == 1 else f"with partitions={n}" for n in sorted(others))
    return (
        f"stream {name!r} is run with partitions={count}, but its checkpoints are stored {held}; "
        "a bucket's position says nothing about another layout's events, so it would start "
        "somewhere else and miss or repeat events. Run it with the layout its checkpoints have, "
        "or move them by hand (see 'Partitioned streams' in the runtime docs)"
    )


__all__ = ["MAX_PARTITIONS", "bucket_stage", "layout_conflict", "partition_name"]
